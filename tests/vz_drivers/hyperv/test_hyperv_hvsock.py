"""The host end of the agent's Hyper-V socket, against an AF_HYPERV stand-in that behaves as documented.

Microsoft's "Make your own integration services" lists the Winsock calls Hyper-V sockets take (socket, bind,
listen, accept, connect, send, recv); a socket timeout is not among them: CPython implements one as a
non-blocking connect plus ``select``. The stand-in refuses both (as an unsupported operation), blocks in
``connect`` until its VM accepts, and ends a blocked connect when the socket is closed, as closesocket does.
"""

from __future__ import annotations

import threading

import pytest

from vz_drivers.hyperv._driver import _connect_hvsock

VM = "5f3c2c1e-2a4b-4c6d-8e9f-0a1b2c3d4e5f"
SERVICE = "00000400-facb-11e6-bd58-64006a7986d3"


class HvSocketStandin:
    """An AF_HYPERV stream socket: blocking connect only, no timeout, no non-blocking mode, no select."""

    def __init__(self, accept: threading.Event, *, refuse: bool = False) -> None:
        self._accept = accept
        self._refuse = refuse
        self._closed = threading.Event()
        self.connected_to: tuple[str, str] | None = None
        self.closed = False

    def settimeout(self, _value: float | None) -> None:
        raise OSError(10045, "The attempted operation is not supported for the type of object referenced")

    def setblocking(self, flag: bool) -> None:
        if not flag:
            raise OSError(10045, "The attempted operation is not supported for the type of object referenced")

    def fileno(self) -> int:  # select() on it is not supported
        raise OSError(10038, "select is not supported on this Hyper-V socket stand-in")

    def connect(self, address: tuple[str, str]) -> None:
        while not self._accept.wait(0.01):
            if self._closed.is_set():
                raise OSError(10004, "A blocking operation was interrupted by a call to WSACancelBlockingCall")
        if self._refuse:
            raise ConnectionRefusedError(10061, "No connection could be made because the target refused it")
        self.connected_to = address

    def close(self) -> None:
        self.closed = True
        self._closed.set()


def test_connect_blocks_in_a_thread_and_returns_the_connected_socket() -> None:
    accept = threading.Event()
    standin = HvSocketStandin(accept)
    threading.Timer(0.2, accept.set).start()  # the agent starts listening a little later
    sock = _connect_hvsock(VM, SERVICE, deadline=30.0, new_socket=lambda: standin)  # type: ignore[arg-type,return-value]
    assert sock is standin and standin.connected_to == (VM, SERVICE) and not standin.closed


def test_a_connect_past_its_deadline_is_abandoned_and_the_socket_closed() -> None:
    standin = HvSocketStandin(threading.Event())  # the VM never accepts
    with pytest.raises(TimeoutError, match=f"Hyper-V socket of VM {VM} did not finish within 0.3 s"):
        _connect_hvsock(VM, SERVICE, deadline=0.3, new_socket=lambda: standin)  # type: ignore[arg-type,return-value]
    assert standin.closed
    assert not any(t.name == "vz-hvsock-connect" for t in threading.enumerate())  # the blocked connect ended


def test_a_refused_connect_raises_and_closes() -> None:
    accept = threading.Event()
    accept.set()
    standin = HvSocketStandin(accept, refuse=True)
    with pytest.raises(ConnectionRefusedError):
        _connect_hvsock(VM, SERVICE, deadline=30.0, new_socket=lambda: standin)  # type: ignore[arg-type,return-value]
    assert standin.closed
