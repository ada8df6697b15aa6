"""#18 item 7: a bounded, reproducible fuzz of the vz.json loader. Every input ends in a loaded definition or a
UserError-family error (one clear message), never another exception.

CI runs 500 derandomized examples per strategy (a few seconds). A longer local run:
``VZ_FUZZ_EXAMPLES=20000 python -m pytest tests/security/test_fuzz_vzjson.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vz_core.env import ProjectDefinition, load_definition
from vz_core.env._discover import read_header
from vz_core.errors import UserError

EXAMPLES = int(os.environ.get("VZ_FUZZ_EXAMPLES", "500"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

VALID: dict[str, Any] = {
    "version": 1,
    "project_id": "demo",
    "machines": [
        {
            "name": "web",
            "profile": "developer",
            "driver": "fake",
            "image": "vz:default",
            "resources": {"cpus": 2, "memory": "1GiB"},
            "mounts": [{"type": "tmpfs", "target": "/tmp/x"}],
            "volumes": [{"name": "cache", "target": "/cache"}],
            "environment": {"A": "b", "S": {"from_env": "TOKEN"}},
        }
    ],
    "default_machine": "web",
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["/", "//proc", "/.vz/x", "vz:default", "a\n", "x\x00y", "~", "..", "1GiB", "-1", ""]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _paths(value, (*prefix, index))
    return out


PATHS = _paths(VALID)[1:]


def _replace(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(node))
    target = copy
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return copy


def _check(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "vz.json"
    path.write_bytes(raw)
    try:
        loaded = load_definition(path)
    except UserError as exc:
        assert str(exc)
    else:
        assert isinstance(loaded, ProjectDefinition)
    try:
        read_header(path)
    except UserError as exc:
        assert str(exc)


@FUZZ
@given(path=st.sampled_from(PATHS), value=json_values)
def test_a_valid_definition_with_one_field_replaced(tmp_path_factory: Any, path: tuple[Any, ...], value: Any) -> None:
    _check(tmp_path_factory.mktemp("f"), json.dumps(_replace(VALID, path, value)).encode())


@FUZZ
@given(data=json_values)
def test_arbitrary_json(tmp_path_factory: Any, data: Any) -> None:
    _check(tmp_path_factory.mktemp("f"), json.dumps(data).encode())


@FUZZ
@given(
    cut=st.integers(min_value=0, max_value=len(json.dumps(VALID))),
    insert=st.one_of(
        st.binary(max_size=8),
        st.sampled_from([b"[" * 2000, b"{" * 500, b"9" * 5000, b"NaN", b"Infinity", b'"a":1,"a":2,', b"\xff\xfe"]),
    ),
)
def test_damaged_text(tmp_path_factory: Any, cut: int, insert: bytes) -> None:
    text = json.dumps(VALID).encode()
    _check(tmp_path_factory.mktemp("f"), text[:cut] + insert + text[cut:])


@FUZZ
@given(depth=st.integers(min_value=1, max_value=3000), opener=st.sampled_from(["[", '{"a":']))
def test_deep_nesting(tmp_path_factory: Any, depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    body = opener * depth + "1" + closer * depth
    _check(tmp_path_factory.mktemp("f"), ('{"version":1,"project_id":"demo","machines":' + body + "}").encode())
