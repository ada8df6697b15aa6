"""Local exec: a plugin runs ``Driver.exec_local`` on descriptors a host on the same machine passes it.

A vz plugin listens on a Unix socket in a private 0700 directory of its own and advertises the path in
``vz.machine.v1.ExtensionsResponse.local_exec_socket`` (field 13). One exec per connection
(docs/protocol.md, "Local exec"), in the ``vz_core.rpc._fdpass`` framing:

1. The plugin checks the peer (``SO_PEERCRED``): another uid than its own is closed without a word.
2. The host sends one ``J`` message ``{"exec": {"machine_id", "argv", "user", "workdir", "environment"}}``
   carrying exactly three descriptors (stdin, stdout, stderr) as SCM_RIGHTS.
3. The plugin refuses a terminal descriptor (``InvalidArgumentError``) and otherwise calls its driver's
   ``exec_local`` with them; the host may send nothing else.
4. The plugin answers with one ``J`` message, ``{"exit": {"exit_code", "signal"}}`` or ``{"error": {"code",
   "message", "runtime_message", "details", "retryable"}}`` (messages redacted), and closes.

Closing the connection before the answer cancels the exec: the command is killed. The plugin closes the
descriptors once the exec is over; they never reach another process than the driver's command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from vz_core._driver import Driver, check_local_stdio
from vz_core._types import ExecExit, ExecSpec
from vz_core.errors import (
    CATEGORY_TABLE,
    DriverError,
    InvalidArgumentError,
    RuntimeFailureError,
    UnavailableError,
    UnknownRuntimeError,
)

if sys.platform != "win32":
    from vz_core.platform.sockets import unix_socket
from vz_core.redact import Redactor
from vz_core.rpc._fdpass import KIND_JSON, FramingError

if sys.platform != "win32":
    from vz_core.rpc._fdpass import peer_credentials, recv_message, send_json
from vz_core.rpc._frames import MAX_EXEC_START

__all__ = ["LOCAL_EXEC_SOCKET", "LocalExecServer", "local_exec"]

LOCAL_EXEC_SOCKET = "exec.sock"
"""File name of the local exec socket inside the plugin's private directory."""
_REQUEST_WAIT = 10.0
_ERROR_BY_CODE = {cls.category.name: cls for cls in CATEGORY_TABLE}
_ENV_LIMIT = MAX_EXEC_START + 4096

log = logging.getLogger("vz.plugin")


def _error_doc(err: DriverError) -> dict[str, Any]:
    return {
        "code": err.category.name,
        "message": err.message,
        "runtime_message": err.runtime_message,
        "details": dict(err.details),
        "retryable": err.retryable,
    }


def _error_from_doc(doc: Any) -> DriverError:
    if not isinstance(doc, dict):
        return UnknownRuntimeError("the plugin answered a local exec with a malformed error")
    cls = _ERROR_BY_CODE.get(str(doc.get("code", "")), UnknownRuntimeError)
    details = doc.get("details")
    return cls(
        str(doc.get("message") or "the local exec failed"),
        runtime_message=str(doc.get("runtime_message") or ""),
        details={str(k): str(v) for k, v in details.items()} if isinstance(details, dict) else {},
        retryable=bool(doc.get("retryable", False)),
    )


def _spec_from(doc: Any) -> tuple[str, ExecSpec]:
    if not isinstance(doc, dict):
        raise InvalidArgumentError('a local exec request must be {"exec": {...}}')
    machine_id = doc.get("machine_id")
    argv = doc.get("argv")
    user = doc.get("user", "")
    workdir = doc.get("workdir", "")
    environment = doc.get("environment", {})
    if not isinstance(machine_id, str) or not machine_id:
        raise InvalidArgumentError("local exec: machine_id must be a non-empty string")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidArgumentError("local exec: argv must be a non-empty list of strings")
    if not isinstance(user, str) or not isinstance(workdir, str):
        raise InvalidArgumentError("local exec: user and workdir must be strings")
    if not isinstance(environment, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in environment.items()
    ):
        raise InvalidArgumentError("local exec: environment must map strings to strings")
    spec = ExecSpec(workspace_id=machine_id, argv=tuple(argv), user=user, workdir=workdir, environment=environment)
    return machine_id, spec


