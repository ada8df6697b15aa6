"""A Machine's main process: started by RunImage/Start, running until Stop, Delete or recreation.

Its stdout and stderr share one pipe; a daemon thread copies that pipe into the Machine's ``log`` file and
keeps the file bounded (it never grows past twice the retained size before being cut back to its tail). A
thread rather than a task because the process outlives the call that started it, and the event loop of that
call (in-process users may run each operation in a fresh loop). The thread reaches the Machine directory
through a directory descriptor, so a Machine renamed away for deletion or recreation never receives output
from a process that belonged to its predecessor.

Another process (a relaunched plugin) stops a main process through the pid and start time kept in the
Machine record, so a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil

from ._exec import Launch, kill_group, spawn

__all__ = ["LOG_NAME", "MainProcess", "append_log", "read_log_tail", "start_main_process", "stop_main_process"]

LOG_NAME = "log"
_READ_SIZE = 65536


@dataclass(frozen=True)
class MainProcess:
    """Identity of a running main process (its pid is also its process group id)."""

    pid: int
    create_time: float


def start_main_process(launch: Launch, machine_dir: Path, *, keep: int) -> MainProcess | None:
    """Start ``launch`` with its merged output appended to ``machine_dir/log``; None when it cannot start.

    A command that cannot start leaves a ``vz-fake:`` line in the log instead.
    """
    read_fd, write_fd = os.pipe()
    try:
        proc = spawn(launch, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd)
    except OSError as exc:
        os.close(read_fd)
        append_log(machine_dir, f"vz-fake: cannot start the main process {launch.argv[0]!r}: {exc.strerror}\n")
        return None
    finally:
        os.close(write_fd)
    # The process cannot be reaped before the copier thread starts, so its start time is still readable.
    identity = MainProcess(proc.pid, psutil.Process(proc.pid).create_time())
    dir_fd = os.open(machine_dir, os.O_RDONLY | os.O_DIRECTORY)
    threading.Thread(
        target=_copy_output, args=(proc, read_fd, dir_fd, keep), name=f"vz-fake-main-{proc.pid}", daemon=True
    ).start()
    return identity


def stop_main_process(pid: int, create_time: float) -> None:
    """SIGKILL the main process's group, unless the pid now belongs to an unrelated process."""
    if not pid:
        return
    try:
        leader_started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        # The leader is gone. A pid is not reused while a process group still carries it, so whatever
        # remains in group ``pid`` belongs to this main process.
        kill_group(pid)
        return
    if leader_started == create_time:
        kill_group(pid)


def append_log(machine_dir: Path, text: str) -> None:
    """Append a line of the fake's own to the Machine's log."""
    fd = os.open(machine_dir / LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        _write_all(fd, text.encode())
    finally:
        os.close(fd)


def read_log_tail(machine_dir: Path, keep: int) -> bytes:
    """The last ``keep`` bytes of the Machine's log (empty when there is none)."""
    try:
        with open(machine_dir / LOG_NAME, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - keep))
            return log.read(keep)
    except FileNotFoundError:
        return b""


def _copy_output(proc: subprocess.Popen[bytes], read_fd: int, dir_fd: int, keep: int) -> None:
    log_fd = -1
    try:
        with open(read_fd, "rb", buffering=0) as pipe:
            with contextlib.suppress(OSError):  # the Machine directory is already gone: just drain
                log_fd = _open_log(dir_fd)
            size = os.fstat(log_fd).st_size if log_fd >= 0 else 0
            while data := pipe.read(_READ_SIZE):
                if log_fd < 0:
                    continue
                try:
                    _write_all(log_fd, data)
                    size += len(data)
                    if size > 2 * keep:
                        os.close(log_fd)
                        log_fd = -1
                        size = _cut_to_tail(dir_fd, keep)
                        log_fd = _open_log(dir_fd)
                except OSError:
                    if log_fd >= 0:
                        os.close(log_fd)
                    log_fd = -1
    finally:
        if log_fd >= 0:
            os.close(log_fd)
        os.close(dir_fd)
        proc.wait()


def _open_log(dir_fd: int) -> int:
    return os.open(LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600, dir_fd=dir_fd)


def _cut_to_tail(dir_fd: int, keep: int) -> int:
    """Replace the log by its last ``keep`` bytes (atomically); returns the new size."""
    src = os.open(LOG_NAME, os.O_RDONLY, dir_fd=dir_fd)
    try:
        size = os.fstat(src).st_size
        os.lseek(src, max(0, size - keep), os.SEEK_SET)
        tail = b""
        while len(tail) < keep and (chunk := os.read(src, keep - len(tail))):
            tail += chunk
    finally:
        os.close(src)
    tmp = f".{LOG_NAME}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
    try:
        _write_all(fd, tail)
    finally:
        os.close(fd)
    os.replace(tmp, LOG_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    return len(tail)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
