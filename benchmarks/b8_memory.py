"""B8: plugin memory: RSS of an idle linux_native plugin serving M Machines.

The measurement is ``benchmarks.linux_native_bench.b8_memory`` (see its docstring). Where linux_native cannot run
Machines (its Preflight fails: not root, no overlayfs, no cgroups, no runc) it is skipped with a note.
"""

from __future__ import annotations

from typing import Any

from benchmarks._common import linux_native_problem
from benchmarks.linux_native_bench import b8_memory

ID = "B8"
TITLE = "plugin memory: RSS of an idle linux_native plugin serving M Machines"


async def run(ctx: Any) -> dict[str, Any]:
    problem = await linux_native_problem(ctx.workdir / "preflight")
    if problem:
        ctx.notes.append(f"not measured: linux_native cannot run Machines here: {problem}")
        return {"headline": "not measured: linux_native unavailable (see notes)", "measured": False}
    data = await b8_memory(ctx.smoke, ctx.workdir)
    return {"measured": True, **data}
