"""Setup steps and services of a qemu Machine (a real VM under TCG) through the real `vz` (see workload_testlib).
One Machine is booted for the whole scenario."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from workload_testlib import check_workload_through_vz


def test_setup_and_services_through_vz(tmp_path: Path) -> None:
    if shutil.which("qemu-system-x86_64") is None or not list(Path("/boot").glob("vmlinuz-*")):
        pytest.fail("qemu-system-x86_64 and a guest kernel in /boot are needed (apt-get install qemu-system-x86)")
    check_workload_through_vz(tmp_path, "qemu")
