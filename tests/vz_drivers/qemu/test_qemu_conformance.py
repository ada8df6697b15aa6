"""The qemu driver passes the whole conformance catalogue in-process and as its plugin (parity), under TCG here; the
plugin is the vz daemon's own (``--through-daemon``: launched and verified by the daemon's SessionPool).

This is the driver's acceptance command, run exactly as CI runs it for every built-in driver. It boots about a
hundred VMs, so it is the longest test of the driver (22 minutes on 2 shared cores under TCG, from an empty
private VZ_HOME).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from machine_testlib import CHECKPOINT_CASES, not_applicable, not_passed, parity_run

ADAPTER = "vz_conformance.adapters.qemu:ADAPTER"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_parity_run_of_the_whole_catalogue_passes_the_gate(tmp_path: Path) -> None:
    report = parity_run(tmp_path, "qemu", "--adapter", ADAPTER, timeout=3300, through_daemon=True)
    # qemu declares every capability but saving a running Machine (extensions.save_state is false, with its
    # reason): the checkpoint cases alone are verified refusals, and nothing fails.
    assert not_passed(report) == not_applicable(report) == CHECKPOINT_CASES, not_passed(report)
