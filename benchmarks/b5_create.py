"""B5: Machine create → running, image cached (linux_native).

The measurement is ``benchmarks.linux_native_bench.b5_create`` (see its docstring). Where linux_native cannot run
Machines (its Preflight fails: not root, no overlayfs, no cgroups, no runc) it is skipped with a note.
"""

from __future__ import annotations

from typing import Any

from benchmarks._common import linux_native_problem
from benchmarks.linux_native_bench import b5_create

ID = "B5"
TITLE = "Machine create → running, image cached (linux_native)"


async def run(ctx: Any) -> dict[str, Any]:
    problem = await linux_native_problem(ctx.workdir / "preflight")
    if problem:
        ctx.notes.append(f"not measured: linux_native cannot run Machines here: {problem}")
        return {"headline": "not measured: linux_native unavailable (see notes)", "measured": False}
    data = await b5_create(ctx.smoke, ctx.workdir)
    return {"measured": True, **data}
