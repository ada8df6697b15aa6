"""``serve()``: run any Driver as a go-plugin compatible gRPC plugin process.

What a host (ours, or a Go host built on go-plugin) sees:

1. Without ``DEVSY_RUNTIME_PLUGIN=devsy-runtime-v1`` in the environment the process says on stderr that it is
   a plugin and exits 1. ``PLUGIN_PROTOCOL_VERSIONS`` must offer application protocol 1 (else exit 1).
2. It listens on a Unix socket in ``PLUGIN_UNIX_SOCKET_DIR`` (or in a fresh private directory), or on
   127.0.0.1 within ``PLUGIN_MIN_PORT``..``PLUGIN_MAX_PORT`` where Unix sockets are not available.
3. With ``PLUGIN_CLIENT_CERT`` it does AutoMTLS: a fresh self-signed certificate for "localhost", the host's
   certificate required and pinned, TLS ≥ 1.2. When the host's certificate uses a curve grpcio cannot verify
   (P-521, as Go hosts use), TLS is terminated by Python's ``ssl`` and relayed to grpcio over a private socket.
4. Exactly one line goes to stdout, ``1|1|unix|/path|grpc|<cert>``; then file descriptor 1 is pointed at
   stderr, so nothing else (prints, child processes) can ever reach the host's handshake pipe. Logs go to
   stderr.
5. It serves ``devsy.runtime.v1.RuntimeDriver``, ``vz.machine.v1.MachineExtensions``, ``grpc.health.v1.Health``
   ("plugin" = SERVING), ``plugin.GRPCController`` (Shutdown: stop serving and exit at once),
   ``plugin.GRPCStdio`` and ``plugin.GRPCBroker`` (accepted, idle).
6. Where it listens on a Unix socket, it also serves local exec (``vz_core.rpc.LocalExecServer``): a second
   Unix socket in a private 0700 directory beside the first, advertised in
   ``vz.machine.v1.ExtensionsResponse.local_exec_socket``, on which a vz host on this machine passes the
   descriptors a command's stdio should be. ``VZ_PLUGIN_LOCAL_EXEC=0`` turns it off (then exec bytes travel
   as gRPC frames only, as they always do for other hosts).
7. Shutdown or SIGTERM: stop serving (in-flight calls get 0.5 s, then are cancelled, which kills running
   commands), ``driver.close()``, remove the socket, exit 0. SIGINT is ignored, as go-plugin plugins do: the
   host owns the plugin's lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Literal, NoReturn

import grpc

from vz_core import Driver
from vz_core.errors import DriverError, VzError
from vz_core.transport import (
    APP_PROTOCOL_VERSION,
    COOKIE_KEY,
    COOKIE_VALUE,
    CORE_PROTOCOL_VERSION,
    ENV_CLIENT_CERT,
    ENV_MAX_PORT,
    ENV_MIN_PORT,
    ENV_PROTOCOL_VERSIONS,
    ENV_UNIX_SOCKET_DIR,
)

__all__ = ["ENV_LOCAL_EXEC", "NOT_A_COMMAND", "serve"]

log = logging.getLogger("vz.plugin")

NOT_A_COMMAND = (
    "This binary is a plugin. These are not meant to be executed directly.\n"
    "Please execute the program that consumes these plugins, which will\n"
    "load any plugins automatically\n"
)
_STOP_GRACE = 0.5
ENV_LOCAL_EXEC = "VZ_PLUGIN_LOCAL_EXEC"
Network = Literal["unix", "tcp"]
Curve = Literal["P-256", "P-384", "P-521"]


class _Fatal(Exception):
    """A startup problem reported on stderr, exit status 1."""


def _negotiate(offered: str | None) -> int:
    if not offered:
        return APP_PROTOCOL_VERSION  # a host from before version lists: it gets our only version
    versions: list[int] = []
    for part in offered.split(","):
        try:
            versions.append(int(part.strip()))
        except ValueError:
            sys.stderr.write(f"ignoring invalid plugin protocol version {part!r} in {ENV_PROTOCOL_VERSIONS}\n")
    if APP_PROTOCOL_VERSION in versions:
        return APP_PROTOCOL_VERSION
    raise _Fatal(
        f"this plugin speaks application protocol {APP_PROTOCOL_VERSION} (Runtime Protocol v1), but the host "
        f"offered {ENV_PROTOCOL_VERSIONS}={offered!r}; use a host that speaks protocol {APP_PROTOCOL_VERSION}"
    )


def _claim_stdout() -> int:
    """Keep a private descriptor for the handshake line and point fd 1 at stderr for everything else."""
    sys.stdout.flush()
    handshake = os.dup(1)
    os.dup2(2, 1)
    return handshake


def _port_range() -> range:
    def port(key: str) -> int:
        raw = os.environ.get(key, "")
        try:
            return int(raw) if raw else 0
        except ValueError:
            raise _Fatal(f"{key}={raw!r} is not a port number") from None

    low, high = port(ENV_MIN_PORT), port(ENV_MAX_PORT)
    if low > high:
        raise _Fatal(f"{ENV_MIN_PORT}={low} is greater than {ENV_MAX_PORT}={high}")
    return range(low, high + 1)


class _Listener:
    """Binds the public address (directly with grpcio, or through the TLS relay) and cleans up after itself."""

    def __init__(self, server: grpc.aio.Server, network: Network, curve: Curve) -> None:
        self.server = server
        self.network = network
        self.curve = curve
        self.address = ""
        self.cert_b64 = ""
        self.relay: object | None = None
        self._remove: list[str] = []
        self._remove_dirs: list[str] = []

    def _unix_path(self) -> str:
        base = os.environ.get(ENV_UNIX_SOCKET_DIR, "")
        if not base:
            base = tempfile.mkdtemp(prefix="vz-plugin-")
            self._remove_dirs.append(base)
        path = os.path.join(base, f"plugin-{secrets.token_hex(4)}.sock")
        if len(path.encode()) > 100:
            raise _Fatal(f"Unix socket path {path!r} is too long; point {ENV_UNIX_SOCKET_DIR} at a shorter directory")
        self._remove.append(path)
        return path

    def _bind_tcp(self, bind: Callable[[str], int]) -> str:
        for port in _port_range():
            try:
                bound = bind(f"127.0.0.1:{port}")
            except RuntimeError:
                continue
            if bound:
                return f"127.0.0.1:{bound}"
        raise _Fatal(f"could not bind a TCP port on 127.0.0.1 within {ENV_MIN_PORT}..{ENV_MAX_PORT}")

    async def open(self) -> None:
        client_pem = os.environ.get(ENV_CLIENT_CERT, "")
        if not client_pem:
            if self.network == "unix":
                path = self._unix_path()
                self.server.add_insecure_port(f"unix:{path}")
                self.address = path
            else:
                self.address = self._bind_tcp(self.server.add_insecure_port)
            return
        from vz_core.errors import PluginError
        from vz_core.transport import generate_cert, grpc_can_verify, load_cert

        try:
            client_cert = load_cert(client_pem)
        except PluginError as exc:
            raise _Fatal(f"{ENV_CLIENT_CERT} does not hold a usable certificate: {exc}") from None
        ours = generate_cert(self.curve)
        self.cert_b64 = ours.cert_b64
        if grpc_can_verify(client_cert) and ours.curve != "P-521":
            creds = grpc.ssl_server_credentials(
                [(ours.key_pem, ours.cert_pem)], root_certificates=client_pem.encode(), require_client_auth=True
            )
            if self.network == "unix":
                path = self._unix_path()
                self.server.add_secure_port(f"unix:{path}", creds)
                self.address = path
            else:
                self.address = self._bind_tcp(lambda addr: self.server.add_secure_port(addr, creds))
            return
        # grpcio cannot verify this host's certificate (P-521): terminate TLS ourselves, relay to grpcio.
        from cryptography.hazmat.primitives import serialization

        from vz_core.transport import ServerRelay, server_context

        # Inside the host's socket directory when there is one: the host's supervisor removes it even when
        # this process is killed.
        private = tempfile.mkdtemp(prefix="grpc-", dir=os.environ.get(ENV_UNIX_SOCKET_DIR) or None)
        self._remove_dirs.append(private)
        internal = os.path.join(private, "grpc.sock")
        self.server.add_insecure_port(f"unix:{internal}")
        relay = ServerRelay(
            internal,
            client_cert.public_bytes(serialization.Encoding.DER),
            server_context(ours, client_pem.encode(), workdir=None),
        )
        self.relay = relay
        if self.network == "unix":
            path = self._unix_path()
            await relay.listen_unix(path)
            self.address = path
        else:
            for port in _port_range():
                try:
                    await relay.listen_tcp("127.0.0.1", port)
                except OSError:
                    continue
                self.address = relay.address
                break
            else:
                raise _Fatal(f"could not bind a TCP port on 127.0.0.1 within {ENV_MIN_PORT}..{ENV_MAX_PORT}")

    async def close(self) -> None:
        from vz_core.transport import ServerRelay

        if isinstance(self.relay, ServerRelay):
            await self.relay.close()
        for path in self._remove:
            with contextlib.suppress(OSError):
                os.unlink(path)
        for path in self._remove_dirs:
            shutil.rmtree(path, ignore_errors=True)


async def _run(
    factory: Driver | Callable[[], Driver],
    handshake_fd: int,
    network: Network,
    curve: Curve,
    on_serving: Callable[[], None] | None,
) -> int:
    from grpc_health.v1 import _async as health_aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from vz_core.redact import Redactor
    from vz_core.rpc import SERVER_OPTIONS, LocalExecServer, add_servicers, stop_server
    from vz_core.rpc.pb import grpc_broker_pb2_grpc, grpc_controller_pb2_grpc, grpc_stdio_pb2_grpc
    from vz_plugins._control import BrokerServicer, ControllerServicer, StdioServicer

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    if sys.platform != "win32":
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    driver = factory if isinstance(factory, Driver) else factory()
    if not isinstance(driver, Driver):
        raise _Fatal(f"the plugin's factory returned {type(driver).__name__}, not a vz_core Driver")
    redactor = Redactor()
    server = grpc.aio.server(options=SERVER_OPTIONS)
    local: LocalExecServer | None = None
    local_path = ""
    if network == "unix" and sys.platform == "linux" and os.environ.get(ENV_LOCAL_EXEC, "1") != "0":
        local = LocalExecServer(driver, redactor, parent=os.environ.get(ENV_UNIX_SOCKET_DIR) or None)
        try:
            local_path = await local.start()
        except OSError as exc:
            log.warning("local exec is not served: %s", exc)
            local = None
    add_servicers(server, driver, redactor, local_exec_socket=local_path)
    grpc_controller_pb2_grpc.add_GRPCControllerServicer_to_server(ControllerServicer(stopping), server)  # type: ignore[no-untyped-call]
    grpc_stdio_pb2_grpc.add_GRPCStdioServicer_to_server(StdioServicer(stopping), server)  # type: ignore[no-untyped-call]
    grpc_broker_pb2_grpc.add_GRPCBrokerServicer_to_server(BrokerServicer(stopping), server)  # type: ignore[no-untyped-call]
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await health_servicer.set("plugin", health_pb2.HealthCheckResponse.SERVING)

    listener = _Listener(server, network, curve)
    try:
        await listener.open()
        await server.start()
        line = f"{CORE_PROTOCOL_VERSION}|{APP_PROTOCOL_VERSION}|{network}|{listener.address}|grpc|{listener.cert_b64}\n"
        os.write(handshake_fd, line.encode())
        os.close(handshake_fd)
        log.debug("serving on %s %s", network, listener.address)
        if on_serving is not None:
            on_serving()
        await stopping.wait()
        log.debug("stopping")
        await stop_server(server, _STOP_GRACE)
        if local is not None:
            await local.close()  # running local execs are cancelled: their commands are killed
            local = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(driver.close(), 2.0)
    finally:
        if local is not None:
            await local.close()
        await listener.close()
    return 0


def serve(
    driver: Driver | Callable[[], Driver],
    *,
    network: Network | None = None,
    cert_curve: Curve = "P-256",
    on_serving: Callable[[], None] | None = None,
) -> NoReturn:
    """Serve ``driver`` (a Driver, or a callable making one) as a plugin process until the host stops it.

    Never returns: the process exits 0 after Shutdown/SIGTERM, 1 on a startup problem (reported on stderr).
    Pass a callable to defer building the driver (and importing its code) until the cookie and version checks
    passed. ``network`` forces "unix" or "tcp" (default: unix, tcp on Windows). ``cert_curve`` is the curve of
    the plugin's AutoMTLS certificate (P-256; P-521 imitates a Go plugin, for interop tests). ``on_serving`` is
    called once the handshake line is out and the server accepts calls.
    """
    if os.environ.get(COOKIE_KEY) != COOKIE_VALUE:
        sys.stderr.write(NOT_A_COMMAND)
        sys.stderr.flush()
        sys.exit(1)
    try:
        _negotiate(os.environ.get(ENV_PROTOCOL_VERSIONS))
    except _Fatal as exc:
        sys.stderr.write(f"{exc}\n")
        sys.stderr.flush()
        sys.exit(1)
    handshake_fd = _claim_stdout()
    level = os.environ.get("VZ_PLUGIN_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        stream=sys.stderr,
        level=level if level in logging.getLevelNamesMapping() else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    chosen: Network = network or ("tcp" if sys.platform == "win32" else "unix")
    try:
        # Not asyncio.run(): its teardown cancels every task still pending, and grpcio prints a CancelledError
        # traceback for each RPC whose close it was still waiting for (a host that closes its connection right
        # after Shutdown, as go-plugin's Kill() does). The process exits right after, so nothing needs it.
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        code = loop.run_until_complete(_run(driver, handshake_fd, chosen, cert_curve, on_serving))
    except _Fatal as exc:
        log.error("%s", exc)
        code = 1
    except VzError as exc:  # the driver refused to start (its options, its host): one line, no traceback
        log.error("%s", exc.message if isinstance(exc, DriverError) else exc)
        code = 1
    except BaseException as exc:
        # Unexpected: one summary line, then the traceback, both in the plugin's log (its stderr). A host logs
        # that whole, and quotes only the summary to its user (``vz_core.transport.StderrTail.text``).
        summary = (str(exc).splitlines() or [""])[0][:500]
        log.error("internal error in the plugin: %s: %s", type(exc).__name__, summary, exc_info=True)
        code = 1
    logging.shutdown()
    sys.stderr.flush()
    # Skip interpreter teardown (gRPC's own shutdown can take long): hosts wait only briefly for the exit.
    os._exit(code)
