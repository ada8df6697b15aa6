from __future__ import annotations

import pytest

from vz_core.redact import MASK, MIN_SECRET_LENGTH, Redactor

SECRET = "hunter2-very-secret"


def test_redacts_text_and_bytes() -> None:
    r = Redactor([SECRET])
    assert r.redact(f"token={SECRET}!") == f"token={MASK}!"
    assert r.redact_bytes(f"a {SECRET} b {SECRET}".encode()) == f"a {MASK} b {MASK}".encode()


def test_without_secrets_everything_passes_unchanged() -> None:
    r = Redactor()
    assert not r
    assert r.redact("plain") == "plain"
    stream = r.stream()
    assert stream.feed(b"abc") + stream.flush() == b"abc"


def test_short_values_are_not_secrets() -> None:
    r = Redactor(["1", "on", "x" * (MIN_SECRET_LENGTH - 1)])
    assert not r
    assert r.redact("DEBUG=1 on") == "DEBUG=1 on"


def test_longest_secret_wins_when_one_contains_another() -> None:
    r = Redactor(["abcd", "abcdefgh"])
    assert r.redact("xabcdefghx abcd") == f"x{MASK}x {MASK}"


@pytest.mark.parametrize("split", range(1, len(f"before {SECRET} after")))
def test_secret_split_across_two_writes_is_redacted(split: int) -> None:
    data = f"before {SECRET} after".encode()
    stream = Redactor([SECRET]).stream()
    out = stream.feed(data[:split]) + stream.feed(data[split:]) + stream.flush()
    assert out == f"before {MASK} after".encode()


def test_secret_fed_one_byte_at_a_time_is_redacted() -> None:
    data = f"x{SECRET}y{SECRET}".encode()
    stream = Redactor([SECRET]).stream()
    out = b"".join(stream.feed(data[i : i + 1]) for i in range(len(data))) + stream.flush()
    assert out == f"x{MASK}y{MASK}".encode()


def test_stream_holds_back_at_most_longest_minus_one_bytes() -> None:
    stream = Redactor([SECRET]).stream()
    emitted = stream.feed(b"z" * 100)
    assert len(emitted) == 100 - (len(SECRET) - 1)
    assert stream.flush() == b"z" * (len(SECRET) - 1)


def test_secrets_added_later_apply_to_open_streams() -> None:
    r = Redactor()
    stream = r.stream()
    first = stream.feed(b"early ")
    r.add(SECRET)
    out = first + stream.feed(f"late {SECRET}".encode()) + stream.flush()
    assert out == f"early late {MASK}".encode()
