"""Terminal sessions of the fake driver: a pseudo-terminal on the host (``vz_plugins.terminal.host_terminal``).

The command runs like an exec (same user, working directory and environment rules), as the leader of a new
session whose controlling terminal is the pseudo-terminal. The ``pty-*`` fault modes each break one rule of
``Driver.terminal``; the conformance suite's ``pty`` cases catch each of them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from vz_plugins.terminal import host_terminal

from vz_core import (
    TERMINAL_COLS,
    TERMINAL_ROWS,
    ExecExit,
    TerminalData,
    TerminalEvent,
    TerminalInput,
    TerminalOutput,
    TerminalResize,
    TerminalSpec,
)
from vz_core.errors import PermissionDeniedError

from ._exec import Launch, netns_prefix, setpriv_prefix

__all__ = ["run_terminal"]

_DROP_AFTER = 64 * 1024
"""Bytes of output delivered intact before the ``pty-drops-output`` fault starts dropping chunks."""


async def _filtered_input(keys: AsyncIterator[TerminalInput], faults: frozenset[str]) -> AsyncIterator[TerminalInput]:
    async for item in keys:
        if isinstance(item, TerminalResize) and "pty-ignores-resize" in faults:
            continue
        if isinstance(item, TerminalData) and "pty-drops-ctrl-d" in faults:
            data = item.data.replace(b"\x04", b"")
            if not data:
                continue
            item = TerminalData(data)
        yield item


async def run_terminal(
    spec: TerminalSpec,
    launch: Launch,
    keys: AsyncIterator[TerminalInput],
    *,
    faults: frozenset[str],
    on_start: Callable[[int], None],
    on_finish: Callable[[], None],
) -> AsyncGenerator[TerminalEvent, None]:
    """The session's events (see ``Driver.terminal``) for a validated ``launch`` of a running Machine."""
    argv = list(launch.argv)
    user = launch.user
    if user is not None and (user.uid, user.gid) != (os.geteuid(), os.getegid()):
        prefix = setpriv_prefix(user)
        if prefix is None:
            raise PermissionDeniedError(
                "a terminal session as another user needs util-linux 'setpriv' on this host",
                details={"uid": str(user.uid)},
            )
        argv = [*prefix, *argv]
    argv = [*netns_prefix(launch.netns), *argv]
    if "pty-leaves-session" in faults:
        # Only the command is killed; its session ignores the hangup that closing the terminal sends.
        argv = ["sh", "-c", 'trap "" HUP; exec "$@"', "sh", *argv]
    if "pty-no-echo" in faults:
        argv = ["sh", "-c", 'stty -echo; exec "$@"', "sh", *argv]
    rows, cols = (TERMINAL_ROWS, TERMINAL_COLS) if "pty-ignores-size" in faults else (spec.rows, spec.cols)
    events = host_terminal(
        argv,
        _filtered_input(keys, faults),
        rows=rows,
        cols=cols,
        term=spec.term,
        env=dict(launch.env),
        cwd=launch.cwd,
        on_start=on_start,
        controlling_terminal="pty-no-controlling-terminal" not in faults,
        leave_session="pty-leaves-session" in faults,
    )
    delivered = 0
    chunk_index = 0
    try:
        async with contextlib.aclosing(events) as stream:
            async for event in stream:
                if isinstance(event, TerminalOutput):
                    if "pty-drops-output" in faults and delivered >= _DROP_AFTER:
                        chunk_index += 1
                        if chunk_index % 8 == 0:
                            continue
                    delivered += len(event.data)
                elif isinstance(event, ExecExit) and "pty-exit-zero" in faults:
                    event = ExecExit(0)
                yield event
    finally:
        on_finish()
