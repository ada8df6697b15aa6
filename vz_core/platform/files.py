"""Descriptors and files whose calls differ between hosts: pipe sizes, sealed memory files, extended
attributes, and reaching a Unix socket whose path is longer than ``sun_path`` through its directory."""

from __future__ import annotations

import os
import sys

__all__ = [
    "BINARY",
    "NOFOLLOW",
    "NONBLOCK",
    "PIPE_RESIZABLE",
    "SEALED_MEMFD",
    "XATTRS",
    "get_pipe_size",
    "long_socket_path",
    "low_on_space",
    "memfd_sealed_copy",
    "nonblocking_pipe",
    "open_directory",
    "open_path_nofollow",
    "physical_memory",
    "seal_memfd",
    "set_pipe_size",
    "set_xattr",
    "socket_path_in",
    "status_flags",
    "write_at",
]

if sys.platform != "win32":

    def status_flags(fd: int) -> int:
        """The file status flags of ``fd`` (``F_GETFL``: access mode, ``O_APPEND``, ``O_NONBLOCK``, ...)."""
        import fcntl

        return int(fcntl.fcntl(fd, fcntl.F_GETFL))


if sys.platform == "win32":
    NOFOLLOW = 0
    """``O_NOFOLLOW`` where it exists. Windows has none: ``os.open`` follows a symbolic link (making one needs
    the create-symbolic-link privilege or developer mode there), and callers that refuse links check
    ``os.lstat`` for a reparse point instead."""
    NONBLOCK = 0
    """``O_NONBLOCK`` where it exists (opening a FIFO or device without blocking); Windows has none."""
    BINARY = os.O_BINARY
    """``O_BINARY`` on Windows (no newline translation); 0 elsewhere, where there is none to turn off."""
else:
    NOFOLLOW = os.O_NOFOLLOW
    NONBLOCK = os.O_NONBLOCK
    BINARY = 0

SUN_PATH_MAX = 107 if sys.platform == "linux" else 103
"""The longest socket path ``bind``/``connect`` take (``sun_path`` less its terminating NUL)."""


def socket_path_in(dir_fd: int, path: str) -> str:
    """What to bind or connect for the socket ``path`` inside the (checked) directory open at ``dir_fd``:
    on Linux always through the descriptor (no race with a swapped directory, no ``sun_path`` limit); elsewhere
    the path itself, which must fit ``sun_path`` (``OSError`` naming the limit otherwise)."""
    name = os.path.basename(path)
    if sys.platform == "linux":
        return long_socket_path(dir_fd, name)
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        return long_socket_path(dir_fd, name)
    return path


PIPE_RESIZABLE = sys.platform == "linux"
"""Whether a pipe's buffer can be resized (``F_GETPIPE_SZ``/``F_SETPIPE_SZ``, Linux)."""
SEALED_MEMFD = sys.platform == "linux"
"""Whether sealed memory files exist (``memfd_create`` + ``F_ADD_SEALS``, Linux)."""
XATTRS = sys.platform == "linux"
"""Whether ``set_xattr`` sets extended attributes (Linux; elsewhere image layers' xattrs are not applied)."""


if sys.platform == "linux":

    def nonblocking_pipe() -> tuple[int, int]:
        """A pipe whose two ends are non-blocking (and close-on-exec), in one system call."""
        return os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def get_pipe_size(fd: int) -> int | None:
        """The buffer size of the pipe ``fd``; None when it is not a pipe."""
        import fcntl  # here: the CLI's hot path imports this module without needing fcntl

        try:
            return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
        except OSError:
            return None

    def set_pipe_size(fd: int, size: int) -> int:
        """Grow the pipe ``fd`` to ``size`` bytes; its new size (``OSError`` when refused)."""
        import fcntl

        return int(fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size))

    def memfd_sealed_copy(name: str) -> int:
        """A new close-on-exec memory file that can be sealed (``seal_memfd``) once written."""
        return os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)

    def seal_memfd(fd: int) -> None:
        """Seal the memory file ``fd``: no more writes, no growing or shrinking, no more seals."""
        import fcntl

        fcntl.fcntl(
            fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        )

    def set_xattr(path: str, name: str, value: bytes) -> None:
        """Set the extended attribute ``name`` of ``path``."""
        os.setxattr(path, name, value)

    def open_path_nofollow(path: str | os.PathLike[str]) -> int | None:
        """An ``O_PATH | O_NOFOLLOW`` descriptor of ``path`` itself (a socket or a link is opened, not followed:
        ``fstat`` tells which, and ``long_socket_path(fd, "")`` reaches exactly that inode)."""
        return os.open(path, os.O_PATH | os.O_NOFOLLOW)

    def open_directory(path: str | os.PathLike[str]) -> int:
        """A descriptor of the directory ``path`` for reaching names inside it (``O_PATH``: no read permission
        needed)."""
        return os.open(path, os.O_PATH | os.O_DIRECTORY)

    def long_socket_path(dir_fd: int, name: str) -> str:
        """A path that reaches ``name`` inside the directory open at ``dir_fd`` whatever the directory's path
        length (``/proc/self/fd/N/name``)."""
        return f"/proc/self/fd/{dir_fd}/{name}"

