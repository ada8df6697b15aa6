"""AutoMTLS: grpcio cannot verify P-521 (what Go peers use), so the relay must carry those sessions."""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vz_core.rpc.pb import runtime_pb2 as pb
from vz_core.rpc.pb import runtime_pb2_grpc as pb_grpc
from vz_core.transport import (
    ClientRelay,
    LaunchSpec,
    PluginLauncher,
    ServerRelay,
    cert_curve,
    client_context,
    generate_cert,
    grpc_can_verify,
    load_cert,
    server_context,
)

TESTDRIVERS = Path(__file__).resolve().parents[2] / "vz_plugins" / "testdrivers.py"


@pytest.fixture
def short_dir() -> AsyncIterator[str]:
    path = tempfile.mkdtemp(prefix="vzt-")
    yield path  # type: ignore[misc]
    import shutil

    shutil.rmtree(path, ignore_errors=True)


async def _health_server(address: str, creds: grpc.ServerCredentials | None) -> grpc.aio.Server:
    server = grpc.aio.server()
    servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    await servicer.set("plugin", health_pb2.HealthCheckResponse.SERVING)
    if creds is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, creds)
    await server.start()
    return server


async def _check(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="plugin"), timeout=5)
    return int(reply.status)


@pytest.mark.parametrize("curve", ["P-256", "P-384", "P-521"])
def test_certificates_look_like_go_plugins(curve: str) -> None:
    from cryptography import x509

    made = generate_cert(curve)  # type: ignore[arg-type]
    cert = load_cert(made.cert_pem)
    assert load_cert(made.cert_der) == cert
    assert cert_curve(cert) == curve
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    ) == ["localhost"]
    assert grpc_can_verify(cert) is (curve != "P-521")
    assert "key" not in repr(made).replace("key_pem=<hidden>", "")


