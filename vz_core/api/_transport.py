"""The transport boundary of the client: one call = one ``CallStream``; errors mapped to ``ApiError`` here, once.

A ``CallStream`` yields the call's messages as tuples, in order: ``("progress", dict)``, ``("event", dict)``,
``("output", stream, bytes)``, and finally ``("result", dict)``; a failure raises ``ApiError`` (the daemon's
error object, or UNAVAILABLE when the connection broke). Input for Exec goes through ``send``/``close_stdin``/
``resize``/``signal``; ``cancel`` asks for cancellation (the final message still follows); ``close`` hangs up.

``LocalTransport`` speaks the local wire through ``vz_core.wire.connect`` (standard library only: no grpc, no
protobuf); ``GrpcTransport`` (``vz_core.api._grpc_transport``) speaks vz.api.v1 over gRPC and converts to the
same dicts.
"""

from __future__ import annotations

from vz_core.api._errors import ApiError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Protocol

    from vz_core.wire import Connection

    class CallStream(Protocol):
        """One running call (see the module docstring)."""

        def receive(self) -> tuple[Any, ...]:
            """The call's next message; raises ApiError for the call's error."""

        def send(self, stream: int, data: bytes) -> None:
            """Input bytes for ``stream`` (0 stdin, 3 terminal)."""

        def close_stdin(self) -> None:
            """No more input."""

        def resize(self, rows: int, cols: int) -> None:
            """The terminal's new size."""

        def signal(self, name: str) -> None:
            """Deliver a signal (``"SIGINT"``) to the command."""

        def cancel(self) -> None:
            """Ask the daemon to cancel the call (its final message still follows)."""

        def fileno(self) -> int:
            """A descriptor readable when ``receive`` has something (io.UnsupportedOperation over gRPC)."""

        def close(self) -> None:
            """Hang up (a running call is cancelled)."""

    class Transport(Protocol):
        """Starts calls; ``fds`` ride with the call (local transport only)."""

        name: str

        def start(self, method: str, request: Mapping[str, Any], fds: Sequence[int] = ()) -> CallStream:
            """Send the call; its stream."""

        def close(self) -> None:
            """Release what the transport holds (a gRPC channel)."""


__all__ = ["LocalCall", "LocalTransport", "drain"]


def drain(stream: CallStream) -> dict[str, Any]:
    """Read a call to its end; its result (progress, events and output are dropped)."""
    while True:
        message = stream.receive()
        if message[0] == "result":
            result: dict[str, Any] = message[1]
            return result


def _api_error(exc: BaseException) -> ApiError:
    """The one mapping of a local-wire failure (``vz_core.wire.DaemonError``, OSError) to ApiError."""
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        return ApiError(
            code,
            getattr(exc, "message", None) or str(exc),
            str(getattr(exc, "kind", "backend_failure")),
            int(getattr(exc, "exit_code", 1)),
            getattr(exc, "details", None),
        )
    return ApiError(
        "UNAVAILABLE",
        f"the connection to the vz daemon failed: {exc}; see `vz daemon status`",
        "backend_failure",
        1,
    )


class LocalCall:
    """A call on one local-wire connection (``vz_core.wire.Connection``)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._done = False

    def receive(self) -> tuple[Any, ...]:
        if self._done:
            raise ApiError("FAILED_PRECONDITION", "this call already ended", "backend_failure", 1)
        try:
            message = self.connection.receive()
        except Exception as exc:
            self._done = True
            raise _api_error(exc) from None
        if message is None:
            self._done = True
            raise ApiError(
                "UNAVAILABLE",
                f"the vz daemon (pid {self.connection.pid}) closed the connection before the call ended; see "
                "`vz daemon logs`",
                "backend_failure",
                1,
            )
        if isinstance(message, tuple):
            return ("output", message[0], message[1])
        for key in ("progress", "event", "result"):
            if key in message:
                if key == "result":
                    self._done = True
                value = message[key]
                return (key, value if isinstance(value, dict) else {})
        if "error" in message:
            self._done = True
            error = message["error"]
            raise ApiError.from_wire(error if isinstance(error, dict) else {})
        raise ApiError("UNKNOWN", f"the vz daemon sent an unexpected message: {sorted(message)}", "backend_failure", 1)

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.connection.send(message)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon ended the call already: receive() reads its final message (the reason)
        except OSError as exc:
            raise _api_error(exc) from None

    def send(self, stream: int, data: bytes) -> None:
        try:
            self.connection.write(stream, data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # as in _send: the call's end is still to be read
        except OSError as exc:
            raise _api_error(exc) from None

    def close_stdin(self) -> None:
        self._send({"stdin_close": {}})

    def resize(self, rows: int, cols: int) -> None:
        self._send({"resize": {"rows": rows, "cols": cols}})

    def signal(self, name: str) -> None:
        self._send({"signal": {"name": name}})

    def cancel(self) -> None:
        self.connection.cancel()

    def fileno(self) -> int:
        return self.connection.fileno()

    def close(self) -> None:
        self._done = True
        self.connection.close()


class LocalTransport:
    """The local wire (the CLI's path): one connection per call through ``vz_core.wire.connect``."""

    name = "local"

    def __init__(self, home: str | None = None, socket: str | None = None, autostart: bool | None = None) -> None:
        self.home = home
        self.socket = socket
        self.autostart = autostart

    def connect(self) -> Connection:
        from vz_core.wire import connect

        try:
            return connect(self.home, autostart=self.autostart, socket=self.socket)
        except Exception as exc:
            raise _api_error(exc) from None

    def start(self, method: str, request: Mapping[str, Any], fds: Sequence[int] = ()) -> LocalCall:
        connection = self.connect()
        try:
            connection.call(method, request, fds)
        except BaseException as exc:
            connection.close()
            if isinstance(exc, Exception):
                raise _api_error(exc) from None
            raise
        return LocalCall(connection)

    def close(self) -> None:
        """Nothing is held between calls."""
