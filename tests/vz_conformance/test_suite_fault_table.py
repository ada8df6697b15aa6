"""Each fault mode of the reference fake driver makes exactly its intended cases fail, and no others.

Every row runs the *whole* catalogue of its mode with one fault and compares the set of failed cases with the
table: a fault that makes an extra case fail, or misses one, fails the row. Driver-level faults run in-process
(about 5 s a row; the exec-ignore-cancel and exec-shell-reparse rows take longer because those cases wait
out their 10 s windows). Plugin-level faults run through the real supervisor; a plugin that cannot be
connected (it dies, hangs, or answers an Info the host refuses) fails every case, because nothing of the
driver under test can be checked. The plugin-level faults also run in-process, where they must change nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from suite_testlib import fake_providers
from vz_conformance import _catalogue
from vz_conformance._runner import run_suite
from vz_conformance.adapters import FakeAdapter
from vz_conformance.fake import FAULT_MODES

ALL_EXTERNAL = frozenset(c.id for c in _catalogue.select("external"))

# Every case that needs a command's exit frame (the malformed cases judge refusals, not exits).
NEEDS_AN_EXIT = frozenset(
    {
        "cancel.blocked_stdin",  # the follow-up command proving the Machine still runs
        "cancel.cancelled",
        "cancel.deadline",
        "checkpoint.corrupt_refused",  # the counter is read through Exec
        "checkpoint.delete_removes_state",
        "checkpoint.resume_keeps_process",
        "exec.argv_verbatim",
        "exec.binary_roundtrip",
        "exec.duplex_backpressure",
        "exec.early_exit",
        "exec.empty_stdin",
        "exec.environment",
        "exec.local_cancelled",
        "exec.local_exit_code",
        "exec.local_file_to_file",
        "exec.local_frames",
        "exec.local_pipe_to_pipe",
        "exec.local_signal_exit",
        "exec.nonzero_exit",
        "exec.output_frames",
        "exec.shell_command",
        "exec.signal_exit",
        "exec.stdin_to_stderr",
        "exec.user",
        "exec.workdir",
        "lifecycle.odd_ids",  # Machine-local marker files
        "network.paths",
        "network.dns",
        "network.import",
        "network.offline",
        "network.allowlist_cidr",
        "network.allowlist_domain",
        "network.cross_environment",
        "network.after_restart",
        "recreate.invalid_keeps_running",
        "recreate.invalid_keeps_stopped",
        "recreate.valid_replaces",
        "storage.local_gone_after_recreate",
        "storage.local_survives_restart",
    }
)

# Every case that works on a Machine it created: a RunImage that always fails breaks all of them.
NEEDS_A_MACHINE = NEEDS_AN_EXIT | frozenset(
    {
        "exec.local_stopped_refused",
        "exec.local_terminal_refused",
        "identity.reuse_cancelled",
        "identity.reuse_changed",
        "identity.reuse_same",
        "lifecycle.already_exists",
        "lifecycle.delete_idempotent",
        "lifecycle.run_find_running",
        "lifecycle.start_idempotent",
        "lifecycle.stop_idempotent",
        "lifecycle.stopped_exec_refused",
        "logs.chunk_sizes",
        "logs.kept_after_stop",
        "logs.merged_exact",
        "malformed.data_after_close",
        "malformed.empty_argv",
        "malformed.empty_data_frame",
        "malformed.eof_before_close",
        "malformed.missing_start",
        "malformed.second_start",
        "malformed.tty",
        "malformed.unset_payload",
        "network.export",  # the Machine's service
        "pty.bulk_output",
        "pty.cancel",
        "pty.ctrl_c",
        "pty.echo",
        "pty.eof",
        "pty.exit_code",
        "pty.resize",
        "pty.size",
        "services.health_and_order",  # services run in a Machine
        "services.restart_policies",
        "services.supervised",
    }
)

# Every case whose argv breaks when joined with spaces and re-read by a shell: scripts with positional
# arguments (sh -c SCRIPT sh ARG...), printf's NUL format, quoted scripts.
BROKEN_BY_SHELL_REPARSING = frozenset(
    {
        "cancel.blocked_stdin",
        "cancel.cancelled",
        "cancel.deadline",
        "checkpoint.corrupt_refused",  # sh -c SCRIPT sh NAME reads the counter
        "checkpoint.delete_removes_state",
        "checkpoint.resume_keeps_process",
        "exec.argv_verbatim",
        "exec.duplex_backpressure",  # 'sh -c "tee /dev/stderr"' becomes 'sh -c tee' with $0=/dev/stderr
        "exec.local_cancelled",
        "exec.local_exit_code",
        "exec.local_frames",
        "exec.local_signal_exit",  # 'sh -c "kill -TERM $$"' becomes 'sh -c kill' with $0=-TERM: no signal
        "exec.nonzero_exit",
        "exec.output_frames",
        "exec.shell_command",
        "exec.signal_exit",
        "lifecycle.odd_ids",
        "network.paths",  # sh -c SCRIPT sh ARG...
        "network.dns",
        "network.export",
        "network.import",
        "network.offline",
        "network.allowlist_cidr",
        "network.allowlist_domain",
        "network.cross_environment",
        "network.after_restart",
        "recreate.invalid_keeps_running",
        "recreate.invalid_keeps_stopped",
        "recreate.valid_replaces",
        "storage.local_gone_after_recreate",
        "storage.local_survives_restart",
    }
)

# Every case whose commands print something before they end: the plugin dies after an exec's first output
# frame. (crash.mid_exec's own victim dies mid-output too, but not always in a way the case can tell: its row.)
PRINTS_BEFORE_ITS_END = frozenset(
    {
        "cancel.cancelled",
        "cancel.deadline",
        "checkpoint.corrupt_refused",  # the counter's value
        "checkpoint.delete_removes_state",
        "checkpoint.resume_keeps_process",
        "crash.mid_exec",
        "exec.argv_verbatim",
        "exec.binary_roundtrip",
        "exec.duplex_backpressure",
        "exec.environment",
        "exec.local_exit_code",
        "exec.local_file_to_file",
        "exec.local_frames",
        "exec.local_pipe_to_pipe",
        "exec.nonzero_exit",
        "exec.output_frames",
        "exec.shell_command",
        "exec.stdin_to_stderr",
        "exec.user",
        "exec.workdir",
        "lifecycle.odd_ids",
        "network.after_restart",  # a refused connection's diagnostic (nc on stderr)
        "network.allowlist_cidr",
        "network.allowlist_domain",
        "network.dns",  # nslookup's answer
        "network.import",
        "network.offline",
        "network.paths",
        "recreate.invalid_keeps_running",
        "recreate.invalid_keeps_stopped",
        "storage.local_survives_restart",
    }
)


@dataclass(frozen=True)
class Row:
    fault: str
    mode: str
    fails: frozenset[str]
    either: frozenset[str] = field(default_factory=frozenset)
    """Cases whose result depends on a race the fault itself creates (stated per row, with the reason)."""


# exec.local_frames reaches the in-process driver through a RemoteDriver (the Exec-frame path), which negotiates
# Info as every host does: an Info the host refuses stops it there, as it stops every case externally.
INFO_REFUSED_IN_PROCESS = frozenset({"discovery.info_valid", "exec.local_frames"})

TABLE = (
    Row("failing-preflight", "in-process", frozenset({"discovery.preflight"})),
    Row("incompatible-version", "in-process", INFO_REFUSED_IN_PROCESS),
    Row("malformed-info", "in-process", INFO_REFUSED_IN_PROCESS),
    Row("unknown-enum-info", "in-process", INFO_REFUSED_IN_PROCESS),
    Row("failing-run", "in-process", NEEDS_A_MACHINE),
    Row("stop-not-idempotent", "in-process", frozenset({"lifecycle.stop_idempotent"})),
    Row("delete-not-idempotent", "in-process", frozenset({"lifecycle.delete_idempotent"})),
    Row("missing-not-found", "in-process", frozenset({"lifecycle.missing_not_found"})),
    Row("runimage-overwrites", "in-process", frozenset({"lifecycle.already_exists"})),
    Row("raw-id-paths", "in-process", frozenset({"lifecycle.odd_ids"})),
    Row(
        "find-stale-status",
        "in-process",
        frozenset(
            {
                "lifecycle.stop_idempotent",
                "lifecycle.stopped_exec_refused",
                "lifecycle.odd_ids",
                "logs.kept_after_stop",
                "recreate.invalid_keeps_stopped",
            }
        ),
    ),
    Row("reuse-ignores-identity", "in-process", frozenset({"identity.reuse_changed"})),
    Row(
        "recreate-before-validate",
        "in-process",
        frozenset({"recreate.invalid_keeps_running", "recreate.invalid_keeps_stopped"}),
    ),
    Row("exec-missing-exit", "in-process", NEEDS_AN_EXIT),
    Row("exec-frame-after-exit", "in-process", frozenset({"exec.output_frames"})),
    Row("exec-oversized-chunks", "in-process", frozenset({"exec.output_frames", "exec.duplex_backpressure"})),
    Row("exec-empty-chunk", "in-process", frozenset({"exec.output_frames", "exec.duplex_backpressure"})),
    Row(
        "exec-merge-streams",
        "in-process",
        frozenset(
            {
                "exec.stdin_to_stderr",
                "exec.nonzero_exit",
                "exec.output_frames",
                "exec.duplex_backpressure",
                "exec.local_exit_code",  # its diagnostic must arrive on the stderr pipe
                "exec.local_frames",
            }
        ),
    ),
    Row("exec-shell-reparse", "in-process", BROKEN_BY_SHELL_REPARSING),
    Row(
        "exec-ignore-cancel",
        "in-process",
        frozenset({"cancel.cancelled", "cancel.deadline", "cancel.blocked_stdin", "exec.local_cancelled"}),
    ),
    Row("pty-ignores-size", "in-process", frozenset({"pty.size"})),
    Row("pty-ignores-resize", "in-process", frozenset({"pty.resize"})),
    Row("pty-no-echo", "in-process", frozenset({"pty.echo"})),
    # Without a controlling terminal the line discipline has no foreground group to signal: no SIGINT, no SIGWINCH.
    Row("pty-no-controlling-terminal", "in-process", frozenset({"pty.ctrl_c", "pty.resize"})),
    Row("pty-drops-ctrl-d", "in-process", frozenset({"pty.eof"})),
    Row("pty-exit-zero", "in-process", frozenset({"pty.exit_code"})),
    Row("pty-drops-output", "in-process", frozenset({"pty.bulk_output"})),
    Row("pty-leaves-session", "in-process", frozenset({"pty.cancel"})),
    Row("network-no-resolv", "in-process", frozenset({"network.dns", "network.allowlist_domain"})),
    Row("network-not-reattached", "in-process", frozenset({"network.after_restart"})),
    Row("logs-wrong-chunks", "in-process", frozenset({"logs.chunk_sizes"})),
    Row("logs-stopped-refused", "in-process", frozenset({"logs.kept_after_stop"})),
    Row("logs-starts-machine", "in-process", frozenset({"logs.kept_after_stop"})),
    Row("save-fails", "in-process", frozenset({"checkpoint.resume_keeps_process"})),
    Row("restore-fails", "in-process", frozenset({"checkpoint.resume_keeps_process"})),
    Row("state-file-corrupt", "in-process", frozenset({"checkpoint.corrupt_refused"})),
    # A service killed 0.3 s after each start never stays running; its dependents' health ordering breaks too.
    # The restart case's commands exit by themselves before the kill.
    Row("service-crashes", "in-process", frozenset({"services.supervised", "services.health_and_order"})),
    Row("health-never-passes", "in-process", frozenset({"services.health_and_order"})),
    # Plugin-process faults: nothing in-process ...
    Row("crash-before-handshake", "in-process", frozenset()),
    Row("crash-after-handshake", "in-process", frozenset()),
    Row("never-handshake", "in-process", frozenset()),
    # ... and, through the supervisor, a driver that cannot be connected fails every case.
    Row("crash-before-handshake", "external", ALL_EXTERNAL),
    Row("crash-after-handshake", "external", ALL_EXTERNAL),
    Row("never-handshake", "external", ALL_EXTERNAL),
    Row("crash-during-info", "external", ALL_EXTERNAL),
    Row("incompatible-version", "external", ALL_EXTERNAL),
    Row("malformed-info", "external", ALL_EXTERNAL),
    Row("unknown-enum-info", "external", ALL_EXTERNAL),
    # The plugin dies after the first output frame of any exec. cancel.blocked_stdin prints 'pid' and 'ready'
    # as its first output: whether the crash or the suite's cancellation reaches the call first decides it.
    # exec.local_cancelled too: the first output chunk may hold every 'pid' line and 'ready', and it is in the
    # suite's pipe before the plugin dies, so whether the death or the cancellation reaches the call first decides.
    # crash.mid_exec kills the plugin itself once 'ready' and every 'pid' line arrived: when the first frame held
    # them all, the fault's own exit is the kill the case makes, and the case passes if it sees the command's tree
    # alive before the supervisor has removed it (and fails when the supervisor was first).
    Row(
        "crash-mid-exec",
        "external",
        PRINTS_BEFORE_ITS_END - {"crash.mid_exec"},
        either=frozenset({"cancel.blocked_stdin", "exec.local_cancelled", "crash.mid_exec"}),
    ),
)


def test_every_fault_mode_has_a_row_and_every_row_names_real_cases() -> None:
    assert {row.fault for row in TABLE} == set(FAULT_MODES)
    for row in TABLE:
        known = {c.id for c in _catalogue.select(row.mode)}  # type: ignore[arg-type]
        assert row.fails <= known, sorted(row.fails - known)
        assert row.either <= known and not row.either & row.fails


@pytest.mark.slow
@pytest.mark.parametrize("row", TABLE, ids=[f"{row.fault}-{row.mode}" for row in TABLE])
def test_fault_fails_exactly_its_cases(row: Row, tmp_path: Path) -> None:
    in_process, external = fake_providers(tmp_path / "state", faults=(row.fault,), handshake_timeout=3.0)
    provider = in_process if row.mode == "in-process" else external
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    report = asyncio.run(run_suite([provider], FakeAdapter(), scratch=scratch))
    run = report.runs[0]
    failed = {c.id for c in run.cases if c.outcome == "failed"} - row.either
    texts = {c.id: (c.failure or "").splitlines()[0] for c in run.cases if c.outcome == "failed"}
    unexpected = {case_id: texts[case_id] for case_id in sorted(failed - row.fails)}
    missed = sorted(row.fails - failed)
    assert not unexpected and not missed, (
        f"{row.fault}: failed but not in the table: {unexpected}; in the table but passed: {missed}"
    )
    assert len(run.cases) == len(_catalogue.select(row.mode))  # type: ignore[arg-type]
    assert {c.outcome for c in run.cases if c.id not in failed | row.either} <= {"passed", "not-applicable"}
    assert run.cleanup_problems == []
