"""Where a vz daemon lives, and the checks that keep its directory private.

For a state home ``H`` (``VZ_HOME``, else ``$XDG_STATE_HOME/vz``, else ``~/.local/state/vz``: the rule of
``vz_core.paths.state_dir``) the daemon directory is ``H/daemon/`` (mode 0700, owned by the user, not a
symbolic link). It holds:

- ``vz.sock``: the listening socket (``VZ_DAEMON_SOCKET=/abs/path`` moves it; that path's parent must be a
  0700 directory owned by the user, created if missing);
- ``daemon.json``: the pid file ``{"pid", "version", "fingerprint", "socket", "started", "proc_start"}``,
  written atomically (``proc_start`` is the process's start time in clock ticks since boot, from
  ``/proc/<pid>/stat``: with the command line it tells a live daemon from a reused pid);
- ``daemon.log`` (+ ``daemon.log.1``): the daemon's log, size-capped;
- ``daemon.lock``: held by a running daemon for its whole life (a second daemon for the same home waits);
- ``start.lock``: held by a client while it decides whether to start a daemon (two racing CLIs start one);
- ``grpc.sock``: the private socket of the gRPC front (behind the main socket).

On Windows the endpoint is no file: ``socket`` is the daemon's named pipe, ``\\\\.\\pipe\\vz-<user>-<digest of
the home>`` (``vz_core.platform.pipes``: a security descriptor admitting only the user, the first instance created
exclusively); ``VZ_DAEMON_SOCKET`` may name another pipe (``\\\\.\\pipe\\<name>``).

A directory owned by someone else, a symbolic link, or one others may write to is refused (``DaemonError``,
exit 2, naming the path and what to do); a directory of ours others may only read or enter is fixed to 0700.

The state home itself (which the user may have made) is not changed: one others may write to is refused
(``state_home_problem``, checked by the CLI and by the daemon at start), one others may read or enter is warned
about, both naming the fix (``chmod 700 <home>``). What vz keeps in it is private whatever the home's mode: at
start the daemon makes ``drivers/``, ``locks/`` and ``cache/`` (0700) before any driver writes below them, fixes
its own directories there to 0700 and the state database and its -wal/-shm to 0600 (``secure_state_home``); the
store creates the database 0600.

Imported on the CLI's hot path: standard library only.
"""

from __future__ import annotations

import os
import stat
import sys

from vz_core.wire._frames import DaemonError

TYPE_CHECKING = False  # `typing` itself costs milliseconds on the CLI's hot path
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "DaemonPaths",
    "check_private_dir",
    "daemon_paths",
    "ensure_private_dir",
    "live_daemon",
    "proc_start_ticks",
    "read_pid_file",
    "secure_state_home",
    "state_home_problem",
    "write_pid_file",
]

PRIVATE_CHILDREN = ("daemon", "drivers", "locks", "config", "cache")
"""The directories vz makes under the state home: kept 0700 whatever the home's own mode."""
CREATED_CHILDREN = ("drivers", "locks", "cache")
"""Made (0700) when the daemon starts: drivers keep their state and vz its caches below them."""
STATE_FILES = ("state.db", "state.db-wal", "state.db-shm", "state.db-journal")

SOCKET_ENV = "VZ_DAEMON_SOCKET"
if sys.platform == "win32":
    NOFOLLOW = 0
else:
    NOFOLLOW = os.O_NOFOLLOW
"""``O_NOFOLLOW`` (``vz_core.platform.files.NOFOLLOW``, spelled here: that module is not on the CLI's hot path)."""


class DaemonPaths:
    """The files of one daemon (plain strings: this is on the CLI's hot path)."""

    __slots__ = ("directory", "grpc_socket", "home", "lock_file", "log_file", "pid_file", "socket", "start_lock")

    def __init__(self, home: str, socket: str | None = None) -> None:
        self.home = os.path.abspath(home)
        self.directory = os.path.join(self.home, "daemon")
        if sys.platform == "win32":  # the daemon's named pipe (vz_core.platform.pipes): no socket file
            self.socket = socket or _default_pipe(self.home)
        else:
            self.socket = socket or os.path.join(self.directory, "vz.sock")
        self.pid_file = os.path.join(self.directory, "daemon.json")
        self.log_file = os.path.join(self.directory, "daemon.log")
        self.lock_file = os.path.join(self.directory, "daemon.lock")
        self.start_lock = os.path.join(self.directory, "start.lock")
        self.grpc_socket = os.path.join(self.directory, "grpc.sock")

    @property
    def socket_dir(self) -> str:
        """The directory holding the socket (the daemon directory unless ``VZ_DAEMON_SOCKET`` moved it)."""
        return os.path.dirname(self.socket)

    def __repr__(self) -> str:
        return f"DaemonPaths(home={self.home!r}, socket={self.socket!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DaemonPaths) and (self.home, self.socket) == (other.home, other.socket)

    def __hash__(self) -> int:
        return hash((self.home, self.socket))


