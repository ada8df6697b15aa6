"""The client side: reach the daemon of a state home, starting it on demand, and hold one call's connection.

``connect(home=None, environ=None, autostart=None)``:

1. the socket's directory must be private (``check_private_dir``) and the listener's ``SO_PEERCRED`` uid ours;
2. hello: both sides send protocol, version, fingerprint and pid; the daemon adds ``busy``;
3. same fingerprint: done. A daemon of a newer vz: ``DaemonError`` saying to use the newer vz or stop it.
   A daemon of an older vz, or of the same vz with other settings (``DAEMON_ENV``): when idle it is asked
   to exit (``System.Shutdown``), its pid is waited for and a new one is started; when busy, ``DaemonError``
   saying what to do;
4. no daemon (no socket, or a socket nobody listens on): with autostart (``VZ_DAEMON_AUTOSTART`` unset or
   not ``0``), ``python -m vz_core.daemon --detach`` is started in a new session with its stdio on the log,
   holding ``start.lock`` so that racing clients start exactly one; the client waits (bounded) for its
   ready line on a pipe. Without autostart: ``DaemonError`` (exit 69) naming ``vz daemon start``.

Stale files need no client-side cleanup: a starting daemon holds ``daemon.lock`` for its life, so whatever
socket or pid file it finds belongs to a dead one and is replaced.

This is the CLI's hot path (``vz exec``): standard library only (``_socket``, ``os``; no ``socket``, ``json``
or ``asyncio`` modules).
"""

from __future__ import annotations

import _socket  # not `socket`: its enums (and `selectors`) cost milliseconds `vz exec` does not have
import os
import sys
import time

from vz_core.wire._frames import Channel, DaemonError, WireError, close_fds
from vz_core.wire._identity import PROTOCOL, compare_versions, fingerprint, version
from vz_core.wire._paths import NOFOLLOW, DaemonPaths, check_private_dir, daemon_paths, ensure_private_dir

if sys.platform != "win32":
    from vz_core.platform.peer import peer_credentials

TYPE_CHECKING = False  # `typing` itself costs milliseconds on the CLI's hot path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from vz_core.wire._frames import Message, Stream

__all__ = ["AUTOSTART_ENV", "START_TIMEOUT", "Connection", "autostart_enabled", "connect"]

AUTOSTART_ENV = "VZ_DAEMON_AUTOSTART"
START_TIMEOUT = 30.0
"""How long a client waits for a daemon it started (or for another client's start) to accept."""
STOP_TIMEOUT = 20.0
"""How long a client waits for a replaced daemon's process to exit."""
_SUN_PATH_MAX = 107


