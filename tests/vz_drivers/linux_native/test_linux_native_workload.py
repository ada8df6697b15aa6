"""Setup steps and services of linux_native Machines through the real `vz` (see workload_testlib)."""

from __future__ import annotations

from pathlib import Path

import pytest
from workload_testlib import check_workload_through_vz

pytestmark = pytest.mark.root


def test_setup_and_services_through_vz(tmp_path: Path) -> None:
    check_workload_through_vz(tmp_path, "linux_native")
