"""Launching a plugin: environment, supervised start, handshake, AutoMTLS, health, and an orderly end.

``PluginLauncher.launch()`` does, in order (any failure kills and reaps what was started, removes what was
created, and raises ``PluginError``/``TrustError`` with the plugin's redacted stderr tail):

1. ``prepare()`` the launch: for external drivers this verifies the binary (never cached) and yields a sealed
   copy to execute;
2. a private 0700 run directory (``PLUGIN_UNIX_SOCKET_DIR``), the go-plugin environment (magic cookie,
   ``PLUGIN_PROTOCOL_VERSIONS=1``, port range, ``PLUGIN_CLIENT_CERT`` unless the driver is declared plaintext);
3. start under the supervisor (``_process``); stderr is forwarded line by line through a streaming redactor to
   the ``vz.plugin.<name>`` logger and kept as a bounded tail for diagnostics;
4. read stdout until the handshake line (default timeout 15 s); everything after it on stdout is drained and
   logged, never parsed;
5. connect: grpcio's own TLS when it can verify the plugin's certificate, otherwise (P-521, Go peers) through a
   ``ClientRelay``; plaintext only when declared; a plugin that ignores AutoMTLS is refused;
6. ``grpc.health.v1.Health/Check("plugin")`` must answer SERVING.

``PluginConnection.shutdown()``: ``GRPCController/Shutdown`` (UNAVAILABLE counts as success: Go plugins stop
their server inside the call), wait for the exit, then SIGTERM, then SIGKILL, and remove everything.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import grpc

from vz_core.errors import PluginError
from vz_core.redact import Redactor
from vz_core.transport._certs import CertKey, Curve, der_to_pem, generate_cert, grpc_can_verify, load_cert
from vz_core.transport._handshake import (
    APP_PROTOCOL_VERSION,
    COOKIE_KEY,
    COOKIE_VALUE,
    ENV_CLIENT_CERT,
    ENV_MAX_PORT,
    ENV_MIN_PORT,
    ENV_PROTOCOL_VERSIONS,
    ENV_UNIX_SOCKET_DIR,
    Handshake,
    looks_like_handshake,
    parse_handshake,
)
from vz_core.transport._limits import CHANNEL_OPTIONS as CHANNEL_OPTIONS
from vz_core.transport._process import ExitStatus, PluginProcess, spawn_plugin
from vz_core.transport._relay import ClientRelay, client_context

if TYPE_CHECKING:
    from vz_core.trust import VerifiedBinary

__all__ = ["CHANNEL_OPTIONS", "LaunchSpec", "PluginConnection", "PluginLauncher", "StderrTail", "without_tracebacks"]

log = logging.getLogger("vz.transport")

TlsMode = Literal["native", "relay", "plaintext"]


@dataclass
class LaunchSpec:
    """What to start. ``binary`` (a verified, sealed copy) is executed when given; ``argv[0]`` is then a name."""

    name: str
    argv: list[str]
    binary: VerifiedBinary | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    plaintext: bool = False
    """The driver is declared unable to do AutoMTLS (a manifest's ``plaintext: true``)."""
    cwd: str | None = None


MAX_STDERR_LINE = 8192
"""Bytes: a longer stderr line (or text without newlines) is logged in pieces of this size."""


class StderrTail:
    """Forwards a plugin's stderr: redacted, line by line, to a logger; keeps the last lines for errors.

    Bounded whatever the plugin writes: at most ``MAX_STDERR_LINE`` bytes wait for a newline (longer text is
    logged in pieces, each marked as continued), the tail keeps at most ``max_bytes``, and every byte is
    looked at a bounded number of times (linear time).
    """

    def __init__(self, reader: asyncio.StreamReader, redactor: Redactor, name: str, *, max_bytes: int = 16384) -> None:
        self._reader = reader
        self._stream = redactor.stream()
        self._logger = logging.getLogger(f"vz.plugin.{name}")
        self._lines: collections.deque[str] = collections.deque()
        self._size = 0
        self._max = max_bytes
        self._partial = bytearray()
        self.task = asyncio.get_running_loop().create_task(self._run())

    def _line(self, raw: bytes | bytearray, continued: bool = False) -> None:
        line = bytes(raw).decode(errors="replace").rstrip("\r") + (" …" if continued else "")
        self._logger.info("%s", line)
        self._lines.append(line)
        self._size += len(line) + 1
        while self._size > self._max and self._lines:
            self._size -= len(self._lines.popleft()) + 1

    def _emit(self, data: bytes, final: bool = False) -> None:
        buf = self._partial
        buf += data
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            while end - start > MAX_STDERR_LINE:
                self._line(buf[start : start + MAX_STDERR_LINE], continued=True)
                start += MAX_STDERR_LINE
            self._line(buf[start:end])
            start = end + 1
        while len(buf) - start >= MAX_STDERR_LINE:
            self._line(buf[start : start + MAX_STDERR_LINE], continued=True)
            start += MAX_STDERR_LINE
        del buf[:start]
        if final and buf:
            self._line(buf)
            buf.clear()

    async def _run(self) -> None:
        try:
            while chunk := await self._reader.read(65536):
                self._emit(self._stream.feed(chunk))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._emit(self._stream.flush(), final=True)

    async def finish(self, seconds: float = 1.0) -> None:
        """Wait for end of stream (a detached descendant may hold it open: give up after ``seconds``)."""
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self.task), seconds)
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    def text(self, max_chars: int = 4000) -> str:
        """The most recent stderr lines (already redacted), at most ``max_chars`` characters, as an error quotes
        them to the user: Python tracebacks left out (``without_tracebacks``; the log has every line)."""
        lines = list(self._lines)
        if self._partial:
            lines.append(bytes(self._partial).decode(errors="replace") + " …")
        out = "\n".join(without_tracebacks(lines))
        return out[-max_chars:]