class Connection:
    """One connection to the daemon: hello done, room for exactly one call. Owns the socket.

    ``hello`` is the daemon's hello (``pid``, ``version``, ``fingerprint``, ``busy``); ``paths`` its files.
    """

    def __init__(self, channel: Channel, paths: DaemonPaths, hello: dict[str, Any]) -> None:
        self.channel = channel
        self.paths = paths
        self.hello = hello
        self._called = False

    @property
    def pid(self) -> int:
        """The daemon's process id."""
        pid = self.hello.get("pid")
        return pid if isinstance(pid, int) else 0

    def fileno(self) -> int:
        """The socket's descriptor (for select/poll)."""
        return self.channel.fileno()

    def call(self, method: str, request: Mapping[str, Any] | None = None, fds: Sequence[int] = ()) -> None:
        """Send the call (once per connection); ``fds`` (at most 3) ride with it and stay open here."""
        if self._called:
            raise DaemonError(
                "one call per connection: connect again for another call",
                code="FAILED_PRECONDITION",
                kind="backend_failure",
                exit_code=1,
            )
        self._called = True
        self.channel.send({"call": {"method": method, "request": dict(request or {})}}, fds)

    def send(self, message: Message, fds: Sequence[int] = ()) -> None:
        """Send one message to the running call (``B`` input, ``stdin_close``, ``resize``, ``signal``...)."""
        self.channel.send(message, fds)

    def write(self, stream: int, data: bytes) -> None:
        """Send ``data`` on ``stream`` as ``B`` messages."""
        self.channel.write(stream, data)

    def cancel(self) -> None:
        """Ask the daemon to cancel the call (its final message still follows)."""
        try:
            self.channel.send({"cancel": {}})
        except OSError:
            pass

    def receive(self) -> Message | None:
        """The daemon's next message; None when it closed. Descriptors the daemon sends are closed."""
        got = self.channel.receive()
        if got is None:
            return None
        message, fds = got
        close_fds(fds)
        return message

    def result(
        self,
        on_message: Callable[[Message], None] | None = None,
    ) -> dict[str, Any]:
        """Read until the call's end: its result, or ``DaemonError`` for ``{"error": E}`` or an early close.

        Every other message (progress, event, ``B`` output) goes to ``on_message`` when given.
        """
        while True:
            message = self.receive()
            if message is None:
                raise DaemonError(
                    f"the vz daemon (pid {self.pid}) closed the connection before the call ended; see `vz daemon logs`",
                    code="UNAVAILABLE",
                    kind="backend_failure",
                    exit_code=1,
                )
            if isinstance(message, dict):
                if "result" in message:
                    result = message["result"]
                    return result if isinstance(result, dict) else {}
                if "error" in message:
                    error = message["error"]
                    raise DaemonError.from_wire(error if isinstance(error, dict) else {})
            if on_message is not None:
                on_message(message)

    def request(
        self,
        method: str,
        request: Mapping[str, Any] | None = None,
        fds: Sequence[int] = (),
        on_message: Callable[[Message], None] | None = None,
    ) -> dict[str, Any]:
        """``call`` then ``result``: the whole call on this connection."""
        self.call(method, request, fds)
        return self.result(on_message)

    def close(self) -> None:
        """Close the connection (for a running call this cancels it)."""
        self.channel.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def autostart_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether clients start a daemon on demand: ``VZ_DAEMON_AUTOSTART`` is unset or not ``0``."""
    env = os.environ if environ is None else environ
    return env.get(AUTOSTART_ENV, "").strip() != "0"


def _unavailable(paths: DaemonPaths) -> DaemonError:
    return DaemonError(
        f"no vz daemon runs for {paths.home} (nothing listens on {paths.socket}); start it with "
        f"`vz daemon start` ({AUTOSTART_ENV}=0 keeps commands from starting one)",
    )


def open_socket(paths: DaemonPaths) -> Stream | None:
    """A socket connected to the listener, or None when there is none (no file, or nobody listening).

    Windows: the client end of the daemon's named pipe, once its server is known to run as this user.
    """
    if sys.platform == "win32":
        return _open_pipe(paths)
    else:
        return _open_unix_socket(paths)


if sys.platform != "win32":

    def _open_unix_socket(paths: DaemonPaths) -> _socket.socket | None:
        if not check_private_dir(paths.socket_dir):
            return None
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)  # close-on-exec (PEP 446)
        try:
            if len(os.fsencode(paths.socket)) <= _SUN_PATH_MAX:
                sock.connect(paths.socket)
            else:  # too long for sun_path: through a descriptor of its (checked) directory
                from vz_core.platform.files import long_socket_path

                dir_fd = os.open(paths.socket_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    sock.connect(long_socket_path(dir_fd, os.path.basename(paths.socket)))
                finally:
                    os.close(dir_fd)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return None
        except BaseException:
            sock.close()
            raise
        peer_pid, peer_uid, _gid = peer_credentials(sock)
        if peer_uid != os.geteuid():
            sock.close()
            raise DaemonError(
                f"the socket {paths.socket} is served by uid {peer_uid} (pid {peer_pid}), not by you; "
                "remove it (your own daemon re-creates it)",
                code="PERMISSION_DENIED",
                kind="user_error",
                exit_code=2,
            )
        return sock


if sys.platform == "win32":

    def _open_pipe(paths: DaemonPaths) -> Stream | None:
        from vz_core.platform.pipes import current_sid, open_pipe, pipe_server_pid
        from vz_core.platform.win32 import process_sid

        stream = open_pipe(paths.socket)
        if stream is None:
            return None
        try:
            server_pid = pipe_server_pid(stream.fileno())
            server_sid: str | None = process_sid(server_pid)
        except OSError:
            server_pid, server_sid = 0, None
        except BaseException:
            stream.close()
            raise
        own = current_sid()
        if server_sid != own:
            stream.close()
            raise DaemonError(
                f"the pipe {paths.socket} is served by {server_sid or 'an unknown user'} (pid {server_pid}), "
                f"not by you ({own}); end that program (your own daemon re-creates the pipe)",
                code="PERMISSION_DENIED",
                kind="user_error",
                exit_code=2,
            )
        return stream


def _hello(paths: DaemonPaths, environ: Mapping[str, str]) -> Connection | None:
    """Connect and exchange hellos; None when no daemon answers (none runs, or it is exiting)."""
    sock = open_socket(paths)
    if sock is None:
        return None
    channel = Channel(sock)
    try:
        channel.send(
            {
                "hello": {
                    "protocol": PROTOCOL,
                    "version": version(),
                    "fingerprint": fingerprint(environ),
                    "pid": os.getpid(),
                }
            }
        )
        got = channel.receive()
    except (ConnectionResetError, BrokenPipeError, WireError):
        channel.close()
        return None  # it closed on us: exiting (idle, stopped); the caller starts a new one
    except BaseException:
        channel.close()
        raise
    if got is None:
        channel.close()
        return None
    message, fds = got
    close_fds(fds)
    if "error" in message and isinstance(message, dict):
        channel.close()
        error = message["error"]
        raise DaemonError.from_wire(error if isinstance(error, dict) else {})
    hello = message.get("hello") if isinstance(message, dict) else None
    if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
        channel.close()
        raise DaemonError(
            f"the process behind {paths.socket} does not speak vz's local protocol {PROTOCOL}; "
            "stop it with `vz daemon stop` (or remove the socket if no vz daemon runs)",
            code="FAILED_PRECONDITION",
            kind="user_error",
            exit_code=2,
        )
    return Connection(channel, paths, hello)


def _mismatch(conn: Connection, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """None when the daemon matches this client, else (what to do: "replace"|"newer-daemon", description)."""
    theirs = conn.hello
    if theirs.get("fingerprint") == fingerprint(environ):
        return None
    dv, cv = str(theirs.get("version", "?")), version()
    order = compare_versions(cv, dv)
    if order < 0:
        return "newer-daemon", f"vz {dv}, newer than this vz {cv}"
    if order > 0:
        return "replace", f"vz {dv}, older than this vz {cv}"
    return "replace", (
        f"vz {dv} started with other settings than this command's (interpreter or one of the VZ_DAEMON_*, "
        "VZ_PLUGIN_* and driver variables)"
    )


class _StartLock:
    """``flock`` on ``start.lock``, waited for with a bound (another client may be starting the daemon)."""

    def __init__(self, paths: DaemonPaths, timeout: float) -> None:
        self.paths = paths
        self.timeout = timeout
        self.fd = -1

    def __enter__(self) -> _StartLock:
        from vz_core.platform.locks import lock_file

        ensure_private_dir(self.paths.directory)
        self.fd = os.open(self.paths.start_lock, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        deadline = time.monotonic() + self.timeout
        while True:
            if lock_file(self.fd, blocking=False):
                return self
            else:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise DaemonError(
                        f"another vz has been starting the daemon for {self.paths.home} for {self.timeout:g} s "
                        f"(it holds {self.paths.start_lock}); see `vz daemon logs` and run the command again",
                    ) from None
                time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the lock


def _log_tail(paths: DaemonPaths, lines: int = 5) -> str:
    try:
        with open(paths.log_file, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            tail = f.read().decode("utf-8", "replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return " | ".join(tail)


def _package_root() -> str:
    import vz_core

    return os.path.dirname(os.path.dirname(os.path.abspath(vz_core.__file__ or ".")))


def _spawn(paths: DaemonPaths, environ: Mapping[str, str], timeout: float) -> None:
    """Start a detached daemon for ``paths`` and wait for its ready line (the start lock is held)."""
    import subprocess

    from vz_core.platform.detach import LAUNCHER_EXITS, detach_options, read_line, ready_handoff

    env = dict(environ)
    env["VZ_HOME"] = paths.home
    root = _package_root()  # the daemon runs the same vz_core as this client
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    read_fd, write_fd = os.pipe()
    log_fd = os.open(paths.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600)
    try:
        ready_args, ready_options = ready_handoff(write_fd)
        proc = subprocess.Popen(
            [sys.executable, "-m", "vz_core.daemon", "--detach", *ready_args],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            **ready_options,
            **detach_options(),
            close_fds=True,
            cwd="/",
            env=env,
        )
    finally:
        os.close(write_fd)
        os.close(log_fd)
    try:
        # POSIX: the launched process forks the daemon and exits at once (so the daemon is nobody's child).
        # Windows: the launched process is the daemon, started detached (no fork there).
        first = proc.wait(timeout) if LAUNCHER_EXITS else None
        try:
            line = read_line(read_fd, time.monotonic() + timeout)
        except TimeoutError:
            raise DaemonError(
                f"the vz daemon for {paths.home} did not start within {timeout:g} s; "
                f"see `vz daemon logs` ({paths.log_file})",
            ) from None
        if first is None:
            first = proc.poll()
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise DaemonError(f"the vz daemon launcher for {paths.home} hung; see {paths.log_file}") from None
    finally:
        os.close(read_fd)
    text = line.decode("utf-8", "replace").strip()
    if text.startswith("ready"):
        return
    if text.startswith("error "):
        message = text[len("error ") :]
        if "[Errno 28]" in message or "No space left" in message:
            message += f"; free space on the filesystem of {paths.home} and run the command again"
        raise DaemonError(f"the vz daemon for {paths.home} could not start: {message}")
    tail = _log_tail(paths)
    raise DaemonError(
        f"the vz daemon for {paths.home} exited while starting (launcher status {first})"
        + (f"; its log ends: {tail}" if tail else "")
        + f"; see `vz daemon logs` ({paths.log_file})",
    )


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    if sys.platform != "linux":  # no /proc: a process handle (Windows) or kqueue (macOS) says when it exited
        from vz_core.platform.process import ExitWatch

        try:
            watch = ExitWatch(pid)
        except ProcessLookupError:
            return True
        try:
            while not watch.exited():
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)
            return True
        finally:
            watch.close()
    while os.path.exists(f"/proc/{pid}"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[-1].split()[0] == b"Z":
                    return True  # a zombie: it has exited (its parent reaps it)
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _start_or_replace(paths: DaemonPaths, environ: Mapping[str, str], timeout: float) -> Connection:
    """Under ``start.lock``: connect if a matching daemon runs, replace an idle mismatching one, else start one."""
    with _StartLock(paths, timeout):
        for _ in range(3):
            conn = _hello(paths, environ)
            if conn is not None:
                mismatch = _mismatch(conn, environ)
                if mismatch is None:
                    return conn
                _replace_or_refuse(conn, mismatch)
                continue
            _spawn(paths, environ, timeout)
        conn = _hello(paths, environ)
        if conn is None or _mismatch(conn, environ) is not None:
            if conn is not None:
                conn.close()
            raise DaemonError(f"the vz daemon for {paths.home} started but does not answer; see `vz daemon logs`")
        return conn


def _replace_or_refuse(conn: Connection, mismatch: tuple[str, str]) -> None:
    """Shut an idle mismatching daemon down and wait for it to exit; ``DaemonError`` when it may not be."""
    action, description = mismatch
    home, pid = conn.paths.home, conn.pid
    if action == "newer-daemon":
        conn.close()
        raise DaemonError(
            f"the vz daemon for {home} (pid {pid}) runs {description}; run the newer vz, or stop the daemon "
            "with `vz daemon stop` so that this one starts its own",
            code="FAILED_PRECONDITION",
            kind="user_error",
            exit_code=2,
        )
    if conn.hello.get("busy"):
        conn.close()
        raise DaemonError(
            f"the vz daemon for {home} (pid {pid}) runs {description} and has operations in flight, so it was "
            "not replaced; run the command again when they are done, or stop it with `vz daemon stop` "
            "(running operations get a grace period, then are cancelled)",
            code="FAILED_PRECONDITION",
            kind="conflict",
            exit_code=4,
        )
    try:
        with conn:
            conn.request("System.Shutdown")
    except (DaemonError, OSError):
        pass  # it may close before answering: its exit is what counts
    if not _wait_gone(pid, STOP_TIMEOUT):
        raise DaemonError(
            f"the vz daemon for {home} (pid {pid}) runs {description} and did not exit within {STOP_TIMEOUT:g} s "
            "after being asked to; stop it with `vz daemon stop`",
        )


def connect(
    home: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    autostart: bool | None = None,
    *,
    socket: str | None = None,
    timeout: float = START_TIMEOUT,
) -> Connection:
    """A ``Connection`` to the daemon of ``home`` (default: the state home of ``environ``), hello done.

    ``environ`` (default ``os.environ``) gives the home, ``VZ_DAEMON_SOCKET``, the fingerprint's variables
    and a started daemon's environment; ``socket`` overrides ``VZ_DAEMON_SOCKET``. ``autostart`` None =
    ``VZ_DAEMON_AUTOSTART``. Raises ``DaemonError``
    (``.exit_code``/``.kind`` for the CLI; ``str()`` says what to do).
    """
    env = os.environ if environ is None else environ
    if socket is not None:
        env = {**env, "VZ_DAEMON_SOCKET": socket}
    paths = daemon_paths(home, env)
    start = autostart_enabled(env) if autostart is None else autostart
    conn = _hello(paths, env)
    if conn is not None:
        mismatch = _mismatch(conn, env)
        if mismatch is None:
            return conn
        if not start and mismatch[0] == "replace" and not conn.hello.get("busy"):
            conn.close()
            raise DaemonError(
                f"the vz daemon for {paths.home} (pid {conn.pid}) runs {mismatch[1]}; replace it with "
                f"`vz daemon stop` and `vz daemon start` ({AUTOSTART_ENV}=0 keeps this command from doing it)",
            )
        if mismatch[0] != "replace" or conn.hello.get("busy"):
            _replace_or_refuse(conn, mismatch)  # raises
        conn.close()
    if not start:
        raise _unavailable(paths)
    return _start_or_replace(paths, env, timeout)


def stop_daemon(
    home: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    timeout: float = STOP_TIMEOUT,
) -> int | None:
    """Stop the daemon of ``home``: ``System.Shutdown`` (or SIGTERM when it does not answer), then SIGKILL
    after ``timeout`` seconds. The pid that was stopped, or None when no daemon ran.

    Operations in flight get the daemon's shutdown grace period, then are cancelled. A pid is signalled only
    while the pid file's record still names a live daemon (never a reused pid).
    """
    import signal

    from vz_core.wire._paths import live_daemon

    env = os.environ if environ is None else environ
    paths = daemon_paths(home, env)
    record = live_daemon(paths)
    conn = _hello(paths, env)
    if conn is not None:
        pid = conn.pid
        try:
            with conn:
                conn.request("System.Shutdown")
        except (DaemonError, OSError):
            pass
    elif record is not None:
        pid = record["pid"]
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return None
    else:
        return None
    if _wait_gone(pid, timeout):
        return pid
    still = live_daemon(paths)
    if still is not None and still["pid"] == pid:
        try:
            if sys.platform == "win32":
                os.kill(pid, signal.SIGTERM)  # TerminateProcess
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return pid
        if _wait_gone(pid, 5.0):
            return pid
    raise DaemonError(f"the vz daemon for {paths.home} (pid {pid}) did not exit; kill it and run the command again")
