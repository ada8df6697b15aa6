"""linux_native and saved state: CRIU is probed on this host and the reason it cannot save is declared.

Debian 12's criu 3.17 refuses newer kernels (its ``criu check`` fails reading the vDSO); and linux_native has
no runc checkpoint/restore path yet, so ``Extensions.save_state`` is false in every case, with a reason that
says which, and a SaveState through the plugin server is UNSUPPORTED naming it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vz_core.errors import UnsupportedError
from vz_core.rpc import connect_in_process
from vz_drivers.linux_native import _criu
from vz_drivers.linux_native._driver import LinuxNativeDriver


async def test_criu_missing_is_the_reason(tmp_path: Path) -> None:
    usable, reason = await _criu.support(path=str(tmp_path))  # an empty PATH: no criu
    assert not usable and reason == "CRIU is not installed (apt-get install criu)"


async def test_criu_check_result_is_reported() -> None:
    if shutil.which("criu", path="/usr/sbin:/usr/bin:/sbin") is None:
        pytest.skip("criu is not installed (scripts/install-deps.sh installs it)")
    usable, reason = await _criu.support()
    if usable:
        assert reason  # criu's own words
    else:
        assert reason.startswith("CRIU cannot checkpoint on this host's kernel: `criu check` failed: Error")


async def test_extensions_declare_no_save_state_with_the_reason_and_save_is_unsupported(
    driver: LinuxNativeDriver,
) -> None:
    ext = await driver.extensions()
    assert ext is not None and not ext.save_state
    usable, detail = await _criu.support()
    assert ext.save_state_reason == (f"{_criu.NOT_BUILT} (CRIU here: {detail})" if usable else detail)
    async with connect_in_process(driver, name="linux_native") as remote:
        remote_ext = await remote.extensions()
        assert remote_ext is not None and remote_ext.save_state_reason == ext.save_state_reason
        with pytest.raises(UnsupportedError, match="cannot save a Machine's running state") as caught:
            await remote.save_state("ws-nosave")
        assert ext.save_state_reason in str(caught.value)
