"""Helpers of the ``exec_local`` tests (a driver's or a plugin's): host descriptors handed to a command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from vz_core import ExecExit, ExecSpec

ExecLocal = Callable[[str, ExecSpec, tuple[int, int, int]], Awaitable[ExecExit]]
"""``exec_local(machine_id, spec, (stdin, stdout, stderr))``."""


@contextlib.contextmanager
def opened(*targets: tuple[str | Path, int]) -> Iterator[list[int]]:
    """Descriptors of ``targets`` (path, os.open flags), closed afterwards."""
    fds: list[int] = []
    try:
        for path, flags in targets:
            fds.append(os.open(path, flags | os.O_CLOEXEC, 0o600))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


async def cat_through_pipes(
    exec_local: ExecLocal, machine: str, data: bytes, *argv: str
) -> tuple[ExecExit, bytes, bytes]:
    """Feed ``data`` to ``argv`` (default ``cat``) in ``machine`` through pipes; its exit, stdout and stderr.

    The spec's workspace id is a placeholder: ``exec_local``'s machine argument is the one that counts.
    """
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    got: dict[str, bytes] = {}

    def feed() -> None:
        with os.fdopen(in_w, "wb") as f, contextlib.suppress(BrokenPipeError):
            f.write(data)

    def drain(fd: int, key: str) -> None:
        with os.fdopen(fd, "rb") as f:
            got[key] = f.read()

    threads = [
        threading.Thread(target=feed),
        threading.Thread(target=drain, args=(out_r, "out")),
        threading.Thread(target=drain, args=(err_r, "err")),
    ]
    for t in threads:
        t.start()
    spec = ExecSpec(workspace_id="ignored: machine_id wins", argv=argv or ("cat",))
    try:
        exit_ = await exec_local(machine, spec, (in_r, out_w, err_w))
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    for t in threads:
        await asyncio.to_thread(t.join)
    return exit_, got["out"], got["err"]
