"""Small drivers served as real plugin processes by the transport tests.

Run as ``python testdrivers.py KIND``; the directory of this file is on ``sys.path`` then. KIND:

* ``mini``: a synthetic driver (no real Machines) with exec behaviours chosen by argv[0]:
  ``echo-stdin`` returns stdin as stdout, ``stdin-sizes`` answers each stdin chunk with its size (a decimal
  line), ``exit-now`` exits 0 at once without reading stdin, ``crash``
  prints the exec environment values to the plugin's stderr and then the plugin dies after one output frame,
  ``boom`` raises an unexpected exception mentioning the environment, ``bigframe`` sends one 70000-byte frame
  (a rule break the SDK must forward as is), and ``wait`` yields one frame and then waits forever,
  ``spawn ARGV...`` runs ARGV as a real process in its own process group inside the plugin's session (stdout
  streamed; killed when the exec is closed), and ``spawn-crash ARGV...`` does the same but the plugin dies
  after the first output frame, as soon as the client sends a stdin chunk; every exec in the workspace
  ``missing`` fails with NOT_FOUND;
* ``mini-p521``: the same, with a P-521 AutoMTLS certificate (what Go plugins use);
* ``mini-tcp``: the same, listening on loopback TCP;
* ``mini-ext``: the same, with vz.machine.v1 extensions (tty not supported);
* ``hang``: the same, but Info never answers while the file named by ``VZ_TEST_HANG_FILE`` exists, and Find of
  the workspace ``hang`` never answers;
* ``big-info``: the same, but Info answers with a driver_version of ``VZ_TEST_INFO_BYTES`` bytes;
* ``mini-pending``: the same, with a background task pending when the plugin exits (it reports on stderr if
  it is cancelled at exit, as ``asyncio.run``'s teardown would);
* ``flood``: writes ``VZ_TEST_FLOOD_BYTES`` bytes to stderr without a newline, then serves ``mini``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from vz_core import (
    Capabilities,
    Driver,
    DriverInfo,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecSpec,
    Extensions,
    MachineDetails,
    MountType,
    RecreateMode,
    RunImageRequest,
)
from vz_core.errors import NotFoundError

HERE = Path(__file__).resolve().parent
PATH = HERE / "testdrivers.py"
log = logging.getLogger("mini")


class MiniDriver(Driver):
    def __init__(self, extensions: Extensions | None = None) -> None:
        self._extensions = extensions

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        return DriverInfo(
            driver_name="mini",
            driver_version="0.1",
            runtime_name="mini-runtime",
            capabilities=Capabilities(
                mount_types=(MountType.BIND,),
                recreate_mode=RecreateMode.ON_RUN if supports_recreate_on_run else RecreateMode.DELETE,
            ),
        )

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        return None

    async def find(self, workspace_id: str) -> MachineDetails | None:
        return None

    async def target_architecture(self, workspace_id: str) -> str:
        return "amd64"

    async def run_image(self, request: RunImageRequest) -> None:
        # Deliberately careless: a backend echoing its configuration to stderr. The host must redact it.
        for key, value in request.environment.items():
            log.info("configuring %s=%s", key, value)
        if request.workspace_id == "missing":
            raise NotFoundError(f"no Machine {request.workspace_id!r} (secret {dict(request.environment)})")

    async def start(self, workspace_id: str) -> None:
        return None

    async def stop(self, workspace_id: str) -> None:
        return None

    async def delete(self, workspace_id: str) -> None:
        return None

    async def extensions(self) -> Extensions | None:
        return self._extensions

    def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        return self._exec(spec, stdin)

    async def _exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        if spec.workspace_id == "missing":
            raise NotFoundError(f"no Machine {spec.workspace_id!r}")
        kind = spec.argv[0]
        if kind == "echo-stdin":
            async for chunk in stdin:
                yield ExecOutput("stdout", chunk)
            yield ExecExit(0)
        elif kind == "stdin-sizes":
            async for chunk in stdin:
                yield ExecOutput("stdout", b"%d\n" % len(chunk))
            yield ExecExit(0)
        elif kind == "crash":
            for value in spec.environment.values():
                sys.stderr.write(f"about to crash; the environment holds {value}\n")
            sys.stderr.flush()
            yield ExecOutput("stdout", b"crashing")
            os._exit(3)
        elif kind == "boom":
            raise ValueError(f"unexpected failure with {dict(spec.environment)}")
        elif kind == "exit-now":
            yield ExecExit(0)
        elif kind == "print":
            print("hello from print()")  # must land on stderr: stdout belongs to the handshake
            yield ExecExit(0)
        elif kind == "bigframe":
            yield ExecOutput("stdout", b"x" * 70000)
            yield ExecExit(0)
        elif kind == "wait":
            yield ExecOutput("stdout", b"waiting")
            await asyncio.Event().wait()
        elif kind in ("spawn", "spawn-crash"):
            proc = await asyncio.create_subprocess_exec(
                *spec.argv[1:],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                process_group=0,
            )
            assert proc.stdout is not None
            try:
                while chunk := await proc.stdout.read(32768):
                    yield ExecOutput("stdout", chunk)
                    if kind == "spawn-crash":
                        # Die once the client has seen the frame (it answers with one stdin chunk), so the
                        # frame is not lost in our send buffer.
                        await stdin.__anext__()
                        os._exit(3)
                yield ExecExit(await proc.wait())
            finally:
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    # asyncio's Process.wait() returns only once its pipes reached EOF, and a paused reader
                    # (a full buffer) never gets there: read to the end first.
                    while await proc.stdout.read(65536):
                        pass
                    await proc.wait()
        else:
            yield ExecOutput("stderr", f"unknown command {kind}".encode())
            yield ExecExit(127)


class HangDriver(MiniDriver):
    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        flag = os.environ.get("VZ_TEST_HANG_FILE", "")
        if flag and os.path.exists(flag):  # noqa: ASYNC240 (a test driver; one stat)
            await asyncio.Event().wait()
        return await super().info(supports_recreate_on_run=supports_recreate_on_run)

    async def find(self, workspace_id: str) -> MachineDetails | None:
        if workspace_id == "hang":
            await asyncio.Event().wait()
        return None


class BigInfoDriver(MiniDriver):
    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        info = await super().info(supports_recreate_on_run=supports_recreate_on_run)
        size = int(os.environ.get("VZ_TEST_INFO_BYTES", "0"))
        return DriverInfo(
            driver_name=info.driver_name,
            driver_version="v" * size,
            runtime_name=info.runtime_name,
            capabilities=info.capabilities,
        )


class LogsDriver(MiniDriver):
    """Advertises Logs; ``logs`` is a plain method that raises before it returns an iterator for "missing"."""

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        info = await super().info(supports_recreate_on_run=supports_recreate_on_run)
        assert info.capabilities is not None
        caps = dataclasses.replace(info.capabilities, logs=True)
        return dataclasses.replace(info, capabilities=caps)

    def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        if workspace_id == "missing":
            raise NotFoundError(f"no Machine {workspace_id!r}")
        if workspace_id == "boom":
            raise ValueError("a bug before the stream started")
        return self._logs()

    async def _logs(self) -> AsyncIterator[bytes]:
        yield b"line 1\n"


class LogsUnimplementedDriver(LogsDriver):
    """Advertises Logs but keeps the default ``Driver.logs``."""

    logs = Driver.logs


SKEW = {
    # kind: (api_major, api_minor, reuse_preflight, answers ON_RUN when offered): plugins built against older and
    # newer Runtime Protocol versions (what a plugin of that version answers; tests/vz_core/test_version_skew.py)
    "api-1.0": (1, 0, False, False),
    "api-1.1-claims-reuse": (1, 1, True, False),
    "api-1.2": (1, 2, True, False),
    "api-1.2-claims-on-run": (1, 2, True, True),
    "api-1.3": (1, 3, True, True),
    "api-1.9": (1, 9, True, True),
    "api-2.0": (2, 0, True, True),
}


class SkewDriver(MiniDriver):
    """A plugin that speaks the Runtime Protocol version ``SKEW[kind]`` says."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self._major, self._minor, self._reuse, self._on_run = SKEW[kind]

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        on_run = self._on_run and (supports_recreate_on_run or self._minor < 3)  # a pre-1.3 plugin never asked
        return DriverInfo(
            driver_name="skew",
            driver_version=f"{self._major}.{self._minor}",
            runtime_name="mini-runtime",
            api_major=self._major,
            api_minor=self._minor,
            capabilities=Capabilities(
                mount_types=(MountType.BIND,),
                recreate_mode=RecreateMode.ON_RUN if on_run else RecreateMode.DELETE,
                reuse_preflight=self._reuse,
            ),
        )


