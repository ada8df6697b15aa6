from __future__ import annotations

import base64

import pytest

from vz_core.errors import PluginError
from vz_core.transport import Handshake, looks_like_handshake, parse_handshake


def test_parses_unix_line_with_certificate() -> None:
    der = bytes(range(256)) * 2
    cert = base64.b64encode(der).decode().rstrip("=")
    hs = parse_handshake(f"1|1|unix|/tmp/x/plugin.sock|grpc|{cert}\n")
    assert hs == Handshake(1, 1, "unix", "/tmp/x/plugin.sock", "grpc", der)
    assert hs.target == "unix:/tmp/x/plugin.sock"
    assert hs.line() == f"1|1|unix|/tmp/x/plugin.sock|grpc|{cert}"


def test_parses_tcp_line_without_certificate() -> None:
    hs = parse_handshake("1|1|tcp|127.0.0.1:10001|grpc|")
    assert (hs.network, hs.address, hs.server_cert_der, hs.target) == (
        "tcp",
        "127.0.0.1:10001",
        None,
        "127.0.0.1:10001",
    )
    assert parse_handshake("1|1|tcp|127.0.0.1:10001|grpc").server_cert_der is None


def test_only_lines_with_four_fields_count_as_handshake() -> None:
    assert looks_like_handshake("1|1|unix|/x")
    assert not looks_like_handshake("starting up | please wait")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        pytest.param("hello world", "unrecognized plugin handshake", id="garbage"),
        pytest.param("x|1|unix|/s|grpc|", "non-numeric core protocol", id="non-numeric-core"),
        pytest.param("2|1|unix|/s|grpc|", "core protocol 2", id="wrong-core"),
        pytest.param("1|7|unix|/s|grpc|", "application protocol 7", id="wrong-app"),
        pytest.param("1|1|carrier-pigeon|/s|grpc|", "unknown network 'carrier-pigeon'", id="unknown-network"),
        pytest.param("1|1|unix|relative.sock|grpc|", "non-absolute", id="relative-socket"),
        pytest.param("1|1|tcp|10.1.2.3:5000|grpc|", "not a loopback", id="non-loopback-tcp"),
        pytest.param("1|1|tcp|127.0.0.1|grpc|", "malformed TCP address", id="tcp-no-port"),
        pytest.param("1|1|unix|/s", "did not announce a protocol", id="netrpc-no-protocol"),
        pytest.param("1|1|unix|/s|netrpc|", "protocol 'netrpc'", id="unknown-protocol"),
        pytest.param("1|1|unix|/s|grpc|***not-base64***", "not valid base64", id="bad-cert"),
    ],
)
def test_bad_lines_are_refused_with_a_clear_error(line: str, fragment: str) -> None:
    with pytest.raises(PluginError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_handshake(line)
