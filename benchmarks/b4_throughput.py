"""B4: exec stream throughput host → plugin → Machine → back (linux_native, 32 KiB frames).

The measurement is ``benchmarks.linux_native_bench.b4_throughput`` (see its docstring). Where linux_native cannot run
Machines (its Preflight fails: not root, no overlayfs, no cgroups, no runc) it is skipped with a note.
"""

from __future__ import annotations

from typing import Any

from benchmarks._common import linux_native_problem
from benchmarks.linux_native_bench import b4_throughput

ID = "B4"
TITLE = "exec stream throughput host → plugin → Machine → back (linux_native, 32 KiB frames)"


async def run(ctx: Any) -> dict[str, Any]:
    problem = await linux_native_problem(ctx.workdir / "preflight")
    if problem:
        ctx.notes.append(f"not measured: linux_native cannot run Machines here: {problem}")
        return {"headline": "not measured: linux_native unavailable (see notes)", "measured": False}
    data = await b4_throughput(ctx.smoke, ctx.workdir)
    return {"measured": True, **data}
