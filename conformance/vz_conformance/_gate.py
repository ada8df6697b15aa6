"""verify-report: the gate a conformance report must pass.

A report passes only when every selected case ran exactly once and passed (or is not applicable for a
capability the recorded Info declares absent, with the verified refusal recorded), the count equals the
expected count, nothing was skipped or retried, the labels are exactly the requested ones, the report comes
from this suite's catalogue, no Machine was left behind, and it is neither a dry run nor a filtered run.

Parity: the in-process and external runs (one parity report, or two single-mode reports) must hold identical
case ids in equal counts over the catalogue both modes share and report identical driver Info. Cases that exist
only out of process (the ``crash`` label) are required in the external run and are not part of the comparison.
``expect_count`` is the number of distinct case ids, i.e. the external run's count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from vz_conformance import _capabilities as cap
from vz_conformance import _catalogue
from vz_conformance._report import SCHEMA_VERSION, Report, RunRecord
from vz_conformance._runner import suite_version

__all__ = ["GateMode", "GateResult", "expected_count", "verify"]

GateMode = Literal["in-process", "external", "parity"]


@dataclass
class GateResult:
    """``problems`` empty means the gate passed; ``summary`` says what was verified."""

    problems: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def expected_count(mode: GateMode, labels: Sequence[str] | None = None) -> int:
    """The case count a complete report of ``labels`` has in ``mode`` (parity: the external count)."""
    return len(_catalogue.select("in-process" if mode == "in-process" else "external", labels))


def _check_run(run: RunRecord, labels: list[str], where: str, result: GateResult) -> None:
    p = result.problems
    expected = [c.id for c in _catalogue.select(run.provider_mode, labels)]
    ids = [c.id for c in run.cases]
    counts = Counter(ids)
    for case_id, n in sorted(counts.items()):
        if n > 1:
            p.append(f"{where}: case {case_id} appears {n} times (each case must run exactly once)")
    missing = [i for i in expected if i not in counts]
    extra = [i for i in counts if i not in set(expected)]
    if missing:
        p.append(f"{where}: {len(missing)} case(s) of the selected labels missing: {', '.join(missing)}")
    if extra:
        p.append(f"{where}: case(s) outside the selected labels' catalogue: {', '.join(sorted(extra))}")
    declared = None
    if run.info is not None:
        declared = run.info.to_values()
    elif run.info_error:
        p.append(f"{where}: the driver's Info could not be recorded: {run.info_error}")
    for entry in run.cases:
        if entry.attempts != 1:
            p.append(f"{where}: {entry.id} ran {entry.attempts} times (no skip, no retry: exactly 1)")
        known = entry.id in _catalogue_ids()
        if known and _catalogue.by_id(entry.id).label != entry.label:
            p.append(
                f"{where}: {entry.id} is labelled {entry.label!r}, the catalogue says "
                f"{_catalogue.by_id(entry.id).label!r}"
            )
        if entry.outcome == "passed":
            continue
        if entry.outcome == "not-applicable":
            case_gates = _catalogue.by_id(entry.id).gated_by if known else ()
            if not entry.capability or entry.capability not in case_gates:
                p.append(
                    f"{where}: {entry.id} not-applicable for {entry.capability!r}, which cannot gate it "
                    f"(gated by {list(case_gates)})"
                )
            elif not entry.refusal:
                p.append(f"{where}: {entry.id} not-applicable without the verified refusal")
            elif declared is not None and _is_declared(entry.capability, declared):
                p.append(
                    f"{where}: {entry.id} not-applicable for {entry.capability}, but the recorded Info declares it"
                )
            continue
        text = (entry.failure or "").splitlines()[0] if entry.failure else ""
        p.append(f"{where}: {entry.id} {entry.outcome}" + (f": {text}" if text else ""))
    for problem in run.cleanup_problems:
        p.append(f"{where}: left behind: {problem}")


def _catalogue_ids() -> set[str]:
    return {c.id for c in _catalogue.CATALOGUE}


def _outcome_text(outcome: tuple[str, str | None, str | None]) -> str:
    kind, capability, refusal = outcome
    return kind if capability is None and refusal is None else f"{kind} ({capability}: {refusal})"


def _is_declared(name: str, declared: tuple[object, object, object]) -> bool:
    info, ext, on_run = declared
    try:
        return cap.declared(name, info, ext, on_run)  # type: ignore[arg-type]
    except KeyError:
        return False


def verify(
    reports: Sequence[Report],
    *,
    mode: GateMode,
    expect_count: int,
    labels: Sequence[str] | None = None,
) -> GateResult:
    """Apply the gate. ``labels`` None means the whole catalogue."""
    result = GateResult()
    p = result.problems
    bad = _catalogue.unknown_labels(labels or ())
    if bad:
        p.append(f"unknown label(s) {bad}; known: {', '.join(_catalogue.LABELS)}")
        return result
    wanted = [label for label in _catalogue.LABELS if labels is None or label in set(labels)]
    runs: list[tuple[str, RunRecord]] = []
    for index, report in enumerate(reports):
        where = f"report {index + 1}" if len(reports) > 1 else "report"
        if report.schema_version != SCHEMA_VERSION:
            p.append(f"{where}: schema_version {report.schema_version}, this gate reads {SCHEMA_VERSION}")
        if report.suite_version != suite_version():
            p.append(
                f"{where}: produced by suite {report.suite_version}, this is {suite_version()}; "
                "verify with the suite version that ran it"
            )
        if report.catalogue_digest != _catalogue.digest():
            p.append(f"{where}: produced against another case catalogue (digest {report.catalogue_digest[:12]}...)")
        if report.selection.dry_run:
            p.append(f"{where}: a dry run (no case ran) can never pass")
        if report.selection.case_filter:
            p.append(f"{where}: a filtered run ({report.selection.case_filter}) can never pass; select whole labels")
        if report.selection.labels != wanted:
            p.append(f"{where}: labels {report.selection.labels} differ from the expected {wanted}")
        if len(report.runs) != (2 if report.provider_mode == "parity" else 1):
            p.append(f"{where}: provider_mode {report.provider_mode} with {len(report.runs)} run(s)")
        for run in report.runs:
            runs.append((f"{where} ({run.provider_mode})", run))
        for run in report.runs:
            if report.provider_mode != "parity" and run.provider_mode != report.provider_mode:
                p.append(f"{where}: a {report.provider_mode} report holds a {run.provider_mode} run")
    by_mode: dict[str, list[tuple[str, RunRecord]]] = {}
    for where, run in runs:
        by_mode.setdefault(run.provider_mode, []).append((where, run))
    needed = ["in-process", "external"] if mode == "parity" else [mode]
    structure: list[str] = []
    for m in needed:
        found = by_mode.get(m, [])
        if len(found) != 1:
            structure.append(f"{mode} verification needs exactly one {m} run; the report(s) hold {len(found)}")
    for m in by_mode:
        if m not in needed:
            structure.append(f"{mode} verification got an unexpected {m} run")
    if structure:
        p.extend(structure)
        return result
    for where, run in runs:
        _check_run(run, wanted, where, result)
    primary = by_mode["external" if mode in ("external", "parity") else "in-process"][0][1]
    if len(primary.cases) != expect_count:
        p.append(f"{primary.provider_mode} run holds {len(primary.cases)} cases, expected exactly {expect_count}")
    if mode == "parity":
        inproc = by_mode["in-process"][0][1]
        external = by_mode["external"][0][1]
        shared = {c.id for c in _catalogue.select("in-process", wanted)}
        ids_in = sorted(c.id for c in inproc.cases)
        ids_ext = sorted(c.id for c in external.cases if c.id in shared)
        if ids_in != ids_ext or len(ids_in) != len(ids_ext):
            only_in = sorted(set(ids_in) - set(ids_ext))
            only_ext = sorted(set(ids_ext) - set(ids_in))
            p.append(
                f"parity: shared case ids differ (in-process only: {only_in}; external only: {only_ext}; "
                f"counts {len(ids_in)} vs {len(ids_ext)})"
            )
        if inproc.info != external.info:
            p.append(f"parity: driver Info differs between in-process ({inproc.info}) and external ({external.info})")
        outcomes_ext = {c.id: (c.outcome, c.capability, c.refusal) for c in external.cases if c.id in shared}
        for case in inproc.cases:
            theirs = outcomes_ext.get(case.id)
            ours = (case.outcome, case.capability, case.refusal)
            if theirs is not None and theirs != ours:
                p.append(
                    f"parity: case {case.id} is {_outcome_text(ours)} in-process but {_outcome_text(theirs)} externally"
                )
        result.summary.append(
            f"parity: {len(ids_in)} shared cases identical in both modes, "
            f"{len(external.cases) - len(ids_ext)} external-only"
        )
    for where, run in runs:
        counts = Counter(c.outcome for c in run.cases)
        result.summary.append(
            f"{where}: {len(run.cases)} cases, {counts.get('passed', 0)} passed, "
            f"{counts.get('not-applicable', 0)} not applicable"
        )
    return result
