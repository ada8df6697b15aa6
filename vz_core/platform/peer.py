"""Who is on the other end of a local connection.

Linux: ``SO_PEERCRED`` (``struct ucred``: pid, uid, gid, in our pid namespace). macOS: ``LOCAL_PEERCRED`` at
``SOL_LOCAL`` (``struct xucred``: version, uid, group count, groups) and ``LOCAL_PEERPID``. Windows: the client
process of a named pipe (``GetNamedPipeClientProcessId``) and the user SID of that process's token, see
``vz_core.platform.win32``.
"""

from __future__ import annotations

import _socket  # not `socket` (nor struct or typing): the CLI's hot path (vz exec) has none of them
import sys

__all__ = ["parse_ucred", "parse_xucred", "peer_credentials"]
# peer_credentials exists where Unix sockets do (not on Windows: there a local endpoint is a named pipe).

UCRED_SIZE = 12
"""struct ucred: int pid, uid, gid."""
XUCRED_SIZE = 76
"""struct xucred (sys/ucred.h): u_int cr_version; uid_t cr_uid; short cr_ngroups (+2 padding);
gid_t cr_groups[16]."""
XUCRED_VERSION = 0
SOL_LOCAL = 0
LOCAL_PEERCRED = 0x001
LOCAL_PEERPID = 0x002


def _int(raw: bytes, at: int, size: int = 4, *, signed: bool = False) -> int:
    return int.from_bytes(raw[at : at + size], sys.byteorder, signed=signed)


def parse_ucred(raw: bytes) -> tuple[int, int, int]:
    """(pid, uid, gid) of the bytes ``SO_PEERCRED`` returns."""
    if len(raw) < UCRED_SIZE:
        raise OSError(f"SO_PEERCRED returned {len(raw)} bytes, not a struct ucred")
    return _int(raw, 0, signed=True), _int(raw, 4), _int(raw, 8)


def parse_xucred(raw: bytes) -> tuple[int, int]:
    """(uid, primary gid) of the ``struct xucred`` bytes ``LOCAL_PEERCRED`` returns.

    Raises ``OSError`` for a truncated struct, an unknown version or a peer with no groups: the caller treats
    the peer as unknown, never as a match.
    """
    if len(raw) < 16:
        raise OSError(f"LOCAL_PEERCRED returned {len(raw)} bytes, fewer than a struct xucred with one group")
    version = _int(raw, 0)
    if version != XUCRED_VERSION:
        raise OSError(f"LOCAL_PEERCRED returned a struct xucred of version {version}, not {XUCRED_VERSION}")
    ngroups = _int(raw, 8, 2, signed=True)
    if not 1 <= ngroups <= 16 or len(raw) < 12 + 4 * ngroups:
        raise OSError(f"LOCAL_PEERCRED returned {ngroups} groups in {len(raw)} bytes")
    return _int(raw, 4), _int(raw, 12)


if sys.platform == "linux":

    def peer_credentials(sock: _socket.socket) -> tuple[int, int, int]:
        """(pid, uid, gid) of the peer of a connected Unix socket (``SO_PEERCRED``; the pid in our namespace)."""
        return parse_ucred(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, UCRED_SIZE))

elif sys.platform != "win32":

    def peer_credentials(sock: _socket.socket) -> tuple[int, int, int]:
        """(pid, uid, gid) of the peer of a connected Unix socket: ``LOCAL_PEERCRED`` (uid, gid) and
        ``LOCAL_PEERPID`` (macOS)."""
        uid, gid = parse_xucred(sock.getsockopt(SOL_LOCAL, LOCAL_PEERCRED, XUCRED_SIZE))
        return _int(sock.getsockopt(SOL_LOCAL, LOCAL_PEERPID, 4), 0, signed=True), uid, gid
