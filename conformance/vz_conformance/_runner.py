"""Running cases against providers and building the report.

Each case runs once (never retried) in its own task with a time limit; every Machine it created is deleted
afterwards. A connection that a case broke (a crashed plugin) is replaced before the next case, so one failure
does not cascade into unrelated cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import platform
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from vz_conformance import _catalogue
from vz_conformance._adapter import Adapter
from vz_conformance._case import Case
from vz_conformance._context import CheckContext, ConnectFailedError, DriverSession
from vz_conformance._expect import describe
from vz_conformance._outcome import NotApplicable, Outcome, Passed
from vz_conformance._providers import DriverProvider
from vz_conformance._report import (
    CaseEntry,
    DriverRecord,
    EntryOutcome,
    HostRecord,
    Report,
    RunRecord,
    Selection,
    info_record,
)
from vz_core import Capabilities

__all__ = ["DEFAULT_CASE_TIMEOUT", "Progress", "host_arch", "run_cases", "run_suite", "suite_version"]

DEFAULT_CASE_TIMEOUT = 120.0
Progress = Callable[[str, CaseEntry], None]


def suite_version() -> str:
    try:
        return metadata.version("vz")
    except metadata.PackageNotFoundError:  # running from a source tree without metadata
        return "0+unknown"


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _now() -> datetime:
    return datetime.now(UTC)


def _filter(cases: Sequence[Case], patterns: Sequence[str] | None) -> tuple[Case, ...]:
    if not patterns:
        return tuple(cases)
    return tuple(c for c in cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns))


async def _cleanup(session: DriverSession, ctx: CheckContext, problems: list[str]) -> None:
    await ctx.close_extra()
    if not ctx.created:
        return
    try:
        if not await session.healthy():
            await session.reset()
        driver = await session.driver()
    except ConnectFailedError:
        return
    for workspace_id in ctx.created:
        try:
            async with asyncio.timeout(30):
                if await driver.find(workspace_id) is not None:
                    await driver.delete(workspace_id)
        except Exception as exc:
            problems.append(f"{ctx.case_id}: could not delete Machine {workspace_id!r}: {describe(exc)}")


async def _run_one(
    case: Case,
    session: DriverSession,
    adapter: Adapter,
    scratch: Path,
    token: str,
    case_timeout: float,
    problems: list[str],
) -> CaseEntry:
    started = time.monotonic()

    def entry(
        outcome: EntryOutcome,
        *,
        failure: str | None = None,
        capability: str | None = None,
        refusal: str | None = None,
        note: str | None = None,
    ) -> CaseEntry:
        return CaseEntry(
            id=case.id,
            label=case.label,
            outcome=outcome,
            duration_s=round(time.monotonic() - started, 3),
            attempts=1,
            failure=failure,
            capability=capability,
            refusal=refusal,
            note=note,
        )

    case_scratch = scratch / case.id
    case_scratch.mkdir(parents=True, exist_ok=True)
    try:
        driver = await session.driver()
        info, ext = await session.info()
    except (ConnectFailedError, AssertionError) as exc:
        return entry("failed", failure=str(exc))
    ctx = CheckContext(
        case_id=case.id,
        session=session,
        adapter=adapter,
        scratch=case_scratch,
        token=token,
        info=info,
        extensions=ext,
        driver=driver,
    )
    task: asyncio.Task[Outcome] = asyncio.create_task(case.check(ctx), name=f"vz-conformance {case.id}")
    failure: str | None = None
    result: object = None
    try:
        done, _ = await asyncio.wait({task}, timeout=case_timeout)
        if not done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), 10)
            failure = f"{case.id}: the check did not finish within {case_timeout:g} s"
        elif task.cancelled():
            failure = f"{case.id}: the check was cancelled (a CancelledError escaped a driver call)"
        elif (error := task.exception()) is not None:
            if isinstance(error, AssertionError):
                failure = str(error) or "assertion failed"
            else:
                tb = "".join(traceback.format_exception(error, limit=-4)).strip()
                failure = f"unexpected error {describe(error)}\n{tb}"
        else:
            result = task.result()
    finally:
        await _cleanup(session, ctx, problems)
        if failure is not None and not await session.healthy():
            await session.reset()
    if failure is not None:
        return entry("failed", failure=failure)
    if isinstance(result, NotApplicable):
        if result.capability not in case.gated_by:
            return entry(
                "failed",
                failure=f"{case.id}: the check answered not-applicable for {result.capability!r}, "
                f"which does not gate this case (gated by {list(case.gated_by)})",
            )
        return entry("not-applicable", capability=result.capability, refusal=result.refusal)
    if isinstance(result, Passed):
        return entry("passed", note=result.note or None)
    return entry("failed", failure=f"{case.id}: the check returned {result!r} instead of an Outcome")


async def run_cases(
    provider: DriverProvider,
    adapter: Adapter,
    cases: Sequence[Case],
    *,
    scratch: Path,
    progress: Progress | None = None,
    case_timeout: float = DEFAULT_CASE_TIMEOUT,
    dry_run: bool = False,
) -> RunRecord:
    """Run ``cases`` (each exactly once) against ``provider``; ``scratch`` is an empty private directory."""
    started = _now()
    describe_driver = provider.describe()
    driver_record = DriverRecord(**describe_driver)
    entries: list[CaseEntry] = []
    if dry_run:
        entries = [CaseEntry(id=c.id, label=c.label, outcome="skipped", duration_s=0, attempts=0) for c in cases]
        for e in entries:
            if progress:
                progress(provider.mode, e)
        return RunRecord(
            provider_mode=provider.mode,
            driver=driver_record,
            info=None,
            info_error="dry run: the driver was not contacted",
            started_at=started,
            finished_at=_now(),
            cases=entries,
        )
    token = secrets.token_hex(4)
    session = DriverSession(provider)
    problems: list[str] = []
    record_info = None
    info_error = None
    try:
        try:
            info, ext = await session.info()
            opted = await (await session.driver()).info(supports_recreate_on_run=True)
            record_info = info_record(info, ext, (opted.capabilities or Capabilities()).recreate_mode)
        except Exception as exc:
            info_error = describe(exc) if not isinstance(exc, ConnectFailedError) else str(exc)
        for case in cases:
            e = await _run_one(case, session, adapter, scratch, token, case_timeout, problems)
            entries.append(e)
            if progress:
                progress(provider.mode, e)
    finally:
        await session.close()
    return RunRecord(
        provider_mode=provider.mode,
        driver=driver_record,
        info=record_info,
        info_error=info_error,
        started_at=started,
        finished_at=_now(),
        cleanup_problems=problems,
        cases=entries,
    )


async def run_suite(
    providers: Sequence[DriverProvider],
    adapter: Adapter,
    *,
    labels: Iterable[str] | None = None,
    case_filter: Sequence[str] | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    case_timeout: float = DEFAULT_CASE_TIMEOUT,
    scratch: Path | None = None,
) -> Report:
    """Run the selected labels against one provider, or against an in-process and an external provider (parity).

    ``case_filter`` (ids or fnmatch patterns) narrows the run inside its labels; such a report is recorded as
    filtered and can never pass the gate.
    """
    modes = [p.mode for p in providers]
    if modes not in (["in-process"], ["external"], ["in-process", "external"]):
        raise ValueError(f"give one provider, or an in-process then an external provider (parity); got {modes}")
    wanted = None if labels is None else set(labels)
    bad = _catalogue.unknown_labels(wanted or ())
    if bad:
        raise ValueError(f"unknown label(s) {bad}; known labels: {', '.join(_catalogue.LABELS)}")
    if wanted is not None and not wanted:
        raise ValueError("select at least one label (or none to run the whole catalogue)")
    chosen = [label for label in _catalogue.LABELS if wanted is None or label in wanted]
    started = _now()
    owned = scratch is None
    root = Path(tempfile.mkdtemp(prefix="vz-conformance-")) if scratch is None else scratch
    runs: list[RunRecord] = []
    try:
        for provider in providers:
            cases = _filter(_catalogue.select(provider.mode, chosen), case_filter)
            run_scratch = root / provider.mode
            run_scratch.mkdir(parents=True, exist_ok=True)
            runs.append(
                await run_cases(
                    provider,
                    adapter,
                    cases,
                    scratch=run_scratch,
                    progress=progress,
                    case_timeout=case_timeout,
                    dry_run=dry_run,
                )
            )
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    return Report(
        suite_version=suite_version(),
        catalogue_digest=_catalogue.digest(),
        provider_mode="parity" if len(providers) == 2 else providers[0].mode,
        selection=Selection(labels=chosen, case_filter=list(case_filter) if case_filter else None, dry_run=dry_run),
        host=HostRecord(os=sys.platform, arch=host_arch(), python=platform.python_version()),
        started_at=started,
        finished_at=_now(),
        runs=runs,
    )