_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


def without_tracebacks(lines: list[str]) -> list[str]:
    """``lines`` with every Python traceback block left out: from ``Traceback (most recent call last):`` through
    its indented frames, blank lines and chaining headers; its final ``Type: message`` line stays unless a line
    just before already said it. A left-out block becomes one marker line, so a user's error never shows a
    plugin's code, paths or frames (the plugin's log keeps them)."""
    out: list[str] = []
    inside = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(("Traceback (most recent call last):", "Exception Group Traceback")) or (
            inside and stripped.endswith("Traceback (most recent call last):")
        ):
            if not inside:
                out.append("(a traceback was left out: it is in the plugin's log)")
            inside = True
            continue
        if inside:
            if not stripped or line[:1].isspace() or stripped in _CHAINED or stripped.startswith(('File "', "|", "+")):
                continue
            inside = False
            if any(stripped in earlier for earlier in out[-3:]):
                continue  # the final "Type: message" line the plugin already summarized
        out.append(line)
    return out


class PluginConnection:
    """A running plugin and the gRPC channel to it. Close it with ``shutdown()`` (or ``kill()``)."""

    def __init__(
        self,
        *,
        name: str,
        process: PluginProcess,
        handshake: Handshake,
        channel: grpc.aio.Channel,
        tls: TlsMode,
        stderr: StderrTail,
        cleanup: list[str],
        relay: ClientRelay | None,
        stdout_task: asyncio.Task[None],
        shutdown_grace: float,
    ) -> None:
        self.name = name
        self.process = process
        self.handshake = handshake
        self.channel = channel
        self.tls: TlsMode = tls
        self.stderr = stderr
        self._cleanup_paths = cleanup
        self._relay = relay
        self._stdout_task = stdout_task
        self._grace = shutdown_grace
        self._closed = False
        self._lock = asyncio.Lock()
        self.stopping = False
        """True once the host asked the plugin to end (``shutdown`` or ``kill``): an exit after that is not a
        crash."""

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return not self._closed and not self.process.exited.is_set()

    def stderr_tail(self, max_chars: int = 4000) -> str:
        """The plugin's last stderr lines, redacted."""
        return self.stderr.text(max_chars)

    async def wait_exited(self, seconds: float) -> ExitStatus | None:
        """The exit status if the plugin ends within ``seconds``, else None."""
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(self.process.wait(), seconds)
        return None

    async def shutdown(self, grace: float | None = None) -> ExitStatus:
        """Ask the plugin to exit (GRPCController/Shutdown), then SIGTERM, then SIGKILL; remove everything."""
        grace = self._grace if grace is None else grace
        self.stopping = True
        async with self._lock:
            if not self.process.exited.is_set():
                from vz_core._proto.plugin import grpc_controller_pb2, grpc_controller_pb2_grpc

                stub = grpc_controller_pb2_grpc.GRPCControllerStub(self.channel)  # type: ignore[no-untyped-call]
                with contextlib.suppress(grpc.RpcError, TimeoutError):
                    await asyncio.wait_for(stub.Shutdown(grpc_controller_pb2.Empty(), timeout=grace), grace + 0.5)
                if await self.wait_exited(grace) is None:
                    await self.process.terminate(grace=1.0)
            status = await self.process.wait()
            await self._release()
            return status

    async def kill(self) -> ExitStatus:
        """Kill the plugin's whole tree now; remove everything."""
        self.stopping = True
        async with self._lock:
            status = await self.process.kill()
            await self._release()
            return status

    async def _release(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await self.channel.close(grace=None)
        if self._relay is not None:
            await self._relay.close()
        self._stdout_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._stdout_task
        await self.stderr.finish()
        self.process.close_pipes()
        _remove(self._cleanup_paths, self.handshake)


def _remove(paths: list[str], handshake: Handshake | None) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
    # A plugin that ignored PLUGIN_UNIX_SOCKET_DIR and was killed leaves its socket behind: remove that file
    # (only a socket, never anything else).
    if handshake is not None and handshake.network == "unix":
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(handshake.address).st_mode):
                os.unlink(handshake.address)


