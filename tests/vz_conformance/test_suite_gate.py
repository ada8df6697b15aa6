"""verify-report: a complete, passing report passes; every hand edit that breaks a rule of the gate fails."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from suite_testlib import passing_report, passing_run
from vz_conformance import _catalogue
from vz_conformance._gate import expected_count, verify
from vz_conformance._report import CaseEntry, Report, RunRecord

FULL_EXTERNAL = expected_count("external")
FULL_IN_PROCESS = expected_count("in-process")


def _edit_run(report: Report, index: int, change: Callable[[RunRecord], RunRecord]) -> Report:
    runs = list(report.runs)
    runs[index] = change(runs[index])
    return report.model_copy(update={"runs": runs})


def _cases(run: RunRecord, cases: list[CaseEntry]) -> RunRecord:
    return run.model_copy(update={"cases": cases})


def _entry(run: RunRecord, case_id: str) -> CaseEntry:
    return next(c for c in run.cases if c.id == case_id)


def _replace(run: RunRecord, case_id: str, **changes: object) -> RunRecord:
    return _cases(run, [c.model_copy(update=changes) if c.id == case_id else c for c in run.cases])


@pytest.mark.parametrize("mode", ["in-process", "external", "parity"])
def test_complete_passing_report_passes(mode: str) -> None:
    count = FULL_IN_PROCESS if mode == "in-process" else FULL_EXTERNAL
    result = verify([passing_report(mode)], mode=mode, expect_count=count)  # type: ignore[arg-type]
    assert result.passed, result.problems
    assert result.summary


def test_parity_counts_are_the_external_catalogue_and_crash_is_external_only() -> None:
    crash = [c.id for c in _catalogue.CATALOGUE if c.label == "crash"]
    assert FULL_IN_PROCESS + len(crash) == FULL_EXTERNAL
    assert expected_count("parity") == FULL_EXTERNAL
    result = verify([passing_report("parity")], mode="parity", expect_count=FULL_EXTERNAL)
    assert any(f"{FULL_IN_PROCESS} shared cases identical" in line for line in result.summary)


def test_two_single_mode_reports_verify_as_parity() -> None:
    reports = [passing_report("in-process"), passing_report("external")]
    assert verify(reports, mode="parity", expect_count=FULL_EXTERNAL).passed


def test_parity_needs_the_same_outcome_capability_and_refusal_for_every_shared_case() -> None:
    first, second = passing_report("in-process"), passing_report("external")
    gated = next(c for c in first.runs[0].cases if c.outcome == "not-applicable")
    twin = next(c for c in second.runs[0].cases if c.id == gated.id)
    assert verify([first, second], mode="parity", expect_count=FULL_EXTERNAL).passed
    changed = twin.model_copy(update={"refusal": "another refusal"})
    second.runs[0].cases[second.runs[0].cases.index(twin)] = changed
    problems = verify([first, second], mode="parity", expect_count=FULL_EXTERNAL).problems
    assert [p for p in problems if p.startswith("parity:")] == [
        f"parity: case {gated.id} is not-applicable ({gated.capability}: {gated.refusal}) in-process but "
        f"not-applicable ({gated.capability}: another refusal) externally"
    ]


def test_a_label_run_passes_against_exactly_that_label() -> None:
    report = passing_report("external", ["exec", "cancel"])
    count = expected_count("external", ["exec", "cancel"])
    assert verify([report], mode="external", expect_count=count, labels=["cancel", "exec"]).passed
    whole = verify([report], mode="external", expect_count=count)
    assert any("labels ['exec', 'cancel'] differ" in p for p in whole.problems)


def _problems(report: Report, mode: str = "external", count: int = FULL_EXTERNAL) -> list[str]:
    result = verify([report], mode=mode, expect_count=count)  # type: ignore[arg-type]
    assert not result.passed
    return result.problems


def test_missing_case_is_rejected() -> None:
    report = _edit_run(passing_report("external"), 0, lambda r: _cases(r, r.cases[1:]))
    problems = _problems(report)
    assert any("missing: discovery.info_valid" in p for p in problems)
    assert any(f"{FULL_EXTERNAL - 1} cases, expected exactly {FULL_EXTERNAL}" in p for p in problems)


def test_duplicate_case_is_rejected() -> None:
    report = _edit_run(passing_report("external"), 0, lambda r: _cases(r, [*r.cases, r.cases[5]]))
    assert any(f"case {report.runs[0].cases[5].id} appears 2 times" in p for p in _problems(report))


def test_skipped_case_is_rejected() -> None:
    report = _edit_run(passing_report("external"), 0, lambda r: _replace(r, "exec.user", outcome="skipped", attempts=0))
    problems = _problems(report)
    assert any("exec.user ran 0 times" in p for p in problems)
    assert any("exec.user skipped" in p for p in problems)


def test_retried_case_is_rejected() -> None:
    report = _edit_run(passing_report("external"), 0, lambda r: _replace(r, "cancel.deadline", attempts=2))
    assert any("cancel.deadline ran 2 times" in p for p in _problems(report))


def test_failed_case_is_rejected_with_its_text() -> None:
    report = _edit_run(
        passing_report("external"),
        0,
        lambda r: _replace(r, "exec.argv_verbatim", outcome="failed", failure="Exec: expected X; got Y"),
    )
    assert any("exec.argv_verbatim failed: Exec: expected X; got Y" in p for p in _problems(report))


def test_count_mismatch_is_rejected() -> None:
    problems = _problems(passing_report("external"), count=FULL_EXTERNAL + 1)
    assert problems == [f"external run holds {FULL_EXTERNAL} cases, expected exactly {FULL_EXTERNAL + 1}"]


def test_parity_mismatch_is_rejected() -> None:
    report = _edit_run(
        passing_report("parity"), 0, lambda r: _cases(r, [c for c in r.cases if c.id != "lifecycle.odd_ids"])
    )
    problems = _problems(report, mode="parity")
    assert any("parity: shared case ids differ" in p and "lifecycle.odd_ids" in p for p in problems)


def test_parity_needs_both_runs() -> None:
    problems = _problems(passing_report("external"), mode="parity")
    assert any("needs exactly one in-process run" in p for p in problems)


def test_parity_rejects_different_driver_info() -> None:
    report = passing_report("parity")
    other = report.runs[1].info.model_copy(update={"driver_version": "2.0"})  # type: ignore[union-attr]
    report = _edit_run(report, 1, lambda r: r.model_copy(update={"info": other}))
    assert any("parity: driver Info differs" in p for p in _problems(report, mode="parity"))


def test_dry_run_never_passes() -> None:
    report = passing_report("external")
    report = report.model_copy(update={"selection": report.selection.model_copy(update={"dry_run": True})})
    assert any("a dry run" in p for p in _problems(report))


def test_filtered_run_never_passes() -> None:
    report = passing_report("external")
    report = report.model_copy(update={"selection": report.selection.model_copy(update={"case_filter": ["exec.*"]})})
    assert any("a filtered run" in p for p in _problems(report))


def test_not_applicable_needs_a_gating_capability_declared_absent() -> None:
    report = passing_report("external")
    declared = _edit_run(
        report,
        0,
        lambda r: _replace(
            r, "logs.merged_exact", outcome="not-applicable", capability="capabilities.logs", refusal="Logs refused"
        ),
    )
    assert any("the recorded Info declares it" in p for p in _problems(declared))
    ungated = _edit_run(
        report,
        0,
        lambda r: _replace(r, "exec.user", outcome="not-applicable", capability="capabilities.logs", refusal="refused"),
    )
    assert any(
        "exec.user not-applicable for 'capabilities.logs', which cannot gate it" in p for p in _problems(ungated)
    )
    unverified = _edit_run(report, 0, lambda r: _replace(r, "mounts.bind_read_write", refusal=None))
    assert any("without the verified refusal" in p for p in _problems(unverified))


def test_leftover_machines_are_rejected() -> None:
    report = _edit_run(
        passing_report("external"),
        0,
        lambda r: r.model_copy(update={"cleanup_problems": ["exec.user: could not delete Machine 'x'"]}),
    )
    assert any("left behind: exec.user" in p for p in _problems(report))


def test_reports_of_another_catalogue_or_suite_version_are_rejected() -> None:
    report = passing_report("external").model_copy(update={"catalogue_digest": "0" * 64, "suite_version": "0.0.1"})
    problems = _problems(report)
    assert any("another case catalogue" in p for p in problems)
    assert any("produced by suite 0.0.1" in p for p in problems)


def test_mode_mismatch_is_rejected() -> None:
    problems = _problems(passing_report("in-process"), mode="external")
    assert any("needs exactly one external run" in p for p in problems)


def test_relabelled_case_is_rejected() -> None:
    report = _edit_run(passing_report("external"), 0, lambda r: _replace(r, "exec.user", label="cancel"))
    assert any("exec.user is labelled 'cancel'" in p for p in _problems(report))


def test_unknown_label_is_refused() -> None:
    result = verify([passing_report("external")], mode="external", expect_count=1, labels=["nope"])
    assert result.problems and "unknown label" in result.problems[0]


def test_in_process_run_without_crash_cases_is_complete() -> None:
    run = passing_run("in-process")
    assert not [c for c in run.cases if c.label == "crash"]
    assert len(run.cases) == FULL_IN_PROCESS
