"""docs/api.md and protocol/vz/api/v1/api.proto agree where a test can read both: the method table (every rpc,
its shape and its request's fields), the files the .proto imports, the typed event kinds and their fields, and
the environ keys the daemon reads."""

from __future__ import annotations

import re
from pathlib import Path

from vz_core.api import pb
from vz_core.daemon._events import TYPED

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "api.md").read_text()
SHAPES = {"unary": (False, False), "server stream": (False, True), "bidirectional": (True, True)}


def method_rows() -> dict[str, tuple[str, str]]:
    """``Service.Method`` -> (shape cell, request cell) of the table under "Services and methods"."""
    section = DOC.split("## Services and methods", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        found = re.match(r"\| `(\w+\.\w+)` \| ([^|]+) \| ([^|]+) \|", line)
        if found:
            rows[found.group(1)] = (found.group(2).strip(), found.group(3).strip())
    return rows


def test_the_method_table_lists_every_rpc_with_its_shape_and_request_fields() -> None:
    rows = method_rows()
    api = pb.api_pb2.DESCRIPTOR
    rpcs = {f"{service.name}.{m.name}": m for service in api.services_by_name.values() for m in service.methods}
    assert set(rpcs) <= set(rows), f"rpcs missing from docs/api.md: {sorted(set(rpcs) - set(rows))}"
    assert set(rows) == set(rpcs), f"docs/api.md lists methods the .proto does not have: {set(rows) - set(rpcs)}"
    for name, method in rpcs.items():
        shape, request = rows[name]
        assert SHAPES[shape] == (method.client_streaming, method.server_streaming), name
        fields = re.search(r"`\{([^}]*)\}`", request)
        assert fields is not None, f"{name}: no request fields in docs/api.md"
        documented = {f.strip().rstrip("?") for f in fields.group(1).split(",") if f.strip()}
        message = method.input_type
        if method.client_streaming:  # the first message's start
            start = message.fields_by_name["start"].message_type
            assert start is not None
            message = start
        assert documented == set(message.fields_by_name), f"{name}: docs/api.md says {sorted(documented)}"


def test_the_imports_the_docs_name_are_the_protos() -> None:
    section = DOC.split("### Other languages", 1)[1]
    named = set(re.findall(r"`([\w/]+\.proto)`", section)) - {"protocol/vz/api/v1/api.proto"}
    assert named == {dep.name for dep in pb.api_pb2.DESCRIPTOR.dependencies}


def test_the_typed_event_kinds_and_their_fields() -> None:
    event = pb.api_pb2.Event.DESCRIPTOR
    typed = {field.name: field.message_type for field in event.oneofs_by_name["typed"].fields if field.message_type}
    assert {name for name, _ in TYPED.values()} == set(typed)
    for kind, (name, fields) in TYPED.items():
        assert set(fields) == set(typed[name].fields_by_name), kind
        line = re.search(rf"\* `{re.escape(kind)}`: its data is `\{{([^}}]*)\}}`", DOC)
        assert line is not None, f"docs/api.md does not describe {kind}'s data"
        documented = {f.split(":")[0].strip() for f in line.group(1).split(",")}
        assert documented == set(fields), kind


def test_the_environ_keys_the_daemon_reads_are_documented() -> None:
    from vz_core.env._select import ENV_VAR_ENVIRONMENT, ENV_VAR_MACHINE

    text = (ROOT / "protocol" / "vz" / "api" / "v1" / "api.proto").read_text()  # Context.environ's comment
    for key in (ENV_VAR_ENVIRONMENT, ENV_VAR_MACHINE, "from_env"):
        assert key in DOC.split("## Services and methods", 1)[1].split("### Exec", 1)[0], key
        assert key in text.split("message Context {", 1)[1].split("}", 1)[0], key