def _base_env(spec: LaunchSpec, run_dir: str, client: CertKey | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_") and k != COOKIE_KEY}
    env.update(spec.env)
    env[COOKIE_KEY] = COOKIE_VALUE
    env[ENV_PROTOCOL_VERSIONS] = str(APP_PROTOCOL_VERSION)
    env[ENV_MIN_PORT] = "10000"
    env[ENV_MAX_PORT] = "25000"
    env[ENV_UNIX_SOCKET_DIR] = run_dir
    if client is not None:
        env[ENV_CLIENT_CERT] = client.cert_pem.decode()
    return env


class PluginLauncher:
    """Starts plugin processes for one driver. Every ``launch()`` prepares (and so verifies) afresh.

    ``handshake_timeout``: seconds to wait for the handshake line (go-plugin hosts use 15 s by default).
    ``supervised``: run under the supervisor (False only to measure its cost). ``client_curve``: the curve of
    our AutoMTLS client certificate (P-256; P-521 makes plugins take their relay path, for testing).
    ``run_root``: where the private per-launch directories (sockets) are made (default: the temp directory;
    keep it short, Unix socket paths are limited to about 100 bytes).
    """

    def __init__(
        self,
        prepare: Callable[[], LaunchSpec],
        *,
        name: str = "",
        handshake_timeout: float = 15.0,
        supervised: bool = True,
        redactor: Redactor | None = None,
        client_curve: Curve = "P-256",
        shutdown_grace: float = 2.0,
        run_root: str | None = None,
    ) -> None:
        self._prepare = prepare
        self.run_root = run_root
        self.name = name
        self.handshake_timeout = handshake_timeout
        self.supervised = supervised
        self.redactor = redactor if redactor is not None else Redactor()
        self._client_curve: Curve = client_curve
        self._client: CertKey | None = None
        self.shutdown_grace = shutdown_grace

    def _client_cert(self) -> CertKey:
        if self._client is None:
            self._client = generate_cert(self._client_curve)
        return self._client

    async def launch(self) -> PluginConnection:
        """Start the plugin and return a healthy connection to it (see the module docstring)."""
        # Verification hashes the binary: keep that off the event loop.
        spec = await asyncio.to_thread(self._prepare)
        name = spec.name or self.name
        binary = spec.binary
        run_dir = tempfile.mkdtemp(prefix="vz-plugin-", dir=self.run_root)
        cleanup = [run_dir]
        process: PluginProcess | None = None
        stderr: StderrTail | None = None
        handshake: Handshake | None = None
        relay: ClientRelay | None = None
        channel: grpc.aio.Channel | None = None
        try:
            os.chmod(run_dir, 0o700)
            client = None if spec.plaintext else self._client_cert()
            env = _base_env(spec, run_dir, client)
            argv = list(spec.argv)
            exec_fd = binary.fd if binary is not None else None
            if binary is not None and binary.copy_path is not None:
                argv = [binary.copy_path, *argv[1:]]
            started = time.monotonic()
            process = await spawn_plugin(
                argv, env=env, exec_fd=exec_fd, cleanup_dir=run_dir, supervised=self.supervised, cwd=spec.cwd
            )
            stderr = StderrTail(process.stderr, self.redactor, name)
            await asyncio.wait_for(process.started(), self.handshake_timeout)
            if binary is not None:
                binary.close()  # the plugin runs (or holds its own descriptor): our copy can go
            handshake = await self._read_handshake(name, process, stderr, started)
            stdout_task = asyncio.get_running_loop().create_task(_drain_stdout(process.stdout, self.redactor, name))
            channel, tls, relay = await self._connect(name, handshake, client, spec.plaintext, cleanup)
            remaining = max(self.handshake_timeout - (time.monotonic() - started), 5.0)
            await self._health(name, channel, remaining, process, stderr)
            return PluginConnection(
                name=name,
                process=process,
                handshake=handshake,
                channel=channel,
                tls=tls,
                stderr=stderr,
                cleanup=cleanup,
                relay=relay,
                stdout_task=stdout_task,
                shutdown_grace=self.shutdown_grace,
            )
        except BaseException as exc:
            if binary is not None:
                binary.close()
            if channel is not None:
                with contextlib.suppress(Exception):
                    await channel.close(grace=None)
            if relay is not None:
                await relay.close()
            if process is not None:
                await process.kill()
            if stderr is not None:
                await stderr.finish()
            if process is not None:
                process.close_pipes()
            _remove(cleanup, handshake)
            if isinstance(exc, PluginError) and stderr is not None and stderr.text() and "stderr:" not in str(exc):
                raise PluginError(f"{exc}\nplugin stderr (last lines, redacted):\n{stderr.text()}") from None
            if isinstance(exc, TimeoutError):
                raise PluginError(
                    f"driver {name!r}: the plugin did not start within {self.handshake_timeout:g}s; it was stopped"
                    + (f"\nplugin stderr (last lines, redacted):\n{stderr.text()}" if stderr and stderr.text() else "")
                ) from None
            raise

    async def _read_handshake(self, name: str, process: PluginProcess, stderr: StderrTail, started: float) -> Handshake:
        skipped: list[str] = []
        exited: asyncio.Future[Any] = asyncio.ensure_future(process.exited.wait())
        try:
            while True:
                raw = await self._next_line(name, process, exited, started, skipped)
                text = self.redactor.redact(raw.decode(errors="replace")).strip()
                if looks_like_handshake(text):
                    try:
                        return parse_handshake(text)
                    except PluginError as exc:
                        raise PluginError(f"driver {name!r}: {exc}") from None
                if len(skipped) < 10:
                    skipped.append(text[:200])
        finally:
            exited.cancel()

    async def _next_line(
        self, name: str, process: PluginProcess, exited: asyncio.Future[Any], started: float, skipped: list[str]
    ) -> bytes:
        said = f"; stdout said: {' / '.join(skipped)[:400]!r}" if skipped else ""
        left = self.handshake_timeout - (time.monotonic() - started)
        line: asyncio.Future[Any] = asyncio.ensure_future(process.stdout.readline())
        try:
            done, _ = await asyncio.wait({line, exited}, timeout=max(left, 0), return_when=asyncio.FIRST_COMPLETED)
            if line not in done and exited in done:
                # It ended; what it printed before is still in the pipe.
                done, _ = await asyncio.wait({line}, timeout=0.2)
            if line in done:
                raw: bytes = line.result()
                if raw:
                    return raw
                status = await _status_soon(process)
                ended = f"ended ({status})" if status else "closed stdout"
                raise PluginError(f"driver {name!r}: the plugin {ended} before printing its handshake line{said}")
            if exited.done():
                raise PluginError(
                    f"driver {name!r}: the plugin ended ({process.status}) before printing its handshake line{said}"
                )
            raise PluginError(
                f"driver {name!r}: no handshake line within {self.handshake_timeout:g}s "
                f"(a plugin must print 'CORE|APP|NETWORK|ADDRESS|grpc|CERT' on stdout){said}; it was stopped"
            )
        except ValueError:
            raise PluginError(
                f"driver {name!r}: the plugin wrote an over-long line on stdout instead of its handshake"
            ) from None
        finally:
            if not line.done():
                line.cancel()
                with contextlib.suppress(asyncio.CancelledError, ValueError):
                    await line

    async def _connect(
        self, name: str, handshake: Handshake, client: CertKey | None, plaintext: bool, cleanup: list[str]
    ) -> tuple[grpc.aio.Channel, TlsMode, ClientRelay | None]:
        der = handshake.server_cert_der
        if der is None:
            if client is not None:
                raise PluginError(
                    f"driver {name!r}: the plugin ignored AutoMTLS (its handshake carries no certificate); refusing "
                    "an unauthenticated connection. A driver that cannot do TLS must declare `plaintext: true` "
                    "in its manifest"
                )
            return grpc.aio.insecure_channel(handshake.target, options=CHANNEL_OPTIONS), "plaintext", None
        if client is None:
            raise PluginError(
                f"driver {name!r} is declared plaintext but its handshake carries a TLS certificate; "
                "remove `plaintext: true` from its manifest"
            )
        cert = load_cert(der)
        if grpc_can_verify(cert) and client.curve != "P-521":
            creds = grpc.ssl_channel_credentials(
                root_certificates=der_to_pem(der), private_key=client.key_pem, certificate_chain=client.cert_pem
            )
            options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", "localhost")]
            return grpc.aio.secure_channel(handshake.target, creds, options=options), "native", None
        # grpcio cannot verify this peer (P-521): carry TLS ourselves and give grpcio a private plaintext socket.
        # Inside the run directory: the supervisor removes it even when the host is killed.
        relay_dir = tempfile.mkdtemp(prefix="relay-", dir=cleanup[0])
        cleanup.append(relay_dir)
        os.chmod(relay_dir, 0o700)
        relay = ClientRelay(handshake.network, handshake.address, der, client_context(client, der, workdir=None))
        await relay.listen(os.path.join(relay_dir, "relay.sock"))
        try:
            # Fail here, with a clear error, if the TLS session cannot be established at all.
            transport, _ = await relay.open_tls()
            transport.close()
        except (OSError, TimeoutError) as exc:
            await relay.close()
            raise PluginError(f"driver {name!r}: TLS connection to the plugin failed: {exc}") from None
        except BaseException:
            await relay.close()
            raise
        return grpc.aio.insecure_channel(f"unix:{relay.path}", options=CHANNEL_OPTIONS), "relay", relay

    async def _health(
        self, name: str, channel: grpc.aio.Channel, seconds: float, process: PluginProcess, stderr: StderrTail
    ) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service="plugin"), timeout=seconds)
        except grpc.RpcError as exc:
            raise PluginError(f"driver {name!r}: health check failed ({exc.code().name}: {exc.details()})") from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise PluginError(f"driver {name!r}: the plugin reports it is not serving (health status {reply.status})")


async def _status_soon(process: PluginProcess) -> ExitStatus | None:
    # Stdout reached its end: the plugin is normally exiting; give it a moment to say how.
    with contextlib.suppress(TimeoutError):
        return await asyncio.wait_for(process.wait(), 0.5)
    return None


async def _drain_stdout(reader: asyncio.StreamReader, redactor: Redactor, name: str) -> None:
    logger = logging.getLogger(f"vz.plugin.{name}")
    with contextlib.suppress(ConnectionError):
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # a line over the reader's limit: its bytes are dropped, keep reading
                logger.warning("stdout after handshake: an over-long line (dropped)")
                continue
            if not line:
                return
            logger.warning("stdout after handshake: %s", redactor.redact(line.decode(errors="replace")).rstrip())
