"""`vz exec` catches its cancelling signals from before it sends the request: with the fd fast path the command
may already write to the caller's stdout while the request is still being answered, and a signal sent then
must cancel the command through the daemon and exit 128+N (not kill vz with the signal's default action)."""

from __future__ import annotations

import os
import signal
import socket
from typing import Any

from vz_core.cli._exec import run_exec


class _Call:
    """An exec call whose result is already waiting on its socket (the command ended at once)."""

    def __init__(self) -> None:
        self._ours, self._theirs = socket.socketpair()
        self._theirs.send(b"r")
        self.sent: list[str] = []

    def fileno(self) -> int:
        return self._ours.fileno()

    def signal(self, name: str) -> None:
        self.sent.append(name)

    def receive(self) -> tuple[str, dict[str, Any]]:
        self._ours.recv(1)
        return ("result", {"exit_code": 0, "signal": ""})

    def close_stdin(self) -> None:
        pass

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        self._ours.close()
        self._theirs.close()


class _Client:
    """Sends us SIGTERM while the request is being made, as a caller reacting to early output would."""

    def __init__(self) -> None:
        self.call = _Call()

    def open_exec(self, argv: list[str], **kwargs: Any) -> _Call:
        os.kill(os.getpid(), signal.SIGTERM)
        return self.call


def test_a_signal_during_the_request_cancels_the_command_and_exits_128_plus_n() -> None:
    escaped: list[int] = []

    def ours(signum: int, frame: object) -> None:
        escaped.append(signum)

    before = signal.signal(signal.SIGTERM, ours)
    try:
        client = _Client()
        status = run_exec(client, context={}, argv=["sleep", "600"], environment=None, machine=None, workdir=None)
        assert escaped == [], "the signal reached the handler in place before vz exec's own"
        assert client.call.sent == ["SIGTERM"]  # the daemon is asked to kill the command
        assert status == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is ours  # the earlier handler is back
    finally:
        signal.signal(signal.SIGTERM, before)
