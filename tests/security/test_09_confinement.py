"""#18 item 9: confinement of linux_native Machines.

Both profiles run under a seccomp filter modelled on Docker's default profile (default action EPERM, an
allowlist; namespace flags of ``clone``/``unshare``, ``keyctl``/``add_key``, ``bpf``, the mount family and the
like blocked), so no Machine can create a user namespace and hold all capabilities in it. The developer profile
may opt out deliberately with ``security_opt: seccomp=unconfined`` (documented in docs/drivers/linux_native.md);
the hardened profile cannot.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_drivers"))
from machine_testlib import request, sh

from vz_core.errors import InvalidArgumentError
from vz_drivers._machine import machine_key
from vz_drivers.linux_native import LinuxNativeDriver, cleanup_state
from vz_drivers.linux_native._seccomp import seccomp_profile
from vz_drivers.linux_native._spec import _capabilities

BLOCKED = (
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "mount",
    "umount2",
    "unshare",
    "setns",
    "kexec_load",
    "userfaultfd",
)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sec09-images")


@pytest.fixture
async def driver(tmp_path: Path, image_dir: Path) -> AsyncIterator[LinuxNativeDriver]:
    if os.geteuid() != 0:
        pytest.fail("linux_native needs root")
    from vz_drivers._agent import ensure_agent_binary

    options = {"image_dir": str(image_dir), "agent_binary": str(ensure_agent_binary()), "stop_timeout": 2}
    drv = LinuxNativeDriver(state_dir=tmp_path / "state", **options)
    try:
        yield drv
    finally:
        await drv.close()
        await cleanup_state(str(tmp_path / "state"), **options)


def _seccomp(driver: LinuxNativeDriver, workspace_id: str) -> dict[str, object] | None:
    # The runc spec lives in memory only (it may hold environment values): rebuild the profile the driver gave
    # runc from the Machine's record, the same function the spec builder calls.
    record = driver._backend.book.load(machine_key(workspace_id))  # type: ignore[attr-defined]
    assert record is not None
    if not record.seccomp:
        return None
    profile: dict[str, object] = seccomp_profile(_capabilities(record))
    return profile


def _allowed(profile: dict[str, object]) -> set[str]:
    rules = profile["syscalls"]
    assert isinstance(rules, list)
    return {n for r in rules if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args") for n in r["names"]}


USERNS = "unshare -Ur true; echo rc=$?"


async def test_a_hardened_machine_cannot_create_a_user_namespace(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("hard", labels=("vz.profile=hardened",)))
    result = await sh(driver, "hard", USERNS)
    assert b"rc=0" not in result.stdout, result
    assert b"rc=" in result.stdout
    # The filter is in force for the Machine's init and everything it starts.
    status = await sh(driver, "hard", "grep ^Seccomp: /proc/1/status /proc/self/status")
    assert status.stdout.count(b"\t2") == 2, status
    profile = _seccomp(driver, "hard")
    assert profile is not None and profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert not _allowed(profile) & set(BLOCKED)


async def test_the_hardened_profile_cannot_opt_out(driver: LinuxNativeDriver) -> None:
    with pytest.raises(InvalidArgumentError, match="seccomp"):
        await driver.run_image(
            request("hard-out", labels=("vz.profile=hardened",), security_opt=("seccomp=unconfined",))
        )
    assert await driver.find("hard-out") is None


async def test_a_developer_machine_is_filtered_too(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("dev"))
    result = await sh(driver, "dev", USERNS)
    assert b"rc=" in result.stdout and b"rc=0" not in result.stdout, result
    profile = _seccomp(driver, "dev")
    assert profile is not None and not _allowed(profile) & set(BLOCKED)


async def test_a_developer_machine_may_opt_out_deliberately(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("dev-out", security_opt=("seccomp=unconfined",)))
    assert _seccomp(driver, "dev-out") is None
    status = await sh(driver, "dev-out", "grep ^Seccomp: /proc/1/status")
    assert status.stdout.endswith(b"\t0\n"), status