else:

    def get_pipe_size(fd: int) -> int | None:
        """None: pipes here have a fixed buffer."""
        return None

    def set_pipe_size(fd: int, size: int) -> int:
        """Pipes here have a fixed buffer: ``OSError``; check ``PIPE_RESIZABLE`` first."""
        raise OSError(f"pipes on {sys.platform} cannot be resized")

    def memfd_sealed_copy(name: str) -> int:
        """No memory files here: ``OSError``; check ``SEALED_MEMFD`` first (the caller makes a private copy)."""
        raise OSError(f"{sys.platform} has no sealed memory files")

    def seal_memfd(fd: int) -> None:
        """No memory files here: ``OSError``; check ``SEALED_MEMFD`` first."""
        raise OSError(f"{sys.platform} has no sealed memory files")

    def set_xattr(path: str, name: str, value: bytes) -> None:
        """Extended attributes of image layers are Linux file capabilities: ``OSError`` elsewhere (the caller
        runs without them, as on a filesystem without xattrs)."""
        raise OSError(f"extended attribute {name} is not applied on {sys.platform}")

    def open_path_nofollow(path: str | os.PathLike[str]) -> int | None:
        """None: there is no ``O_PATH`` here (the caller checks with ``lstat`` and connects by path)."""
        return None

    def long_socket_path(dir_fd: int, name: str) -> str:
        """There is no ``/proc/self/fd`` here: ``OSError`` naming the limit (keep the path short: VZ_HOME)."""
        raise OSError(f"the socket path of {name!r} is longer than this host's sun_path allows; use a shorter VZ_HOME")

    if sys.platform != "win32":  # POSIX without Linux's extras (macOS)

        def nonblocking_pipe() -> tuple[int, int]:
            """A pipe whose two ends are non-blocking (and close-on-exec, PEP 446)."""
            read_end, write_end = os.pipe()
            os.set_blocking(read_end, False)
            os.set_blocking(write_end, False)
            return read_end, write_end

        def open_directory(path: str | os.PathLike[str]) -> int:
            """A descriptor of the directory ``path`` (read-only: there is no ``O_PATH`` here)."""
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def write_at(fd: int, data: bytes, offset: int) -> None:
    """Write ``data`` at ``offset`` of ``fd`` (``pwrite``; Windows has none: a seek, then a write)."""
    if sys.platform == "win32":
        os.lseek(fd, offset, os.SEEK_SET)
        os.write(fd, data)
    else:
        os.pwrite(fd, data, offset)


def low_on_space(directory: str | os.PathLike[str], low: int) -> bool:
    """Whether the filesystem of ``directory`` has fewer than ``low`` bytes free for us, or (POSIX) no free
    inode; False when it cannot be asked. POSIX: ``statvfs``; Windows: ``GetDiskFreeSpaceExW``
    (``shutil.disk_usage``)."""
    if sys.platform == "win32":
        import shutil

        try:
            return shutil.disk_usage(directory).free < low
        except OSError:
            return False
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < low or (st.f_files > 0 and st.f_favail == 0)


def physical_memory() -> int | None:
    """The host's physical memory in bytes, None when it cannot be read. POSIX: ``sysconf``; Windows:
    ``GlobalMemoryStatusEx``."""
    if sys.platform == "win32":
        import ctypes
        from ctypes import wintypes

        class _MemoryStatus(ctypes.Structure):
            _fields_ = [
                ("dwLength", wintypes.DWORD),
                ("dwMemoryLoad", wintypes.DWORD),
                ("ullTotalPhys", ctypes.c_ulonglong),
                ("ullAvailPhys", ctypes.c_ulonglong),
                ("ullTotalPageFile", ctypes.c_ulonglong),
                ("ullAvailPageFile", ctypes.c_ulonglong),
                ("ullTotalVirtual", ctypes.c_ulonglong),
                ("ullAvailVirtual", ctypes.c_ulonglong),
                ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
            ]

        status = _MemoryStatus()
        status.dwLength = ctypes.sizeof(_MemoryStatus)
        if not ctypes.WinDLL("kernel32").GlobalMemoryStatusEx(ctypes.byref(status)):
            return None
        return int(status.ullTotalPhys)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