if sys.platform != "win32":  # descriptors over a Unix socket: not on Windows (FD_PASSING is False there)

    class LocalExecServer:
        """The plugin side: serves ``driver.exec_local`` on a Unix socket in a fresh private directory.

        ``parent``: where that directory is made (the host's socket directory when it gave one, so its supervisor
        removes it even when the plugin is killed). ``await start()`` returns the socket's path; ``await close()``
        cancels running execs (their commands are killed) and removes the directory.
        """

        def __init__(self, driver: Driver, redactor: Redactor, *, parent: str | None = None) -> None:
            self._driver = driver
            self._redactor = redactor
            self._parent = parent
            self._dir = ""
            self.path = ""
            self._listener: socket.socket | None = None
            self._accept_task: asyncio.Task[None] | None = None
            self._tasks: set[asyncio.Task[None]] = set()

        async def start(self) -> str:
            self._dir = tempfile.mkdtemp(prefix="vz-exec-", dir=self._parent)  # mode 0700
            path = os.path.join(self._dir, LOCAL_EXEC_SOCKET)
            if len(os.fsencode(path)) > 100:
                shutil.rmtree(self._dir, ignore_errors=True)
                raise OSError(f"the local exec socket path {path!r} is too long")
            # A raw listener, not asyncio's servers: their transports would read (and drop) the descriptors.
            listener = unix_socket(nonblocking=True)
            try:
                listener.bind(path)
                os.chmod(path, 0o600)
                listener.listen(64)
            except BaseException:
                listener.close()
                shutil.rmtree(self._dir, ignore_errors=True)
                raise
            self._listener = listener
            self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop(listener))
            self.path = path
            return path

        async def close(self) -> None:
            if self._accept_task is not None:
                self._accept_task.cancel()
                await asyncio.gather(self._accept_task, return_exceptions=True)
                self._accept_task = None
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            if self._dir:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = ""

        async def _accept_loop(self, listener: socket.socket) -> None:
            loop = asyncio.get_running_loop()
            while True:
                try:
                    sock, _ = await loop.sock_accept(listener)
                except OSError as exc:
                    log.warning("local exec: accept failed: %s", exc)
                    await asyncio.sleep(0.1)
                    continue
                sock.setblocking(False)
                task = loop.create_task(self._connection(sock))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        async def _connection(self, sock: socket.socket) -> None:
            try:
                await self._serve(sock)
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("local exec: the connection failed")
            finally:
                sock.close()

        async def _serve(self, sock: socket.socket) -> None:
            _pid, uid, _gid = peer_credentials(sock)
            if uid != os.geteuid():
                log.warning("local exec: refused a connection of uid %d (only uid %d may connect)", uid, os.geteuid())
                return
            fds: list[int] = []
            try:
                try:
                    async with asyncio.timeout(_REQUEST_WAIT):
                        kind, payload, fds = await recv_message(sock)
                except (EOFError, FramingError, TimeoutError, OSError):
                    return
                try:
                    answer = await self._run(sock, kind, payload, fds)
                except DriverError as exc:
                    answer = {"error": _error_doc(self._clean(exc))}
                with contextlib.suppress(OSError):
                    await send_json(sock, answer)
            finally:
                for fd in fds:
                    os.close(fd)

        def _clean(self, err: DriverError) -> DriverError:
            r = self._redactor
            if not r:
                return err
            return type(err)(
                r.redact(err.message) or "error",
                runtime_message=r.redact(err.runtime_message),
                details={k: r.redact(v) for k, v in err.details.items()},
                retryable=err.retryable,
            )

        async def _run(self, sock: socket.socket, kind: int, payload: bytes, fds: list[int]) -> dict[str, Any]:
            if kind != KIND_JSON or len(payload) > _ENV_LIMIT:
                raise InvalidArgumentError("a local exec request is one JSON message of at most 1 MiB")
            try:
                doc = json.loads(payload)
            except ValueError:
                raise InvalidArgumentError("a local exec request is not valid JSON") from None
            machine_id, spec = _spec_from(doc.get("exec") if isinstance(doc, dict) else None)
            self._redactor.add_environment(spec.environment)
            if len(fds) != 3:
                raise InvalidArgumentError(
                    f"a local exec request carries exactly three descriptors (stdin, stdout, stderr), got {len(fds)}"
                )
            stdio = (fds[0], fds[1], fds[2])
            check_local_stdio(stdio)
            loop = asyncio.get_running_loop()
            run = loop.create_task(self._driver.exec_local(machine_id, spec, stdio))
            hangup = loop.create_task(self._hangup(sock))
            try:
                await asyncio.wait((run, hangup), return_when=asyncio.FIRST_COMPLETED)
            finally:
                hangup.cancel()
                if not run.done():
                    run.cancel()  # the host went away (or we are stopping): the command is killed
                await asyncio.gather(run, hangup, return_exceptions=True)
            if run.cancelled():
                raise asyncio.CancelledError
            exc = run.exception()
            if exc is None:
                exit_ = run.result()
                return {"exit": {"exit_code": exit_.exit_code, "signal": exit_.signal}}
            if isinstance(exc, DriverError):
                raise exc
            log.error("local exec: unexpected %s from the driver", type(exc).__name__, exc_info=exc)
            raise RuntimeFailureError(
                "the driver failed unexpectedly during a local exec; see the plugin's log for details",
                runtime_message=self._redactor.redact(f"{type(exc).__name__}: {exc}"),
                details={"rpc": "LocalExec"},
            )

        @staticmethod
        async def _hangup(sock: socket.socket) -> None:
            """Returns when the host closes its end (or sends anything at all, which is not allowed)."""
            loop = asyncio.get_running_loop()
            with contextlib.suppress(OSError):
                await loop.sock_recv(sock, 1)

    async def local_exec(
        path: str,
        machine_id: str,
        spec: ExecSpec,
        stdio: tuple[int, int, int],
        *,
        expected_pid: int = 0,
        what: str = "the plugin",
    ) -> ExecExit:
        """The host side: run one exec on a plugin's local exec socket ``path`` with ``stdio`` passed to it.

        The listener must be ``expected_pid`` when given (the plugin process), and our own uid in any case.
        Cancelling the call closes the connection, which kills the command. Errors are the plugin's (a
        ``DriverError``), or ``UnavailableError`` when the socket is unusable or the plugin went away.
        """
        loop = asyncio.get_running_loop()
        sock = unix_socket(nonblocking=True)
        try:
            try:
                await loop.sock_connect(sock, path)
            except OSError as exc:
                raise UnavailableError(
                    f"{what}: cannot connect to its local exec socket {path}: {exc.strerror or exc}",
                    details={"path": path},
                ) from None
            pid, uid, _gid = peer_credentials(sock)
            if uid != os.geteuid() or (expected_pid and pid != expected_pid):
                raise UnavailableError(
                    f"{what}: its local exec socket {path} is served by process {pid} (uid {uid}), not by the plugin "
                    f"(pid {expected_pid or '?'}, uid {os.geteuid()}); refusing to pass it descriptors",
                    details={"path": path, "peer_pid": str(pid), "peer_uid": str(uid)},
                )
            request = {
                "exec": {
                    "machine_id": machine_id,
                    "argv": list(spec.argv),
                    "user": spec.user,
                    "workdir": spec.workdir,
                    "environment": dict(spec.environment),
                }
            }
            try:
                await send_json(sock, request, stdio)
                kind, payload, fds = await recv_message(sock, max_fds=0)
            except (EOFError, FramingError, OSError) as exc:
                raise UnavailableError(
                    f"{what} ended the local exec without an answer ({type(exc).__name__}: {exc}); "
                    "was the plugin stopped?",
                    details={"path": path},
                ) from None
            for fd in fds:
                os.close(fd)
            return _answer(kind, payload, what)
        finally:
            sock.close()


def _answer(kind: int, payload: bytes, what: str) -> ExecExit:
    try:
        doc: Mapping[str, Any] = json.loads(payload) if kind == KIND_JSON else {}
    except ValueError:
        doc = {}
    if isinstance(doc, dict) and isinstance(exit_ := doc.get("exit"), dict):
        code, sig = exit_.get("exit_code"), exit_.get("signal") or ""
        if isinstance(code, int) and not isinstance(code, bool) and isinstance(sig, str):
            return ExecExit(code, sig)
    if isinstance(doc, dict) and "error" in doc:
        raise _error_from_doc(doc["error"])
    raise RuntimeFailureError(f"{what} answered a local exec with a malformed message (protocol violation)")