@pytest.mark.parametrize(("server_curve", "client_curve"), [("P-521", "P-256"), ("P-256", "P-521")])
async def test_grpcio_cannot_do_p521_automtls_natively(server_curve: str, client_curve: str, short_dir: str) -> None:
    """The fact that justifies the relay: with a P-521 certificate on either side, grpcio's TLS fails."""
    server_id, client_id = generate_cert(server_curve), generate_cert(client_curve)  # type: ignore[arg-type]
    address = f"unix:{short_dir}/s.sock"
    creds = grpc.ssl_server_credentials(
        [(server_id.key_pem, server_id.cert_pem)], root_certificates=client_id.cert_pem, require_client_auth=True
    )
    server = await _health_server(address, creds)
    try:
        channel_creds = grpc.ssl_channel_credentials(server_id.cert_pem, client_id.key_pem, client_id.cert_pem)
        options = [("grpc.ssl_target_name_override", "localhost"), ("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.secure_channel(address, channel_creds, options=options) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _check(channel)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)


async def test_p256_works_natively(short_dir: str) -> None:
    server_id, client_id = generate_cert("P-256"), generate_cert("P-256")
    address = f"unix:{short_dir}/s.sock"
    creds = grpc.ssl_server_credentials(
        [(server_id.key_pem, server_id.cert_pem)], root_certificates=client_id.cert_pem, require_client_auth=True
    )
    server = await _health_server(address, creds)
    try:
        channel_creds = grpc.ssl_channel_credentials(server_id.cert_pem, client_id.key_pem, client_id.cert_pem)
        options = [("grpc.ssl_target_name_override", "localhost")]
        async with grpc.aio.secure_channel(address, channel_creds, options=options) as channel:
            assert await _check(channel) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)


async def test_relays_carry_p521_automtls_both_ways(short_dir: str) -> None:
    """grpcio client → ClientRelay ⇄ TLS (P-521 both sides, pinned) ⇄ ServerRelay → grpcio server."""
    server_id, client_id = generate_cert("P-521"), generate_cert("P-521")
    internal = f"{short_dir}/grpc.sock"
    server = await _health_server(f"unix:{internal}", None)
    srelay = ServerRelay(internal, client_id.cert_der, server_context(server_id, client_id.cert_pem))
    await srelay.listen_unix(f"{short_dir}/public.sock")
    crelay = ClientRelay("unix", srelay.address, server_id.cert_der, client_context(client_id, server_id.cert_der))
    await crelay.listen(f"{short_dir}/relay.sock")
    try:
        transport, _ = await crelay.open_tls()
        tls = transport.get_extra_info("ssl_object")
        assert tls.selected_alpn_protocol() == "h2"
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        transport.close()
        async with grpc.aio.insecure_channel(f"unix:{crelay.path}") as channel:
            assert await _check(channel) == health_pb2.HealthCheckResponse.SERVING
            # Large messages and many concurrent calls flow through one relayed connection.
            results = await asyncio.gather(*(_check(channel) for _ in range(50)))
            assert set(results) == {health_pb2.HealthCheckResponse.SERVING}
        assert oct(os.stat(crelay.path).st_mode & 0o777) == oct(0o600)
    finally:
        await crelay.close()
        await srelay.close()
        await server.stop(None)


async def test_relays_pin_the_exact_peer_certificate(short_dir: str) -> None:
    server_id, client_id, stranger = generate_cert("P-521"), generate_cert("P-521"), generate_cert("P-521")
    internal = f"{short_dir}/grpc.sock"
    server = await _health_server(f"unix:{internal}", None)
    srelay = ServerRelay(internal, client_id.cert_der, server_context(server_id, client_id.cert_pem))
    await srelay.listen_unix(f"{short_dir}/public.sock")
    try:
        # The host expects another plugin certificate: it refuses this server.
        wrong_server = ClientRelay(
            "unix", srelay.address, stranger.cert_der, client_context(client_id, stranger.cert_der)
        )
        with pytest.raises(ssl.SSLError):
            await wrong_server.open_tls()
        await wrong_server.close()
        # A client with another certificate is refused by the plugin: the session dies before any data.
        try:
            reader, writer = await asyncio.open_unix_connection(
                srelay.address, ssl=client_context(stranger, server_id.cert_der), server_hostname="localhost"
            )
        except (ssl.SSLError, ConnectionError):
            pass
        else:
            writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            try:
                data = await asyncio.wait_for(reader.read(100), 5)
            except (ssl.SSLError, ConnectionError):
                data = b""
            writer.close()
            assert data == b""
    finally:
        await srelay.close()
        await server.stop(None)


@pytest.mark.parametrize(
    ("kind", "client_curve"),
    [
        pytest.param("mini", "P-521", id="go-like-host-to-python-plugin"),
        pytest.param("mini-p521", "P-256", id="python-host-to-go-like-plugin"),
        pytest.param("mini-p521", "P-521", id="p521-both-sides"),
    ],
)
async def test_launch_with_p521_on_either_side(kind: str, client_curve: str) -> None:
    """Real plugin processes: a P-521 host certificate makes the plugin terminate TLS in its relay, a P-521
    plugin certificate makes the host use its relay; authenticated and encrypted either way."""
    spec = LaunchSpec(kind, [sys.executable, str(TESTDRIVERS), kind])
    launcher = PluginLauncher(lambda: spec, name=kind, client_curve=client_curve)  # type: ignore[arg-type]
    conn = await launcher.launch()
    try:
        # grpcio can neither verify nor use a P-521 certificate: our side relays whenever one is involved.
        assert conn.tls == "relay"
        assert conn.handshake.server_cert_der is not None
        plugin_curve = cert_curve(load_cert(conn.handshake.server_cert_der))
        assert plugin_curve == ("P-521" if kind == "mini-p521" else "P-256")
        reply = await pb_grpc.RuntimeDriverStub(conn.channel).Info(pb.InfoRequest())  # type: ignore[no-untyped-call]
        assert reply.driver_name == "mini"
    finally:
        await conn.shutdown()
