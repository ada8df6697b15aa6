"""crash / compatibility (external only): plugin processes that die, hang, lie about their version or change
on disk are refused or reported UNAVAILABLE, Machines survive, and no process is left behind.

Misbehaviour that a healthy plugin cannot be asked to show (dying before or right after the handshake, during
Info, never answering, an incompatible or malformed Info) is produced by the suite's reference plugin
(``vz-driver-fake --fault NAME``) launched through the same supervisor and trust path as the plugin under
test. A crash in the middle of an Exec and a changed checksum are exercised on the plugin under test itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil

from vz_conformance._case import EXTERNAL_ONLY, Case
from vz_conformance._context import CheckContext
from vz_conformance._exec import chunks, close_iterator
from vz_conformance._expect import category_of, describe, ensure, expect_error, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed
from vz_conformance._processes import Identity, Tree, kill_host
from vz_conformance._providers import ExternalProvider, sha256_of
from vz_core import Driver, ExecEvent, ExecSpec
from vz_core.errors import DriverError, IncompatibleVersionError, PluginError, TrustError, VzError

__all__ = [
    "CASES",
    "REFERENCE_PLUGIN",
    "check_after_handshake",
    "check_before_handshake",
    "check_checksum_changed",
    "check_during_info",
    "check_incompatible_version",
    "check_malformed_info",
    "check_mid_exec",
    "check_never_handshake",
    "check_unknown_enum_info",
]

REFERENCE_PLUGIN = "vz-driver-fake"
NEVER_HANDSHAKE_TIMEOUT = 2.0
LEFTOVER_GRACE = 5.0


def _external(ctx: CheckContext) -> ExternalProvider:
    provider = ctx.provider
    if not isinstance(provider, ExternalProvider):
        fail("crash case", "an external provider (these cases exist only out of process)", type(provider).__name__)
    return provider


def _reference(ctx: CheckContext, fault: str, *, handshake_timeout: float | None = None) -> ExternalProvider:
    found = shutil.which(REFERENCE_PLUGIN)
    if found is None:
        fail("launch", f"the reference plugin {REFERENCE_PLUGIN!r} on PATH (installed with the suite)", "not found")
    state = ctx.scratch / f"fault-{fault}"
    state.mkdir(parents=True, exist_ok=True)
    timeout = handshake_timeout if handshake_timeout is not None else _external(ctx).handshake_timeout
    return ExternalProvider(
        found,
        sha256_of(Path(found)),
        args=["--fault", fault, "--state-dir", str(state)],
        handshake_timeout=timeout,
        name=f"{REFERENCE_PLUGIN} --fault {fault}",
    )


def _children() -> set[Identity]:
    out: set[Identity] = set()
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            out.add(Identity(proc.pid, f"{proc.create_time():.2f}"))
    return out


class _NoLeftovers:
    """Snapshot this process's descendants; on exit, everything new must be gone (exited *and* reaped)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.before: set[Identity] = set()

    def __enter__(self) -> _NoLeftovers:
        self.before = _children()
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def check(self) -> None:
        deadline = time.monotonic() + LEFTOVER_GRACE
        while True:
            left = _children() - self.before
            if not left or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        if left:
            names = []
            for ident in sorted(left, key=lambda i: i.pid):
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(ident.pid)
                    names.append(f"{ident} {proc.status()} {' '.join(proc.cmdline())[:80]}")
            kill_host(left)
            fail(
                "supervisor",
                f"no plugin process (or child, or zombie) left {LEFTOVER_GRACE:g} s after {self.what}",
                "; ".join(names) or f"{len(left)} process(es)",
            )


async def _close(driver: Driver) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(10):
            await driver.close()


async def _refused_at_launch(
    ctx: CheckContext,
    fault: str,
    accept: tuple[type[BaseException], ...],
    what: str,
    *,
    handshake_timeout: float | None = None,
) -> BaseException:
    provider = _reference(ctx, fault, handshake_timeout=handshake_timeout)
    with _NoLeftovers(f"a plugin that {what}") as guard:
        try:
            driver = await provider.connect()
        except Exception as exc:
            if not isinstance(exc, accept) and category_of(exc) != "UNAVAILABLE":
                fail(
                    "launch",
                    f"a refusal ({', '.join(a.__name__ for a in accept)} or UNAVAILABLE) for a plugin that {what}",
                    describe(exc),
                )
            ensure(bool(str(exc).strip()), "launch", "an actionable message", repr(exc))
            await guard.check()
            return exc
        await _close(driver)
        await guard.check()
    fail("launch", f"a refusal for a plugin that {what}", "a connected driver")