def _newer_info() -> None:
    """Answer Info with a field this host does not know (field 900), as a plugin of a newer minor may."""
    from vz_core.rpc import _server

    served = _server.RuntimeServicer.Info

    async def info(self: Any, request: Any, context: Any) -> Any:
        reply = await served(self, request, context)
        reply.MergeFromString(b"\xa0\x38\x01")
        return reply

    _server.RuntimeServicer.Info = info  # type: ignore[method-assign]


def _newer_extensions() -> None:
    """Serve vz.machine.v1 Extensions with fields this host does not know (a plugin built against a newer
    extension set): an unknown bool (field 900) and an unknown string (field 901) in the reply."""
    from vz_core.rpc import _server

    served = _server.ExtensionsServicer.Extensions

    async def extensions(self: Any, request: Any, context: Any) -> Any:
        reply = await served(self, request, context)
        reply.MergeFromString(b"\xa0\x38\x01" + b"\xaa\x38\x06future")
        return reply

    _server.ExtensionsServicer.Extensions = extensions  # type: ignore[method-assign]


def _flood(total: int) -> None:
    block = b"x" * 65536
    while total > 0:
        n = min(total, len(block))
        os.write(2, block[:n])
        total -= n


def _pending_task() -> None:
    async def pending() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            os.write(2, b"pending task cancelled at exit\n")
            raise

    _PENDING.append(asyncio.get_running_loop().create_task(pending()))


