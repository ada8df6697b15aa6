"""Who is on the other end of a local connection.

Linux: ``SO_PEERCRED`` (``struct ucred``: pid, uid, gid, in our pid namespace). macOS: ``LOCAL_PEERCRED`` at
``SOL_LOCAL`` (``struct xucred``: version, uid, group count, groups) and ``LOCAL_PEERPID``. Windows: the client
process of a named pipe (``GetNamedPipeClientProcessId``) and the user SID of that process's token, see
``vz_core.platform._win32``.
"""

from __future__ import annotations

import socket
import struct
import sys
from typing import NamedTuple

__all__ = ["PeerCredentials", "parse_ucred", "parse_xucred", "peer_credentials"]
# peer_credentials exists where Unix sockets do (not on Windows: there a local endpoint is a named pipe).


class PeerCredentials(NamedTuple):
    """The peer of a local connection: its process id, user and primary group (POSIX ids; on Windows ``uid``
    is -1 and ``sid`` names the user)."""

    pid: int
    uid: int
    gid: int
    sid: str = ""


_UCRED = struct.Struct("3i")
# struct xucred (sys/ucred.h): u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t cr_groups[16].
_XUCRED = struct.Struct("=IIh2x16I")
XUCRED_VERSION = 0
SOL_LOCAL = 0
LOCAL_PEERCRED = 0x001
LOCAL_PEERPID = 0x002


def parse_ucred(raw: bytes) -> tuple[int, int, int]:
    """(pid, uid, gid) of the bytes ``SO_PEERCRED`` returns."""
    pid, uid, gid = _UCRED.unpack(raw[: _UCRED.size])
    return int(pid), int(uid), int(gid)


def parse_xucred(raw: bytes) -> tuple[int, int]:
    """(uid, primary gid) of the ``struct xucred`` bytes ``LOCAL_PEERCRED`` returns.

    Raises ``OSError`` for a truncated struct, an unknown version or a peer with no groups: the caller treats
    the peer as unknown, never as a match.
    """
    if len(raw) < _XUCRED.size - 16 * 4 + 4:
        raise OSError(f"LOCAL_PEERCRED returned {len(raw)} bytes, fewer than a struct xucred with one group")
    padded = raw[: _XUCRED.size].ljust(_XUCRED.size, b"\0")
    version, uid, ngroups, *groups = _XUCRED.unpack(padded)
    if version != XUCRED_VERSION:
        raise OSError(f"LOCAL_PEERCRED returned a struct xucred of version {version}, not {XUCRED_VERSION}")
    if not 1 <= ngroups <= 16:
        raise OSError(f"LOCAL_PEERCRED returned {ngroups} groups")
    return int(uid), int(groups[0])


if sys.platform == "linux":

    def peer_credentials(sock: socket.socket) -> PeerCredentials:
        """The peer of a connected Unix socket (``SO_PEERCRED``)."""
        return PeerCredentials(*parse_ucred(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)))

elif sys.platform != "win32":

    def peer_credentials(sock: socket.socket) -> PeerCredentials:
        """The peer of a connected Unix socket: ``LOCAL_PEERCRED`` (uid, gid) and ``LOCAL_PEERPID`` (macOS and
        the BSDs)."""
        uid, gid = parse_xucred(sock.getsockopt(SOL_LOCAL, LOCAL_PEERCRED, _XUCRED.size))
        pid = int.from_bytes(sock.getsockopt(SOL_LOCAL, LOCAL_PEERPID, 4), sys.byteorder, signed=True)
        return PeerCredentials(pid, uid, gid)
