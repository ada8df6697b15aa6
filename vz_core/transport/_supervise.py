"""The plugin supervisor: a tiny process that owns a plugin's whole process tree (PROTOCOL.md §7).

Run by the host as ``python -I -S`` with arguments ``CTL_FD EXEC_FD CLEANUP_DIR -- ARGV...`` (imported as a
top-level module so its bytecode is cached; it never imports vz). It

* runs in a session of its own (the host starts it so), so a signal to the host's process group
  (``kill -9 -- -PGID``, ``timeout -s KILL``, job control) does not reach it: it outlives the host just long
  enough to see the host die (end of file on the control socket, whose other end only the host holds; or
  SIGHUP through PR_SET_PDEATHSIG) and kill everything;
* marks itself child subreaper (Linux) so orphaned descendants of the plugin are reparented to it;
* forks the plugin into a new session (its own process group) under PR_SET_PDEATHSIG(SIGKILL), so the plugin
  dies with its supervisor however that dies, and executes it: through ``EXEC_FD`` when it is not -1 (the
  verified, sealed copy the host hashed: ``fexecve``), else by path ``ARGV[0]``;
* reports on the control socket ``CTL_FD`` (a socketpair with the host): ``pid N`` once the plugin runs
  (or ``execfail ERRNO MESSAGE``), then ``exit CODE SIGNUM`` at the end (SIGNUM 0: it exited by itself);
* obeys the host on the same socket: ``term GRACE`` (SIGTERM to the plugin's group, SIGKILL after GRACE
  seconds) and ``kill``; end of file on the socket means the host died: everything is killed at once;
* when the plugin exits, for whatever reason, kills every process left in the plugin's session (Linux: every
  process whose session id is the plugin's, found in /proc; elsewhere: the process group), reaps them,
  removes ``CLEANUP_DIR`` (the socket directory; "-" for none) and exits with the plugin's status.

A backend process that must outlive the plugin (a VM monitor tracked by the driver's own state) detaches
explicitly by starting a new session (``setsid``/``start_new_session=True``); nothing else survives. So a
driver runs its commands in their own process *group* (``process_group=0``), never in a new session.

Startup cost is the point of its shape: only builtin/C modules are imported (``_signal`` rather than
``signal``, whose enums pull in ``re``; ``_ctypes`` rather than ``ctypes``; no ``shutil``), so the supervisor
is running in about the time of a bare ``python -I -S``.
"""

from __future__ import annotations

import _signal as signal  # type: ignore[import-not-found]
import errno
import os
import select
import sys

# POSIX only (fork, sessions, prctl): on Windows the host supervises a plugin with a kill-on-close Job Object
# instead (vz_core/transport/_windows.py) and never runs this file. mypy skips the rest of it for win32.
assert sys.platform != "win32", "the POSIX plugin supervisor does not run on Windows (see _windows.py)"

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _log(message: str) -> None:
    try:
        os.write(2, f"vz-supervisor: {message}\n".encode())
    except OSError:
        pass


