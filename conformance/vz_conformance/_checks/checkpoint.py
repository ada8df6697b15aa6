"""checkpoint: a Machine's running state saved and resumed (vz.machine.v1 SaveState / RestoreState).

The main process is a counter (``Adapter.counter_main``) writing ``<token> <count>`` to a Machine-local file,
with a token new at each start of the process. A resumed Machine goes on counting with the same token; a state
that cannot be used (here, a state file overwritten with garbage) is refused with a reason, the Machine stays
stopped with its disk kept and then boots fresh (a new token); Delete removes the state file. A driver that
does not declare ``extensions.save_state`` must refuse SaveState as UNSUPPORTED.
"""

from __future__ import annotations

import asyncio
import os
import time

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._expect import ensure, expect_error, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed
from vz_core.savestate import SavedState, StateSaver

__all__ = ["CASES", "check_corrupt_refused", "check_delete_removes_state", "check_resume_keeps_process"]

_COUNTER = "vz-conformance-counter"


def _saver(ctx: CheckContext) -> StateSaver:
    driver = ctx.driver
    if not isinstance(driver, StateSaver):
        fail("SaveState", "a driver handle with save_state/restore_state", type(driver).__name__)
    return driver


async def _counter(ctx: CheckContext, workspace_id: str) -> tuple[str, int] | None:
    result = await ctx.run(workspace_id, ctx.adapter.read_local(_COUNTER))
    words = result.stdout.split()
    if result.exit is None or result.exit.exit_code != 0 or len(words) != 2 or not words[1].isdigit():
        return None
    return words[0].decode(errors="replace"), int(words[1])


async def _counted(
    ctx: CheckContext, workspace_id: str, above: int, *, token: str = "", not_token: str = "", after: str
) -> tuple[str, int]:
    """The counter once it is above ``above`` with ``token`` (or any token but ``not_token``); ≤ 60 s."""
    deadline = time.monotonic() + 60
    value = None
    while time.monotonic() < deadline:
        value = await _counter(ctx, workspace_id)
        if token and value is not None and value[0] != token:
            fail("Exec", f"the counter with token {token} after {after}", f"{value!r} (another process's)")
        if value is not None and value[1] > above and (not token or value[0] == token) and value[0] != not_token:
            return value
        await asyncio.sleep(0.2)
    wanted = f"token {token}" if token else f"a token other than {not_token}" if not_token else "any token"
    fail("Exec", f"the main process's counter above {above} with {wanted} after {after}", repr(value))


async def _saved(ctx: CheckContext, purpose: str) -> tuple[str, tuple[str, int], SavedState]:
    """A counting Machine whose state was just saved; its counter at the save and the SavedState."""
    entrypoint, args = ctx.adapter.counter_main(_COUNTER)
    req = await ctx.create(purpose, entrypoint=entrypoint, args=args)
    saver = _saver(ctx)
    counted = await _counted(ctx, req.workspace_id, 2, after="RunImage")
    state = await expect_ok("SaveState", lambda: saver.save_state(req.workspace_id), note="a running Machine")
    ensure(state.size_bytes > 0, "SaveState", "a state of more than 0 bytes", state.size_bytes)
    await ctx.require_status(req.workspace_id, "stopped", after="SaveState")
    return req.workspace_id, counted, state


async def _refusal(ctx: CheckContext) -> Outcome:
    req = await ctx.create("nosave")

    async def verify() -> None:
        if isinstance(ctx.driver, StateSaver):
            saver = ctx.driver
            await expect_error(
                "SaveState",
                lambda: saver.save_state(req.workspace_id),
                "UNSUPPORTED",
                note="extensions.save_state=false",
            )

    return await ctx.not_applicable(cap.SAVE_STATE, "SaveState refused as UNSUPPORTED", verify)