async def _unavailable_after_launch(ctx: CheckContext, fault: str, what: str) -> Outcome:
    """The plugin dies after the handshake: launch or the first call fails (UNAVAILABLE), nothing is left."""
    provider = _reference(ctx, fault)
    with _NoLeftovers(f"a plugin that {what}") as guard:
        try:
            driver = await provider.connect()
        except Exception as exc:
            if not isinstance(exc, PluginError) and category_of(exc) != "UNAVAILABLE":
                fail("launch", f"PluginError or UNAVAILABLE for a plugin that {what}", describe(exc))
        else:
            try:
                await expect_error("Info", driver.info, "UNAVAILABLE", note=f"the plugin {what}")
            finally:
                await _close(driver)
        await guard.check()
    return Passed()


async def check_before_handshake(ctx: CheckContext) -> Outcome:
    """A plugin that exits before its handshake line is refused with a clear error; nothing is left behind."""
    await _refused_at_launch(ctx, "crash-before-handshake", (PluginError,), "exits before the handshake")
    return Passed()


async def check_after_handshake(ctx: CheckContext) -> Outcome:
    """A plugin that exits right after the handshake: UNAVAILABLE to the caller; nothing is left behind."""
    return await _unavailable_after_launch(ctx, "crash-after-handshake", "exits after the handshake")


async def check_never_handshake(ctx: CheckContext) -> Outcome:
    """A plugin that never prints its handshake is abandoned at the handshake timeout and reaped."""
    started = time.monotonic()
    await _refused_at_launch(
        ctx, "never-handshake", (PluginError,), "never prints its handshake", handshake_timeout=NEVER_HANDSHAKE_TIMEOUT
    )
    elapsed = time.monotonic() - started
    ensure(
        NEVER_HANDSHAKE_TIMEOUT * 0.8 <= elapsed <= NEVER_HANDSHAKE_TIMEOUT + 10,
        "launch",
        f"abandoned at the {NEVER_HANDSHAKE_TIMEOUT:g} s handshake timeout",
        f"after {elapsed:.1f} s",
    )
    return Passed()


async def check_during_info(ctx: CheckContext) -> Outcome:
    """A plugin that exits while answering Info: UNAVAILABLE to the caller; nothing is left behind."""
    return await _unavailable_after_launch(ctx, "crash-during-info", "exits during Info")


async def check_incompatible_version(ctx: CheckContext) -> Outcome:
    """A plugin answering another API major is refused during negotiation, before any other call."""
    exc = await _refused_at_launch(
        ctx, "incompatible-version", (IncompatibleVersionError, PluginError), "answers an incompatible API major"
    )
    text = str(exc).lower()
    ensure(
        any(word in text for word in ("major", "version", "api", "protocol")),
        "launch",
        "a message naming the incompatible API version",
        str(exc),
    )
    return Passed()


async def check_malformed_info(ctx: CheckContext) -> Outcome:
    """A plugin whose Info is malformed (empty names, no capabilities) is refused before any other call."""
    await _refused_at_launch(ctx, "malformed-info", (VzError,), "answers a malformed Info")
    return Passed()


async def check_unknown_enum_info(ctx: CheckContext) -> Outcome:
    """A plugin declaring unknown enum values (mount type, recreate mode) is refused before any other call."""
    await _refused_at_launch(ctx, "unknown-enum-info", (VzError,), "declares unknown enum values in Info")
    return Passed()