_PENDING: list[asyncio.Task[None]] = []


def main() -> None:
    from vz_plugins import serve

    kind = sys.argv[1]
    if kind == "mini":
        serve(MiniDriver())
    elif kind == "mini-p521":
        serve(MiniDriver(), cert_curve="P-521")
    elif kind == "mini-tcp":
        serve(MiniDriver(), network="tcp")
    elif kind == "mini-pending":
        serve(MiniDriver(), on_serving=_pending_task)
    elif kind == "hang":
        serve(HangDriver())
    elif kind in SKEW:
        if SKEW[kind][1] > 3:
            _newer_info()
        serve(SkewDriver(kind))
    elif kind == "ext-newer":
        _newer_extensions()
        serve(MiniDriver(Extensions(target_os=("linux",), profiles=("developer",), accelerator="none")))
    elif kind == "logs":
        serve(LogsDriver())
    elif kind == "logs-unimplemented":
        serve(LogsUnimplementedDriver())
    elif kind == "big-info":
        serve(BigInfoDriver())
    elif kind == "flood":
        _flood(int(os.environ.get("VZ_TEST_FLOOD_BYTES", "0")))
        serve(MiniDriver())
    elif kind == "mini-ext":
        serve(MiniDriver(Extensions(target_os=("linux",), profiles=("developer",), accelerator="none")))
    else:
        sys.exit(f"unknown test driver {kind!r}")


if __name__ == "__main__":
    main()