def _default_pipe(home: str) -> str:
    """Windows: the daemon pipe of ``home`` for this user (``vz_core.platform.pipes.pipe_name``)."""
    import getpass

    from vz_core.platform.pipes import pipe_name

    return pipe_name(getpass.getuser(), home)


def _state_home(environ: Mapping[str, str]) -> str:
    home = environ.get("VZ_HOME")
    if home:
        return home
    xdg = environ.get("XDG_STATE_HOME")
    if xdg:
        return os.path.join(xdg, "vz")
    return os.path.join(os.path.expanduser("~"), ".local", "state", "vz")


def daemon_paths(home: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> DaemonPaths:
    """The paths of the daemon for ``home`` (default: the state home of ``environ``, default ``os.environ``).

    ``VZ_DAEMON_SOCKET`` in ``environ`` moves the socket; it must be an absolute path (``DaemonError``).
    """
    env = os.environ if environ is None else environ
    base = os.fspath(home) if home is not None else _state_home(env)
    custom = env.get(SOCKET_ENV) or None
    if sys.platform == "win32" and custom is not None:
        from vz_core.platform.pipes import PIPE_PREFIX

        if not custom.startswith(PIPE_PREFIX) or len(custom) == len(PIPE_PREFIX) or "\\" in custom[len(PIPE_PREFIX) :]:
            raise DaemonError(
                f"{SOCKET_ENV}={custom!r} is not a named pipe; on Windows set it to {PIPE_PREFIX}<name>, or unset it",
                code="INVALID_ARGUMENT",
                kind="user_error",
                exit_code=2,
            )
    elif custom is not None and not os.path.isabs(custom):
        raise DaemonError(
            f"{SOCKET_ENV}={custom!r} is not an absolute path; set it to a socket path inside a private (0700) "
            "directory of yours, or unset it",
            code="INVALID_ARGUMENT",
            kind="user_error",
            exit_code=2,
        )
    return DaemonPaths(base, custom)


def _refuse(path: str, why: str) -> DaemonError:
    return DaemonError(
        f"refusing the vz daemon directory {path}: {why}",
        code="PERMISSION_DENIED",
        kind="user_error",
        exit_code=2,
    )


if sys.platform == "win32":

    def _check_windows_dir(path: str) -> None:
        st = os.lstat(path)
        if st.st_file_attributes & stat.FILE_ATTRIBUTE_REPARSE_POINT:
            raise _refuse(path, "it is a symbolic link or junction; remove it (vz creates this directory itself)")
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(path, "it is not a directory; remove it (vz creates this directory itself)")

    def check_private_dir(path: str) -> bool:
        """Whether ``path`` exists as a directory of vz's (``DaemonError`` for a link, junction or file).

        Windows: the directory's ACL is not inspected (it inherits the user profile's, which admits the user,
        SYSTEM and Administrators); what keeps other users from the daemon is its pipe's own descriptor.
        """
        try:
            _check_windows_dir(path)
        except FileNotFoundError:
            return False
        return True

    def ensure_private_dir(path: str) -> None:
        """Create ``path`` (parents as needed) or check that it is a real directory (not a link or junction)."""
        os.makedirs(path, exist_ok=True)
        _check_windows_dir(path)

else:

    def _check_stat(path: str, st: os.stat_result, *, fix_fd: int | None) -> None:
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(path, "it is a symbolic link; remove it (vz creates this directory itself)")
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(path, "it is not a directory; remove it (vz creates this directory itself)")
        uid = os.geteuid()
        if st.st_uid != uid:
            raise _refuse(path, f"it is owned by uid {st.st_uid}, not by you (uid {uid}); remove it or fix its owner")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            raise _refuse(
                path,
                f"others may write to it (mode {mode:04o}); remove it (vz re-creates it with mode 0700) or "
                f"`chmod 700 {path}` after checking its contents",
            )
        if mode & 0o077:
            if fix_fd is None:
                raise _refuse(path, f"its mode is {mode:04o}, not 0700; `chmod 700 {path}`")
            os.fchmod(fix_fd, 0o700)

    def check_private_dir(path: str) -> bool:
        """Whether ``path`` exists as a private directory (``DaemonError`` if it exists but is not private).

        The client's check before it connects: a socket in a directory others control could be anyone's.
        """
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            ensure_private_dir(path)  # fixes a mode others may only read or enter; refuses a writable one
            return True
        _check_stat(path, st, fix_fd=None)
        return True

    def ensure_private_dir(path: str) -> None:
        """Create ``path`` (mode 0700, parents as needed) or check that it is private; fix group/other bits.

        ``DaemonError`` for a symbolic link, a non-directory, a foreign owner or a group/world-writable mode.
        """
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, mode=0o700, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # ELOOP (a symbolic link) or ENOTDIR: lstat says which
            _check_stat(path, os.lstat(path), fix_fd=None)
            raise
        try:
            _check_stat(path, os.fstat(fd), fix_fd=fd)
        finally:
            os.close(fd)


def proc_start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (None if there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields after the last ")" are fixed.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return None


def _is_daemon_cmdline(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    if b"vz_core.daemon" in argv:  # python -m vz_core.daemon
        return True
    # `vz daemon run` in the foreground: the console script followed by these two words
    return any(argv[i : i + 2] == [b"daemon", b"run"] for i in range(1, len(argv) - 1))


def read_pid_file(paths: DaemonPaths) -> dict[str, Any] | None:
    """The pid file's record, or None when it is missing or unreadable (a damaged one counts as stale)."""
    import json

    try:
        with open(paths.pid_file, "rb") as f:
            record = json.loads(f.read(65536))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int) or record["pid"] <= 0:
        return None
    return record


def live_daemon(paths: DaemonPaths) -> dict[str, Any] | None:
    """The pid file's record if it names a live vz daemon process, else None (no file, or a stale one).

    Live means: the process exists, its start time is the recorded ``proc_start`` and its command line is
    a vz daemon's (``python -m vz_core.daemon`` or ``vz daemon run``); a reused pid fails the first two.
    """
    record = read_pid_file(paths)
    if record is None:
        return None
    pid = record["pid"]
    started = proc_start_ticks(pid)
    if started is None or started != record.get("proc_start") or not _is_daemon_cmdline(pid):
        return None
    return record


def write_pid_file(paths: DaemonPaths, record: Mapping[str, Any]) -> None:
    """Write the pid file atomically (a private temporary file renamed over it)."""
    import json

    tmp = f"{paths.pid_file}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dict(record), f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, paths.pid_file)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def state_home_problem(home: str | None = None, environ: Mapping[str, str] | None = None) -> tuple[bool, str] | None:
    """``(refuse, message)`` when other users may write to (refuse) or read or enter (warn) the state home
    (default: ``environ``'s, as ``daemon_paths`` finds it); None when it is private or does not exist yet."""
    where = home if home is not None else _state_home(os.environ if environ is None else environ)
    try:
        st = os.stat(where)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None  # creating the daemon directory reports it
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        return True, (
            f"the vz state directory {where} (VZ_HOME) is writable by other users (mode {mode:04o}): they could "
            f"replace its state database and its drivers' records; `chmod 700 {where}` (or choose another VZ_HOME)"
        )
    if mode & 0o077:
        return False, (
            f"the vz state directory {where} (VZ_HOME) may be read or entered by other users (mode {mode:04o}); "
            f"vz keeps its files in it private (0600, 0700), but `chmod 700 {where}` keeps their names too"
        )
    return None


def secure_state_home(home: str) -> None:
    """Refuse a state home others may write to (``DaemonError``); make vz's own directories in it 0700 and the
    state database files 0600 (only entries of ours; symbolic links are never followed)."""
    problem = state_home_problem(home)
    if problem is not None and problem[0]:
        raise DaemonError(problem[1], code="PERMISSION_DENIED", kind="user_error", exit_code=2)
    for name in CREATED_CHILDREN:  # before a driver makes them with its own (umask) mode
        try:
            os.mkdir(os.path.join(home, name), 0o700)
        except OSError:
            pass
    if sys.platform == "win32":  # modes are ACLs there: the files inherit the profile's (see check_private_dir)
        return
    uid = os.geteuid()
    for name, wanted, directory in [(n, 0o700, True) for n in PRIVATE_CHILDREN] + [
        (n, 0o600, False) for n in STATE_FILES
    ]:
        flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if directory else os.O_NONBLOCK)
        try:
            fd = os.open(os.path.join(home, name), flags)
        except OSError:
            continue  # absent, a link, or not what it should be: nothing of ours to fix
        try:
            st = os.fstat(fd)
            if st.st_uid == uid and stat.S_IMODE(st.st_mode) & 0o077 and (directory or stat.S_ISREG(st.st_mode)):
                os.fchmod(fd, wanted)
        except OSError:
            pass
        finally:
            os.close(fd)
