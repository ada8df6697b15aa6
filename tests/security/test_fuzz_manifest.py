"""#18: a bounded fuzz of the manifest loader (``vz_core.trust.parse_manifest`` / ``load_manifest``).

Every input ends in a ``Manifest`` or a ``TrustError``, never another exception: arbitrary bytes, arbitrary
JSON values, manifest-shaped objects with hostile field values, deep nesting and huge numbers. Bounded for CI
(a few seconds); a longer run: ``VZ_FUZZ_EXAMPLES=20000 pytest tests/security/test_fuzz_manifest.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vz_core.errors import TrustError, UserError
from vz_core.trust import Manifest, load_manifest, parse_manifest

EXAMPLES = int(os.environ.get("VZ_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.builds(pow, st.just(10), st.just(4300)),  # beyond the int/str digit limit
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["linux/amd64", "linux/arm64", "darwin/arm64", "../x", "/etc/passwd", "a\x00b", "1.3", "0" * 64]),
)
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
_names = st.one_of(st.sampled_from(["acme", "acme\n", "Acme", "../acme", "/abs", "a" * 64, "", "a.b"]), st.text())
_entries = st.fixed_dictionaries(
    {},
    optional={
        "path": st.one_of(st.text(max_size=30), _json),
        "url": st.one_of(st.text(max_size=30), _json),
        "file": st.one_of(st.sampled_from(["", ".", "..", "a/b", "ok"]), _json),
        "sha256": st.one_of(st.sampled_from(["0" * 64, "F" * 64, "0" * 64 + "\n", "xyz"]), _json),
    },
)
_manifests = st.fixed_dictionaries(
    {},
    optional={
        "manifest_version": st.one_of(st.just(1), _json),
        "name": st.one_of(_names, _json),
        "version": st.one_of(st.text(max_size=10), _json),
        "api_version": st.one_of(st.sampled_from(["1.3", "1.", "2.0", "1.3\n"]), _json),
        "binaries": st.one_of(
            st.dictionaries(st.one_of(st.sampled_from(["linux/amd64", "x"]), st.text()), _entries), _json
        ),
        "args": st.one_of(st.lists(st.text(max_size=10), max_size=3), _json),
        "options": _json,
        "plaintext": _json,
        "signature": _json,
        "extra": _json,
    },
)


def _text(value: Any) -> str | None:
    """``value`` as JSON text (None when Python cannot even write it: an integer beyond the digit limit)."""
    try:
        return json.dumps(value)
    except ValueError:
        return None


def _ends_well(call: Any) -> None:
    try:
        result = call()
    except (TrustError, UserError):
        return
    assert isinstance(result, Manifest)


@FUZZ
@given(st.binary(max_size=300))
def test_any_bytes(data: bytes) -> None:
    _ends_well(lambda: parse_manifest(data))


@FUZZ
@given(_json)
def test_any_json_value(value: Any) -> None:
    text = _text(value)
    if text is not None:
        _ends_well(lambda: parse_manifest(text))
    if isinstance(value, dict):
        _ends_well(lambda: parse_manifest(value))


@FUZZ
@given(_manifests)
def test_manifest_shaped_objects(value: dict[str, Any]) -> None:
    _ends_well(lambda: parse_manifest(value))
    text = _text(value)
    if text is not None:
        _ends_well(lambda: parse_manifest(text))


@pytest.mark.parametrize("depth", [40, 1000, 100_000])
def test_deep_nesting(depth: int) -> None:
    text = '{"name": "acme", "options": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(TrustError, match=r"nests too deeply|not valid JSON"):
        parse_manifest(text)
    nested: Any = []
    for _ in range(min(depth, 5000)):
        nested = [nested]
    with pytest.raises(TrustError):
        parse_manifest({"name": "acme", "options": {"x": nested}})


def test_huge_integer_and_invalid_utf8() -> None:
    with pytest.raises(TrustError, match="not valid JSON"):
        parse_manifest('{"manifest_version": ' + "9" * 5000 + "}")
    with pytest.raises(TrustError):
        parse_manifest(b'{"name": "\xff\xfe"}')


def test_load_manifest_refuses_what_is_not_a_small_regular_file(tmp_path: Path) -> None:
    with pytest.raises(TrustError, match=r"not a regular file|Is a directory"):
        load_manifest(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TrustError, match="not a regular file"):
        load_manifest(fifo)  # opened without blocking for a writer
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (2 << 20) + b"{}")
    with pytest.raises(TrustError, match="larger than"):
        load_manifest(big)
    with pytest.raises(TrustError):
        load_manifest(str(tmp_path / "a\x00b"))


@FUZZ
@given(st.binary(max_size=200))
def test_load_manifest_any_file(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("m") / "manifest.json"
    path.write_bytes(data)
    _ends_well(lambda: load_manifest(path))
