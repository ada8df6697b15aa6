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


def test_short_values_are_not_secrets_by_default() -> None:
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


def test_short_secrets_are_masked_as_whole_tokens_when_asked() -> None:
    r = Redactor(["ab1", "x"], short_tokens=True)
    assert r
    assert r.redact("token ab1 rejected, key=ab1, 'ab1'") == f"token {MASK} rejected, key={MASK}, '{MASK}'"
    assert r.redact("tab1e ab12 _ab1 x-ray box") == f"tab1e ab12 _ab1 {MASK}-ray box"
    assert r.redact_bytes(b"(ab1)") == f"({MASK})".encode()


def test_redact_data_masks_every_string_of_a_json_tree() -> None:
    r = Redactor([SECRET])
    data = {"a": [f"x{SECRET}", 1, None, {SECRET: True}], "b": "plain"}
    assert r.redact_data(data) == {"a": [f"x{MASK}", 1, None, {MASK: True}], "b": "plain"}
    assert Redactor().redact_data(data) is data


@pytest.mark.parametrize("split", range(1, len("x ab1 y tab1e ab1")))
def test_short_token_split_across_writes_is_decided_with_its_neighbours(split: int) -> None:
    data = b"x ab1 y tab1e ab1"
    stream = Redactor(["ab1"], short_tokens=True).stream()
    out = stream.feed(data[:split]) + stream.feed(data[split:]) + stream.flush()
    assert out == f"x {MASK} y tab1e {MASK}".encode()


def test_short_token_fed_one_byte_at_a_time() -> None:
    data = b"ab1 zab1 ab1z ab1"
    stream = Redactor(["ab1"], short_tokens=True).stream()
    out = b"".join(stream.feed(data[i : i + 1]) for i in range(len(data))) + stream.flush()
    assert out == f"{MASK} zab1 ab1z {MASK}".encode()


def test_merge_learns_every_secret_of_another_redactor() -> None:
    from vz_core.redact import Redactor

    project = Redactor(["long-secret-value"], short_tokens=True)
    project.add("pw")
    shared = Redactor()
    assert shared.redact("long-secret-value pw") == "long-secret-value pw"
    shared.merge(project)
    assert shared.redact("long-secret-value pw upward") == "*** *** upward"
    shared.add("xy")  # its own setting still applies to what it is given directly: short secrets ignored
    assert shared.redact("xy") == "xy"
