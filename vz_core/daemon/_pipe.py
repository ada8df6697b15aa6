"""Windows: the daemon's listener on its named pipe (``vz_core.platform.pipes``), on the proactor loop.

``PipeListener(name)`` creates the pipe's first instance (``FILE_FLAG_FIRST_PIPE_INSTANCE``, the
owner-only security descriptor of this process's user): ``DaemonError`` when the name is taken. ``accept()``
waits for a client on the listening instance (overlapped ``ConnectNamedPipe`` through the loop's IOCP
proactor), makes the next listening instance at once (so the name never disappears while the daemon lives:
a client finding every instance busy waits for one) and returns the connected one. The caller checks the
client (``admit``) before reading a byte.

``AsyncPipeChannel`` is the local wire's ``AsyncChannel`` over a connected instance: the framing is
``AsyncChannel``'s, the byte I/O overlapped ``ReadFile``/``WriteFile`` on the proactor (what CPython's own
``asyncio.windows_events.PipeServer`` and ``IocpProactor.recv_into``/``send`` do for pipe handles). A pipe
carries no descriptors, and only the local wire: the typed API (gRPC) is not served over it
(docs/daemon.md, "Windows").
"""

from __future__ import annotations

import sys
from typing import Any

from vz_core.wire import AsyncChannel, DaemonError, WireError

__all__ = ["PIPE_HOST"]

PIPE_HOST = sys.platform == "win32"
"""Whether the daemon's endpoint is a named pipe (Windows) instead of a Unix socket."""

if sys.platform == "win32":
    import asyncio
    from asyncio.windows_utils import PipeHandle
    from collections.abc import Sequence

    from vz_core.platform.pipes import client_refusal, create_pipe, current_sid, owner_only_sddl
    from vz_core.platform.win32 import pipe_client

    __all__ += ["AsyncPipeChannel", "PipeListener", "admit"]

    _ERROR_NO_DATA = 232

    def _proactor() -> Any:
        """The running loop's IOCP proactor (the object CPython's ``start_serving_pipe`` itself uses)."""
        proactor = getattr(asyncio.get_running_loop(), "_proactor", None)
        if proactor is None:
            raise DaemonError(
                "the vz daemon needs asyncio's proactor event loop on Windows (the default); "
                "unset any event loop policy that selects another",
                code="FAILED_PRECONDITION",
                kind="backend_failure",
                exit_code=1,
            )
        return proactor

    class PipeListener:
        """The daemon's named pipe: its listening instance and the owner-only descriptor of new ones."""

        def __init__(self, name: str) -> None:
            self.name = name
            self.own_sid = current_sid()
            self.sddl = owner_only_sddl(self.own_sid)
            try:
                self._listening: PipeHandle | None = PipeHandle(create_pipe(name, self.sddl, first=True))
            except PermissionError:
                raise DaemonError(
                    f"the named pipe {name} exists already: another vz daemon serves this state home, or "
                    "another program took the name; `vz daemon status` shows a daemon, else end the program "
                    "holding the pipe",
                    code="ALREADY_EXISTS",
                    kind="conflict",
                    exit_code=4,
                ) from None

        async def accept(self) -> PipeHandle:
            """The next connected instance (a new listening one is already in place when it returns)."""
            while True:
                pipe = self._listening
                if pipe is None:
                    raise OSError(f"the pipe {self.name} is closed")
                try:
                    await _proactor().accept_pipe(pipe)  # ERROR_PIPE_CONNECTED counts as connected there
                except OSError as exc:
                    if getattr(exc, "winerror", None) != _ERROR_NO_DATA:
                        raise
                    # A client that connected and left before ConnectNamedPipe ran: that instance is spent.
                    pipe.close()
                    self._listening = PipeHandle(create_pipe(self.name, self.sddl, first=False))
                    continue
                self._listening = PipeHandle(create_pipe(self.name, self.sddl, first=False))
                return pipe

        def close(self) -> None:
            """Close the listening instance (the name goes once the connected ones are closed too)."""
            pipe, self._listening = self._listening, None
            if pipe is not None:
                pipe.close()

    def admit(pipe: PipeHandle, own_sid: str) -> tuple[int, str | None]:
        """(client pid, refusal or None) of a connected instance: only our own user is admitted."""
        try:
            pid, sid = pipe_client(pipe.fileno())
        except OSError:
            return 0, client_refusal(0, None, own_sid)
        return pid, client_refusal(pid, sid, own_sid)

    class AsyncPipeChannel(AsyncChannel):
        """The local wire over a connected instance of the daemon's pipe (owns it)."""

        def __init__(self, pipe: PipeHandle) -> None:  # no super().__init__: it would set a socket non-blocking
            self.pipe = pipe
            self._loop = asyncio.get_running_loop()
            self._send_lock = asyncio.Lock()
            self._asyncio = asyncio
            self._iocp = _proactor()

        def fileno(self) -> int:
            """The pipe instance's handle."""
            return self.pipe.fileno()

        async def _recv_into(self, view: memoryview) -> int:
            try:
                return int(await self._iocp.recv_into(self.pipe, view))
            except (BrokenPipeError, ConnectionResetError):
                return 0  # the client closed its end

        async def peek(self, n: int = 4) -> bytes:
            """Not used on a pipe (it carries only the local wire, never HTTP/2)."""
            raise WireError("the daemon's pipe carries only the local wire")

        async def _exact(self, n: int) -> bytes:
            buf = bytearray(n)
            view = memoryview(buf)
            got = 0
            while got < n:
                k = await self._recv_into(view[got:])
                if not k:
                    raise WireError("the connection closed in the middle of a message")
                got += k
            return bytes(buf)

        async def _header_bytes(self, n: int) -> tuple[bytes, list[int]]:
            buf = bytearray(n)
            k = await self._recv_into(memoryview(buf))
            return bytes(buf[:k]), []

        async def _sendall(self, data: bytes, fds: Sequence[int]) -> None:
            if fds:
                raise WireError("a named pipe cannot carry file descriptors")
            view = memoryview(data)
            while view:
                sent = int(await self._iocp.send(self.pipe, view))
                view = view[sent:]

        def close(self) -> None:
            """Close the pipe instance (idempotent)."""
            self.pipe.close()
