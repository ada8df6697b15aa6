"""Process identity: proving that a command tree is gone, not just that some pid is free again.

A process is identified by its pid *and* its start time (a reused pid has another start time) and, for the
shells of a scenario, by a unique marker in its command line. Host processes (the fake driver, host-process
drivers) are inspected with psutil; processes inside a Machine through a follow-up Exec reading ``/proc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from vz_conformance._context import CheckContext
from vz_conformance._expect import fail

__all__ = [
    "Identity",
    "Tree",
    "host_marker_pids",
    "host_snapshot",
    "kill_host",
    "kill_host_marked",
    "wait_host_gone",
]


@dataclass(frozen=True)
class Identity:
    """A process as it was when observed: pid plus start time (psutil seconds or /proc clock ticks)."""

    pid: int
    start: str

    def __str__(self) -> str:
        return f"pid {self.pid} (started {self.start})"


def _host_identity(pid: int) -> Identity | None:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return Identity(pid, f"{proc.create_time():.2f}")
    except psutil.Error:
        return None


def host_marker_pids(marker: str) -> set[int]:
    """Live (non-zombie) host processes whose command line mentions ``marker``."""
    found: set[int] = set()
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(marker in part for part in proc.info["cmdline"] or ()):
                found.add(proc.pid)
    return found


def kill_host_marked(marker: str) -> None:
    """Kill every host process carrying ``marker`` and all of its descendants (cleanup after a driver that left
    a command running)."""
    for pid in host_marker_pids(marker):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
            proc.kill()


def host_snapshot(pids: Iterable[int]) -> set[Identity]:
    return {ident for pid in pids if (ident := _host_identity(pid)) is not None}


def kill_host(identities: Iterable[Identity]) -> None:
    """Kill leftovers the driver failed to kill (only processes that still have the recorded identity)."""
    for ident in identities:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(ident.pid)
            if f"{proc.create_time():.2f}" == ident.start:
                proc.kill()


async def wait_host_gone(identities: set[Identity], marker: str, within: float) -> tuple[set[Identity], set[int]]:
    """Poll until none of ``identities`` is alive and no process carries ``marker``; return what remains."""
    deadline = time.monotonic() + within
    while True:
        alive = {ident for ident in identities if _host_identity(ident.pid) == ident}
        marked = host_marker_pids(marker)
        if (not alive and not marked) or time.monotonic() > deadline:
            return alive, marked
        await asyncio.sleep(0.1)


class Tree:
    """The processes of one scenario command, observed right after it printed ``ready``."""

    def __init__(self, ctx: CheckContext, workspace_id: str, pids: list[int], marker: str) -> None:
        self.ctx = ctx
        self.workspace_id = workspace_id
        self.pids = pids
        self.marker = marker
        self.identities: set[Identity] = set()

    async def observe(self) -> None:
        """Record the identity of every reported pid; each must be alive now."""
        if self.ctx.adapter.processes_visible_on_host:
            self.identities = host_snapshot(self.pids)
        else:
            self.identities, _ = await self._machine_scan()
        seen = {ident.pid for ident in self.identities}
        missing = [pid for pid in self.pids if pid not in seen]
        if missing:
            fail(
                "Exec",
                f"every reported process of the tree alive while the command blocks ({self.pids})",
                f"not found: {missing}",
                note="the scenario's 'pid' lines must name live processes",
            )

    async def _machine_scan(self) -> tuple[set[Identity], set[int]]:
        argv = self.ctx.adapter.find_processes(self.pids, self.marker)
        result = await self.ctx.run_ok(self.workspace_id, argv, within=20)
        alive: set[Identity] = set()
        marked: set[int] = set()
        for line in result.stdout.decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "marker" and parts[1].isdigit():
                marked.add(int(parts[1]))
            elif len(parts) == 2 and parts[0].isdigit():
                alive.add(Identity(int(parts[0]), parts[1]))
        return alive, marked

    async def remaining(self, within: float) -> tuple[set[Identity], set[int]]:
        """What is still alive of the tree after ``within`` seconds of polling (empty sets = all gone)."""
        if self.ctx.adapter.processes_visible_on_host:
            return await wait_host_gone(self.identities, self.marker, within)
        deadline = time.monotonic() + within
        while True:
            now, marked = await self._machine_scan()
            alive = self.identities & now
            if (not alive and not marked) or time.monotonic() > deadline:
                return alive, marked
            await asyncio.sleep(0.2)

    async def require_gone(self, within: float, *, after: str) -> None:
        alive, marked = await self.remaining(within)
        if alive or marked:
            await self.kill_leftovers(alive)
            shown = ", ".join(str(i) for i in sorted(alive, key=lambda i: i.pid))
            fail(
                "Exec",
                f"the command, its children and grandchildren gone within {within:g} s after {after}",
                f"still alive: {shown or 'none by pid'}; processes carrying the marker: {sorted(marked) or 'none'}",
                note=f"identity = pid + start time + marker {self.marker!r}",
            )

    async def kill_leftovers(self, alive: set[Identity]) -> None:
        if self.ctx.adapter.processes_visible_on_host:
            kill_host(alive | host_snapshot(host_marker_pids(self.marker)))
            return
        pids = " ".join(str(i.pid) for i in alive)
        if pids:
            with contextlib.suppress(Exception):
                await self.ctx.run(self.workspace_id, ("sh", "-c", f"kill -KILL {pids}"), within=10)