def _prctl(option: int, value: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    import _ctypes

    class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "i"

    class _Func(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = _Int

    prctl = _Func(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"))  # type: ignore[arg-type,unused-ignore]
    if prctl(option, value, 0, 0, 0) != 0:
        _log(f"prctl({option}, {value}) failed")


def _rmtree(path: str) -> None:
    """Remove a directory tree without following symlinks (``shutil`` costs milliseconds to import)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                _rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def _session_members(sid: int) -> list[int]:
    """Every process in session ``sid`` (Linux /proc scan); [] elsewhere."""
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp session ...": comm may contain anything, so split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(entry))
    return members


class Supervisor:
    def __init__(self, ctl: int, exec_fd: int, cleanup: str, argv: list[str]) -> None:
        self.ctl = ctl
        self.exec_fd = exec_fd
        self.cleanup = cleanup
        self.argv = argv
        self.pid = 0
        self.status: tuple[int, int] | None = None
        self.parent = os.getppid()
        self.ctl_buf = b""
        self.ctl_open = True

    def send(self, line: str) -> None:
        if not self.ctl_open:
            return
        try:
            os.write(self.ctl, (line + "\n").encode())
        except OSError:
            self.ctl_open = False

    def spawn(self) -> bool:
        err_r, err_w = os.pipe()  # close-on-exec: EOF means the exec succeeded
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(err_r)
                os.close(self.ctl)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
                    signal.signal(sig, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                os.setsid()
                # The plugin dies with its supervisor, however the supervisor dies (checked after the
                # prctl: the supervisor may have died in between).
                _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != supervisor:
                    os._exit(127)
                if self.exec_fd >= 0:
                    os.execve(self.exec_fd, self.argv, os.environ)
                else:
                    os.execv(self.argv[0], self.argv)
            except OSError as exc:
                os.write(err_w, f"{exc.errno or 0} {exc.strerror or exc}".encode())
            except BaseException as exc:
                os.write(err_w, f"0 {exc}".encode())
            os._exit(127)
        os.close(err_w)
        self.pid = pid
        if self.exec_fd >= 0:
            os.close(self.exec_fd)
        report = b""
        while True:
            try:
                chunk = os.read(err_r, 4096)
            except InterruptedError:
                continue
            if not chunk:
                break
            report += chunk
        os.close(err_r)
        if report:
            code, _, message = report.decode(errors="replace").partition(" ")
            self.send(f"execfail {code} {message}")
            return False
        self.send(f"pid {pid}")
        return True

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            if pid == self.pid and self.status is None:
                if os.WIFSIGNALED(status):
                    self.status = (-os.WTERMSIG(status), os.WTERMSIG(status))
                else:
                    self.status = (os.waitstatus_to_exitcode(status), 0)

    def kill_tree(self) -> None:
        """SIGKILL the plugin's group and session until nothing of it is left; reap what is ours."""
        for _ in range(200):
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            members = _session_members(self.pid)
            for member in members:
                try:
                    os.kill(member, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self.reap()
            if not members and self.status is not None:
                return
            select.select([], [], [], 0.01)

    def terminate(self, grace: float) -> None:
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        self.wait_plugin(grace)

    def wait_plugin(self, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while self.status is None:
            self.reap()
            left = deadline - time.monotonic()
            if self.status is not None or left <= 0:
                return
            select.select([self.wakeup_r], [], [], min(left, 0.05))
            self.drain_wakeup()

    def drain_wakeup(self) -> None:
        try:
            while os.read(self.wakeup_r, 512):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def read_ctl(self) -> list[str]:
        try:
            chunk = os.read(self.ctl, 4096)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            chunk = b""
        if not chunk:
            self.ctl_open = False
            return ["eof"]
        self.ctl_buf += chunk
        lines = self.ctl_buf.split(b"\n")
        self.ctl_buf = lines.pop()
        return [line.decode(errors="replace") for line in lines]

    def run(self) -> int:
        self.wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(self.wakeup_r, False)
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        pending: list[int] = []
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda num, _frame: pending.append(int(num)))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the host to handle
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGHUP)
        if os.getppid() != self.parent:
            return 1  # the host died before we could watch it
        devnull = os.open(os.devnull, os.O_WRONLY)
        if not self.spawn():
            return 127
        # Only the plugin writes the handshake: our copy of stdout must not keep the host's pipe open.
        os.dup2(devnull, 1)
        os.close(devnull)
        os.set_blocking(self.ctl, False)
        action = ""
        grace = 0.0
        while self.status is None and not action:
            select.select([self.ctl, self.wakeup_r], [], [], 1.0)
            self.drain_wakeup()
            self.reap()
            while pending:
                num = pending.pop()
                if num == signal.SIGTERM:
                    action, grace = "term", 2.0
                elif num == signal.SIGHUP:
                    action = "kill"
            for line in self.read_ctl():
                cmd, _, arg = line.partition(" ")
                if cmd == "eof" or cmd == "kill":
                    action = "kill"
                elif cmd == "term":
                    action, grace = "term", float(arg or 2.0)
            if os.getppid() != self.parent:
                action = "kill"
        if action == "term" and self.status is None:
            self.terminate(grace)
        self.kill_tree()
        if self.cleanup != "-":
            _rmtree(self.cleanup)
        code, signum = self.status or (-signal.SIGKILL, signal.SIGKILL)
        self.send(f"exit {code} {signum}")
        return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        _log("usage: _supervise.py CTL_FD EXEC_FD CLEANUP_DIR -- ARGV...")
        return 2
    try:
        ctl, exec_fd = int(argv[0]), int(argv[1])
    except ValueError:
        _log("CTL_FD and EXEC_FD must be integers")
        return 2
    try:
        return Supervisor(ctl, exec_fd, argv[2], argv[4:]).run()
    except OSError as exc:
        _log(f"failed: {exc}")
        if exc.errno == errno.EAGAIN:
            return 75
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
