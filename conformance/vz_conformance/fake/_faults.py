"""Fault modes of the reference fake driver: each one breaks exactly one rule of the contract.

The conformance suite is tested against the fake with every mode in turn; a mode must make exactly the checks
of the rule it breaks fail. Plugin-level modes (the first three) act in the plugin entry point, the others
inside ``FakeDriver``. ``docs/fake-driver.md`` describes each mode and the rule it breaks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from vz_core.errors import UserError

__all__ = ["FAULT_DESCRIPTIONS", "FAULT_MODES", "PLUGIN_FAULTS", "check_faults"]

FAULT_DESCRIPTIONS: Mapping[str, str] = MappingProxyType(
    {
        # Plugin process (vz-driver-fake only; no effect on an in-process FakeDriver).
        "crash-before-handshake": "the plugin writes one line to stderr and exits 3 before its handshake line",
        "crash-after-handshake": "the plugin exits 3 right after printing its handshake line",
        "never-handshake": "the plugin never prints a handshake line and waits until it is killed",
        # Info / discovery.
        "crash-during-info": "the process exits 3 inside Info",
        "incompatible-version": "Info answers api_major = 2",
        "malformed-info": "Info answers an empty driver_name",
        "unknown-enum-info": "Info advertises the unknown mount type value 99",
        "failing-preflight": "Preflight fails with RUNTIME_FAILURE",
        # Lifecycle.
        "failing-run": "RunImage fails with RUNTIME_FAILURE after validation (nothing is created)",
        "stop-not-idempotent": "Stop on a stopped Machine fails with FAILED_PRECONDITION",
        "delete-not-idempotent": "Delete of a missing Machine fails with NOT_FOUND",
        "missing-not-found": "Start and Stop on a missing Machine succeed silently",
        "runimage-overwrites": "RunImage on an existing Machine without allow_recreate silently replaces it",
        "raw-id-paths": "Machine directories are named by the raw id, '/' replaced by '_' ('a/b' and 'a_b' collide)",
        "find-stale-status": "Stop does not change the status Find reports",
        # Reuse / recreate.
        "reuse-ignores-identity": "ReusePreflight never compares the developer identity",
        "recreate-before-validate": "RunImage with allow_recreate deletes the old Machine before validating",
        # Exec.
        "crash-mid-exec": "the process exits 3 after the first output frame of an exec",
        "exec-missing-exit": "exec streams end without an exit event",
        "exec-frame-after-exit": "exec streams send one extra stdout chunk after the exit event",
        "exec-oversized-chunks": "exec output chunks are up to 65536 bytes (when the output allows)",
        "exec-empty-chunk": "every exec stream starts with one zero-length stdout chunk",
        "exec-merge-streams": "exec stderr data is delivered as stdout",
        "exec-shell-reparse": "exec runs ' '.join(argv) through 'sh -c' instead of the argv verbatim",
        "exec-ignore-cancel": "a cancelled exec stops reading but leaves the command and its children running",
        # Terminal sessions (ExecPty).
        "pty-ignores-size": "terminal sessions start at 24x80 whatever size the start asked for",
        "pty-ignores-resize": "terminal resize frames are dropped",
        "pty-no-echo": "terminal sessions start with echo off",
        "pty-no-controlling-terminal": (
            "the terminal command's session has no controlling terminal (Ctrl-C reaches nobody)"
        ),
        "pty-drops-ctrl-d": "Ctrl-D (0x04) bytes of terminal input are dropped",
        "pty-exit-zero": "terminal sessions always report exit code 0",
        "pty-drops-output": "past the first 64 KiB of terminal output, one output chunk in 8 is dropped",
        "pty-leaves-session": (
            "a closed terminal session kills only the command; the rest of its session (SIGHUP ignored) keeps running"
        ),
        # Route-domain attachment (label vz.network).
        "network-no-resolv": "a Machine with the vz.network label gets no resolv.conf naming its DNS server",
        "network-not-reattached": "Start of a Machine with the vz.network label does not join it to its route domain",
        # Saved state (SaveState / RestoreState).
        "save-fails": "SaveState kills the Machine's processes instead of keeping them, and reports the save",
        "restore-fails": "RestoreState discards the saved processes and boots the Machine fresh, reporting a resume",
        "state-file-corrupt": (
            "RestoreState trusts a state file that fails its checks: it boots the Machine fresh and reports a resume"
        ),
        # Logs.
        "logs-wrong-chunks": "Logs chunks are up to 65536 bytes",
        "logs-stopped-refused": "Logs on a stopped Machine fails with FAILED_PRECONDITION instead of answering",
        "logs-starts-machine": "Logs on a stopped Machine starts it first",
        # Services (SetServices).
        "service-crashes": "every service process is killed (SIGKILL) 0.3 s after it starts, as if it crashed",
        "health-never-passes": "health checks never pass: a service with one never becomes healthy",
    }
)
"""Every fault mode name → one line saying what it does."""

FAULT_MODES: frozenset[str] = frozenset(FAULT_DESCRIPTIONS)
"""Every valid fault mode name."""

PLUGIN_FAULTS: frozenset[str] = frozenset({"crash-before-handshake", "crash-after-handshake", "never-handshake"})
"""Modes handled by the plugin entry point rather than by ``FakeDriver``."""


def check_faults(names: Iterable[str]) -> frozenset[str]:
    """The given fault names as a set; an unknown name raises ``UserError`` listing the valid ones."""
    faults = frozenset(names)
    unknown = sorted(faults - FAULT_MODES)
    if unknown:
        raise UserError(
            f"unknown fault mode{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"valid fault modes: {', '.join(sorted(FAULT_MODES))}"
        )
    return faults
