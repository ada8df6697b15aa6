"""The pure half of DNS beyond the Environment: which queries are forwarded, what an answer admits."""

from __future__ import annotations

import ipaddress
import random
import struct

import pytest

from vz_core.env._definition import parse_definition
from vz_core.env._topology import compile_topology
from vz_core.network import DnsView, PlanError, dns_answer, forwardable, host_resolvers, name_matches
from vz_core.network._dns import answer_addresses

M = {"profile": "developer", "driver": "fake", "image": "vz:default"}
DEFINITION = {
    "version": 2,
    "project_id": "dnsfwd",
    "machines": [
        {"name": "app", **M, "egress": "allowed"},
        {"name": "lst", **M, "egress": {"allow": ["api.example.com", "*.cdn.example.net", "10.20.0.0/16"]}},
        {"name": "off", **M},
    ],
}


def _plan() -> dict[str, object]:
    return compile_topology(parse_definition(DEFINITION), "env_0123456789ab").to_json()


def _query(name: str, flags: int = 0x0100, qtype: int = 1) -> bytes:
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00" + struct.pack("!HH", qtype, 1)
    return struct.pack("!HHHHHH", 0x1234, flags, 1, 0, 0, 0) + question


def _address(plan: dict[str, object], machine: str) -> str:
    for m in plan["machines"]:  # type: ignore[attr-defined]
        if m["name"] == machine:
            return str(m["attachments"][0]["address"])
    raise AssertionError(machine)


@pytest.mark.parametrize(
    ("name", "pattern", "want"),
    [
        ("api.example.com", "api.example.com", True),
        ("API.Example.COM.", "api.example.com", True),
        ("x.api.example.com", "api.example.com", False),
        ("img.cdn.example.net", "*.cdn.example.net", True),
        ("a.b.cdn.example.net", "*.cdn.example.net", True),
        ("cdn.example.net", "*.cdn.example.net", False),
        ("evilcdn.example.net", "*.cdn.example.net", False),
        ("example.com", "api.example.com", False),
    ],
)
def test_name_matches(name: str, pattern: str, want: bool) -> None:
    assert name_matches(name, pattern) is want


def test_forwarded_exactly_as_each_machines_egress_allows() -> None:
    plan = _plan()
    view = DnsView.from_plan(plan)
    app, lst, off = (_address(plan, m) for m in ("app", "lst", "off"))
    for name in ("public.example.org", "api.example.com", "img.cdn.example.net"):
        assert forwardable(view, app, _query(name))
        assert not forwardable(view, off, _query(name))
    assert forwardable(view, lst, _query("api.example.com"))
    assert forwardable(view, lst, _query("img.cdn.example.net"))
    assert not forwardable(view, lst, _query("public.example.org"))
    assert not forwardable(view, lst, _query("cdn.example.net"))
    # The Environment's own zones are never forwarded, nor responses, other opcodes or unknown sources.
    for name in ("db.vz.internal", "host.docker.internal", "vz.internal"):
        assert not forwardable(view, app, _query(name))
    assert not forwardable(view, app, _query("public.example.org", flags=0x8180))
    assert not forwardable(view, app, _query("public.example.org", flags=0x2800))
    assert not forwardable(view, "10.99.99.99", _query("public.example.org"))
    assert not forwardable(view, app, b"\x00" * 5)
    # What is not forwarded is still answered by the pure core: REFUSED beyond the zones.
    assert dns_answer(view, off, _query("public.example.org"))[3] & 0x0F == 5  # type: ignore[index]


def test_a_tampered_plan_with_bad_domains_is_refused() -> None:
    plan = _plan()
    plan["machines"][1]["egress"]["domains"] = ["bad name; drop"]  # type: ignore[index]
    with pytest.raises(PlanError, match=r"machines\[1\]\.egress\.domains"):
        DnsView.from_plan(plan)


def _response(answers: list[tuple[str, int, int, bytes]]) -> bytes:
    question = _query("api.example.com")[12:]
    body = b""
    for _, rtype, ttl, rdata in answers:
        body += b"\xc0\x0c" + struct.pack("!HHIH", rtype, 1, ttl, len(rdata)) + rdata
    return struct.pack("!HHHHHH", 0x1234, 0x8180, 1, len(answers), 0, 0) + question + body


def test_answer_addresses_reads_the_a_records_and_never_breaks() -> None:
    cname = b"\x03cdn\xc0\x0c"
    message = _response(
        [
            ("", 5, 300, cname),
            ("", 1, 60, ipaddress.IPv4Address("203.0.113.5").packed),
            ("", 1, 7, ipaddress.IPv4Address("203.0.113.6").packed),
            ("", 28, 60, b"\x20\x01" + b"\x00" * 14),
        ]
    )
    assert answer_addresses(message) == [
        (ipaddress.IPv4Address("203.0.113.5"), 60),
        (ipaddress.IPv4Address("203.0.113.6"), 7),
    ]
    rng = random.Random(7)
    for _ in range(2000):
        cut = message[: rng.randrange(len(message))]
        noisy = bytes(b ^ (rng.randrange(256) if rng.random() < 0.05 else 0) for b in message)
        for data in (cut, noisy, rng.randbytes(rng.randrange(64))):
            for address, ttl in answer_addresses(data):
                assert isinstance(address, ipaddress.IPv4Address) and ttl >= 0


def test_host_resolvers(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "resolv.conf"
    path.write_text("# comment\nnameserver 192.0.2.53\nnameserver ::1\nnameserver bogus\nsearch example.com\n")
    assert host_resolvers(str(path)) == [("192.0.2.53", 53)]
    assert host_resolvers(str(path) + ".missing") == []