async def check_mid_exec(ctx: CheckContext) -> Outcome:
    """The plugin under test killed in the middle of an Exec: UNAVAILABLE to the caller, its processes are gone,
    and a relaunched plugin finds the Machine in the same state."""
    provider = _external(ctx)
    with _NoLeftovers("the plugin was killed mid-Exec") as guard:
        victim = await ctx.relaunch()
        pid = provider.plugin_pid(victim)
        if pid is None:
            fail("launch", "the plugin's process id from the supervisor", "none")
        req = ctx.request("crash")
        await expect_ok("RunImage", lambda: victim.run_image(req), note=req.workspace_id)
        before = await ctx.find(req.workspace_id, driver=victim)
        marker = f"vzc-marker-{secrets.token_hex(8)}"
        argv, pid_lines = ctx.adapter.blocking_tree(marker)
        stream = victim.exec(ExecSpec(workspace_id=req.workspace_id, argv=argv), chunks(b""))
        seen = b""
        tree: Tree | None = None
        try:
            async with asyncio.timeout(15):
                async for event in _events(stream, "the blocking command before the plugin is killed"):
                    seen += getattr(event, "data", b"")
                    lines = seen.decode(errors="replace").splitlines()
                    pids = [int(x.split()[1]) for x in lines if x.startswith("pid ") and x.split()[1].isdigit()]
                    if "ready" in lines and len(pids) >= pid_lines:
                        tree = Tree(ctx, req.workspace_id, pids, marker)
                        break
            if tree is None:
                fail("Exec", f"'ready' and {pid_lines} 'pid' lines from the blocking command", repr(seen[:300]))
            await tree.observe()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            await expect_error(
                "Exec",
                lambda: _drain(stream),
                "UNAVAILABLE",
                note="the plugin process was killed (SIGKILL) during the Exec",
            )
        finally:
            await close_iterator(stream)
        await _close(victim)
        await guard.check()
        await tree.require_gone(10.0, after="the plugin serving the Exec was killed")
        again = await ctx.relaunch()
        after = await ctx.find(req.workspace_id, driver=again)
        ensure(
            after is not None
            and before is not None
            and after.id == before.id
            and after.created_at == before.created_at
            and after.state.status == before.state.status,
            "Find",
            "the relaunched plugin to find the Machine as it was",
            f"{before} -> {after}",
        )
    return Passed()


async def _events(stream: AsyncIterator[ExecEvent], what: str) -> AsyncIterator[ExecEvent]:
    """``stream``'s events; an error before ``what`` completed is a failure naming it."""
    try:
        async for event in stream:
            yield event
    except DriverError as exc:
        fail("Exec", f"output from {what}", describe(exc))


async def _drain(stream: object) -> None:
    async for _ in stream:  # type: ignore[attr-defined]
        pass


async def check_checksum_changed(ctx: CheckContext) -> Outcome:
    """A plugin binary that changed between two operations is refused before launch."""
    provider = _external(ctx)
    copy_dir = ctx.scratch / "plugin-copy"
    copy_dir.mkdir(parents=True, exist_ok=True)
    copy = copy_dir / provider.executable.name
    shutil.copy2(provider.executable, copy)
    ensure(
        sha256_of(copy) == provider.sha256, "trust", "the copied plugin to match the declared SHA-256", sha256_of(copy)
    )
    copied = provider.derive(executable=copy)
    first = await expect_ok("launch", copied.connect, note="first operation with the unchanged copy")
    try:
        await expect_ok("Info", first.info, note="first operation with the unchanged copy")
    finally:
        await _close(first)
    with copy.open("ab") as handle:
        handle.write(b"\n# changed after verification\n")
    with _NoLeftovers("launching a changed binary") as guard:
        try:
            driver = await copied.connect()
        except TrustError:
            pass
        except Exception as exc:
            fail("launch", "TrustError (checksum mismatch) before launch", describe(exc))
        else:
            await _close(driver)
            fail("launch", "TrustError (checksum mismatch) before launch", "the changed binary was launched")
        await guard.check()
    return Passed()


CASES = tuple(
    Case(case_id, description, check, modes=EXTERNAL_ONLY)
    for case_id, description, check in (
        (
            "crash.before_handshake",
            "Plugin exits before the handshake: clear refusal, nothing left",
            check_before_handshake,
        ),
        ("crash.after_handshake", "Plugin exits after the handshake: UNAVAILABLE, nothing left", check_after_handshake),
        (
            "crash.never_handshake",
            "Handshake never comes: abandoned at the timeout, process reaped",
            check_never_handshake,
        ),
        ("crash.during_info", "Plugin exits during Info: UNAVAILABLE, nothing left", check_during_info),
        ("crash.mid_exec", "Plugin killed mid-Exec: UNAVAILABLE, Machine kept, relaunch finds it", check_mid_exec),
        (
            "crash.incompatible_version",
            "Incompatible API major refused before any other call",
            check_incompatible_version,
        ),
        ("crash.malformed_info", "Malformed Info refused before any other call", check_malformed_info),
        (
            "crash.unknown_enum_info",
            "Unknown enum values in Info refused before any other call",
            check_unknown_enum_info,
        ),
        (
            "crash.checksum_changed",
            "A binary changed between two operations is refused before launch",
            check_checksum_changed,
        ),
    )
)