async def check_resume_keeps_process(ctx: CheckContext) -> Outcome:
    """SaveState then RestoreState: the main process goes on counting from where it was (same token)."""
    if not ctx.declared(cap.SAVE_STATE):
        return await _refusal(ctx)
    workspace_id, (token, count), _ = await _saved(ctx, "resume")
    saver = _saver(ctx)
    outcome = await expect_ok("RestoreState", lambda: saver.restore_state(workspace_id))
    ensure(outcome.restored, "RestoreState", "restored=true for a state just saved", f"reason {outcome.reason!r}")
    await ctx.require_status(workspace_id, "running", after="RestoreState")
    # The file may still hold what the process wrote last before the save; it must go on changing, by the same
    # process (same token).
    _, last = await _counted(ctx, workspace_id, count, token=token, after="RestoreState")
    await _counted(ctx, workspace_id, last, token=token, after="RestoreState (the same process, counting on)")
    return Passed()


async def check_corrupt_refused(ctx: CheckContext) -> Outcome:
    """A corrupt state file: RestoreState says why and resumes nothing, the Machine stays stopped with its
    disk kept, and Start boots it fresh."""
    if not ctx.declared(cap.SAVE_STATE):
        return await _refusal(ctx)
    entrypoint, args = ctx.adapter.counter_main(_COUNTER)
    req = await ctx.create("corrupt", entrypoint=entrypoint, args=args)
    workspace_id = req.workspace_id
    await ctx.run_ok(workspace_id, ctx.adapter.write_local("vz-conformance-kept", "kept"))
    saver = _saver(ctx)
    token, _ = await _counted(ctx, workspace_id, 2, after="RunImage")
    state = await expect_ok("SaveState", lambda: saver.save_state(workspace_id))
    ensure(bool(state.path), "SaveState", "the state file's host path (SavedState.path)", "an empty path")
    await asyncio.to_thread(_overwrite, state.path)
    outcome = await expect_ok("RestoreState", lambda: saver.restore_state(workspace_id), note="a corrupt state file")
    ensure(not outcome.restored, "RestoreState", "restored=false for a corrupt state file", "restored=true")
    ensure(bool(outcome.reason), "RestoreState", "a reason for not restoring", "an empty reason")
    await ctx.require_status(workspace_id, "stopped", after="RestoreState of a corrupt state (never half-restored)")
    await expect_ok("Start", lambda: ctx.driver.start(workspace_id))
    await _counted(ctx, workspace_id, 0, not_token=token, after="Start (a fresh boot)")
    await ctx.require_stdout(
        workspace_id, ctx.adapter.read_local("vz-conformance-kept"), b"kept", "the disk kept after a refused state"
    )
    return Passed()


async def check_delete_removes_state(ctx: CheckContext) -> Outcome:
    """Delete of a Machine with a saved state removes the state file."""
    if not ctx.declared(cap.SAVE_STATE):
        return await _refusal(ctx)
    workspace_id, _, state = await _saved(ctx, "delstate")
    await expect_ok("Delete", lambda: ctx.driver.delete(workspace_id))
    await ctx.require_absent(workspace_id, after="Delete")
    if state.path:
        exists = await asyncio.to_thread(os.path.exists, state.path)
        ensure(not exists, "Delete", f"the state file {state.path} removed", "it still exists")
    return Passed()


def _overwrite(path: str) -> None:
    with open(path, "r+b") as state:
        size = state.seek(0, os.SEEK_END)
        state.seek(0)
        state.write(b"\x00vz-conformance: not a saved state\x00" * max(1, min(size, 4096) // 36))


CASES = (
    Case(
        "checkpoint.resume_keeps_process",
        "SaveState then RestoreState: the main process counts on from where it was (or UNSUPPORTED)",
        check_resume_keeps_process,
        gated_by=(cap.SAVE_STATE,),
    ),
    Case(
        "checkpoint.corrupt_refused",
        "a corrupt state file is refused with a reason, the Machine stays stopped, disk kept, Start boots fresh",
        check_corrupt_refused,
        gated_by=(cap.SAVE_STATE,),
    ),
    Case(
        "checkpoint.delete_removes_state",
        "Delete of a Machine with a saved state removes the state file (or UNSUPPORTED)",
        check_delete_removes_state,
        gated_by=(cap.SAVE_STATE,),
    ),
)
