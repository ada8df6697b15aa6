"""The VM helper's control protocol and the VM logic behind it, independent of the framework.

The helper process (``_helper``) owns one ``VZVirtualMachine``. The plugin talks to it over a private Unix
socket (``<machine>/run/control.sock``, in a 0700 directory the guest never sees) with **JSON lines**: one
request object per line, one response per request, in order::

    -> {"id": 1, "op": "state"}
    <- {"id": 1, "ok": true, "state": "running", "save_restore": true}
    -> {"id": 2, "op": "stop", "timeout": 30}
    <- {"id": 2, "ok": true, "state": "stopped", "forced": false}
    -> {"id": 3, "op": "bogus"}
    <- {"id": 3, "ok": false, "error": "unknown op 'bogus'; use one of start, stop, state, save, restore"}

Ops: ``start`` (boot, or ``restore`` a saved state file first when given), ``stop`` (``requestStop``, wait up to
``timeout`` seconds for the guest to power off, then ``stop``), ``state``, ``save`` (pause, save the state to
``path``, stop: macOS 14+), ``restore`` (a stopped VM from ``path``, then resume). Lines are at most
``MAX_LINE`` bytes. ``VmController`` holds the logic over any object with the framework's method names, so
this host tests it with a stand-in; every framework call goes through ``dispatch`` (the VM's queue).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "MAX_LINE",
    "OPS",
    "STATES",
    "ControlError",
    "ControlServer",
    "VmController",
    "complete",
    "decode",
    "encode",
    "listen_private",
    "on_queue",
]

MAX_LINE = 64 * 1024
OPS = ("start", "stop", "state", "save", "restore")
STATES = {
    0: "stopped",
    1: "running",
    2: "paused",
    3: "error",
    4: "starting",
    5: "pausing",
    6: "resuming",
    7: "stopping",
    8: "saving",
    9: "restoring",
}
"""``VZVirtualMachineState`` values."""
_CALL_LIMIT = 600.0
_T = TypeVar("_T")


class ControlError(Exception):
    """A request the VM could not carry out (the text goes back in ``error``)."""


def encode(message: dict[str, Any]) -> bytes:
    line = json.dumps(message, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise ValueError(f"control message of {len(line)} bytes exceeds {MAX_LINE}")
    return line


def decode(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE:
        raise ValueError(f"control line of {len(line)} bytes exceeds {MAX_LINE}")
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError("a control message is a JSON object")
    return value


def _text(error: Any) -> str:
    describe = getattr(error, "localizedDescription", None)
    return str(describe()) if callable(describe) else str(error)


def on_queue(dispatch: Callable[[Callable[[], None]], None], fn: Callable[[], _T], limit: float = _CALL_LIMIT) -> _T:
    """``fn()`` run on the VM's queue through ``dispatch``; its result, or what it raised.

    Apple's ``VZVirtualMachine`` documentation: the VM's methods and properties must be used on its queue (the
    main queue here), and that includes making it and a ``VZMacOSInstaller`` for it."""
    done: Future[_T] = Future()

    def run() -> None:
        try:
            done.set_result(fn())
        except BaseException as exc:
            done.set_exception(exc)

    dispatch(run)
    return done.result(timeout=limit)


def complete(
    dispatch: Callable[[Callable[[], None]], None],
    start: Callable[[Callable[..., None]], None],
    what: str,
    limit: float = _CALL_LIMIT,
) -> Any:
    """Run ``start(handler)`` on the VM's queue and wait for the framework to call ``handler``.

    Handlers get ``(error)`` or ``(result, error)``; a non-None error raises ``ControlError``; the result (or
    None) is returned.
    """
    done: Future[Any] = Future()

    def handler(*results: Any) -> None:
        error = results[-1] if results else None
        if error is not None:
            done.set_exception(ControlError(f"{what} failed: {_text(error)}"))
        else:
            done.set_result(results[0] if len(results) > 1 else None)

    dispatch(lambda: start(handler))
    try:
        return done.result(timeout=limit)
    except TimeoutError:
        raise ControlError(f"{what} did not finish within {limit:g} s") from None


class VmController:
    """start/stop/state/save/restore of one VM. ``dispatch(fn)`` runs ``fn`` on the VM's queue; completion
    handlers may run on any thread. ``url(path)`` makes the framework's file URL."""

    def __init__(
        self,
        vm: Any,
        *,
        dispatch: Callable[[Callable[[], None]], None],
        url: Callable[[str], Any],
        save_restore: bool,
        stopped: threading.Event | None = None,
    ) -> None:
        self._vm = vm
        self._dispatch = dispatch
        self._url = url
        self.save_restore = save_restore
        self.stopped = stopped or threading.Event()
        """Set when the VM stopped (guest power-off, ``stop``, an error): the helper then exits."""
        self._lock = threading.Lock()

    # -- calls on the VM's queue

    def _on_queue(self, fn: Callable[[], Any]) -> Any:
        return on_queue(self._dispatch, fn)

    def _completion(self, start: Callable[[Callable[..., None]], None], what: str) -> None:
        complete(self._dispatch, start, what)

    def state(self) -> str:
        return STATES.get(int(self._on_queue(self._vm.state)), "unknown")

    # -- ops

    def start(self, restore: str = "") -> str:
        with self._lock:
            if restore:
                return self._restore(restore)
            if self.state() == "running":
                return "running"
            self._completion(self._vm.startWithCompletionHandler_, "start")
            return self.state()

    def _restore(self, path: str) -> str:
        if not self.save_restore:
            raise ControlError("restoring VM state needs macOS 14 or newer on the host")
        if not os.path.isfile(path):
            raise ControlError(f"no saved state at {path}")
        self._completion(
            lambda h: self._vm.restoreMachineStateFromURL_completionHandler_(self._url(path), h), "restore"
        )
        self._completion(self._vm.resumeWithCompletionHandler_, "resume after restore")
        return self.state()

    def restore(self, path: str) -> str:
        with self._lock:
            return self._restore(path)

    def stop(self, timeout: float) -> tuple[str, bool]:
        """Ask the guest to power off; after ``timeout`` seconds stop the VM. Returns (state, forced)."""
        with self._lock:
            if self.state() == "stopped":
                self.stopped.set()
                return "stopped", False
            asked = self._on_queue(self._request_stop)
            if asked and self.stopped.wait(timeout):
                return "stopped", False
            self._completion(self._vm.stopWithCompletionHandler_, "stop")
            self.stopped.set()
            return self.state(), True

    def _request_stop(self) -> bool:
        if not self._vm.canRequestStop():
            return False
        ok, _error = self._vm.requestStopWithError_(None)
        return bool(ok)

    def save(self, path: str) -> str:
        """Pause, write the VM's state to ``path`` (replacing nothing), stop. The disk stays as it is."""
        with self._lock:
            if not self.save_restore:
                raise ControlError("saving VM state needs macOS 14 or newer on the host")
            if os.path.lexists(path):
                raise ControlError(f"{path} exists; a saved state is never overwritten")
            if self.state() != "paused":
                self._completion(self._vm.pauseWithCompletionHandler_, "pause")
            try:
                self._completion(
                    lambda h: self._vm.saveMachineStateToURL_completionHandler_(self._url(path), h), "save"
                )
            except ControlError:
                with contextlib.suppress(ControlError):
                    self._completion(self._vm.resumeWithCompletionHandler_, "resume after a failed save")
                raise
            self._completion(self._vm.stopWithCompletionHandler_, "stop after save")
            self.stopped.set()
            return self.state()

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request to one response (never raises)."""
        reply: dict[str, Any] = {"id": request.get("id"), "ok": True}
        op = request.get("op")
        try:
            if op == "state":
                reply["state"] = self.state()
                reply["save_restore"] = self.save_restore
            elif op == "start":
                reply["state"] = self.start(str(request.get("restore") or ""))
            elif op == "restore":
                reply["state"] = self.restore(str(request["path"]))
            elif op == "stop":
                reply["state"], reply["forced"] = self.stop(float(request.get("timeout", 30)))
            elif op == "save":
                reply["state"] = self.save(str(request["path"]))
            else:
                raise ControlError(f"unknown op {op!r}; use one of {', '.join(OPS)}")
        except (ControlError, KeyError, ValueError, TypeError) as exc:
            text = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            return {"id": request.get("id"), "ok": False, "error": text}
        return reply


def listen_private(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` created mode 0600 (only this user can connect)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(8)
    return sock


class ControlServer:
    """Serves ``VmController`` on a Unix socket (mode 0600), one thread per connection."""

    def __init__(self, controller: VmController, path: Path) -> None:
        self._controller = controller
        self._path = path
        self._sock = listen_private(path)
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._accept, name="vz-macos-control", daemon=True)
        thread.start()
        return thread

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while True:
                line = reader.readline(MAX_LINE + 1)
                if not line:
                    return
                try:
                    reply = self._controller.handle(decode(line))
                except ValueError as exc:
                    reply = {"id": None, "ok": False, "error": f"bad request: {exc}"}
                try:
                    conn.sendall(encode(reply))
                except OSError:
                    return

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()
        for t in self._threads:
            t.join(timeout=5)
