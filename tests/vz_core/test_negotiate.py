from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest

from vz_core import Capabilities, DriverInfo, MountType, RecreateMode
from vz_core.errors import IncompatibleVersionError
from vz_core.negotiate import validate_info

GOOD = DriverInfo(
    driver_name="acme",
    driver_version="1.0",
    runtime_name="acme-rt",
    runtime_version="",
    capabilities=Capabilities(mount_types=(MountType.BIND, MountType.VOLUME, MountType.TMPFS)),
    api_major=1,
    api_minor=3,
)


def _with(info: DriverInfo = GOOD, caps: dict[str, Any] | None = None, **fields: Any) -> DriverInfo:
    if caps is not None:
        assert info.capabilities is not None
        fields["capabilities"] = dataclasses.replace(info.capabilities, **caps)
    return dataclasses.replace(info, **fields)


@pytest.mark.parametrize(
    ("info", "offered"),
    [
        pytest.param(GOOD, True, id="1.3-full"),
        pytest.param(_with(api_minor=0), True, id="1.0"),
        pytest.param(_with(api_minor=17), True, id="future-minor"),
        pytest.param(_with(caps={"reuse_preflight": True}, api_minor=2), False, id="reuse-at-1.2"),
        pytest.param(_with(caps={"recreate_mode": RecreateMode.ON_RUN}), True, id="on-run-offered"),
        pytest.param(_with(caps={"recreate_mode": RecreateMode.STOP}), False, id="stop"),
        pytest.param(_with(caps={"mount_types": ()}), False, id="no-mounts"),
    ],
)
def test_usable_info_is_accepted(info: DriverInfo, offered: bool) -> None:
    assert validate_info(info, offered_recreate_on_run=offered) is info


@pytest.mark.parametrize(
    ("info", "offered", "field", "fragment"),
    [
        pytest.param(_with(api_major=2), True, "api_major", "speaks Runtime Protocol 2.3", id="major-2"),
        pytest.param(_with(api_major=0), True, "api_major", "speaks Runtime Protocol 0.3", id="major-0"),
        pytest.param(_with(driver_name=""), True, "driver_name", "driver_name is empty", id="empty-driver-name"),
        pytest.param(_with(driver_version=""), True, "driver_version", "driver_version is empty", id="empty-version"),
        pytest.param(_with(runtime_name=""), True, "runtime_name", "runtime_name is empty", id="empty-runtime"),
        pytest.param(_with(capabilities=None), True, "capabilities", "capabilities are missing", id="no-caps"),
        pytest.param(
            _with(caps={"recreate_mode": RecreateMode.UNSPECIFIED}),
            True,
            "capabilities.recreate_mode",
            "UNSPECIFIED",
            id="recreate-unspecified",
        ),
        pytest.param(
            _with(caps={"recreate_mode": cast(RecreateMode, 7)}),
            True,
            "capabilities.recreate_mode",
            "unknown value 7",
            id="recreate-unknown",
        ),
        pytest.param(
            _with(caps={"mount_types": (MountType.BIND, cast(MountType, 99))}),
            True,
            "capabilities.mount_types",
            "unknown value 99",
            id="mount-unknown",
        ),
        pytest.param(
            _with(caps={"mount_types": (MountType.UNSPECIFIED,)}),
            True,
            "capabilities.mount_types",
            "UNSPECIFIED",
            id="mount-unspecified",
        ),
        pytest.param(
            _with(caps={"reuse_preflight": True}, api_minor=1),
            True,
            "capabilities.reuse_preflight",
            "needs 1.2",
            id="reuse-before-1.2",
        ),
        pytest.param(
            _with(caps={"recreate_mode": RecreateMode.ON_RUN}, api_minor=2),
            True,
            "capabilities.recreate_mode",
            "needs 1.3",
            id="on-run-before-1.3",
        ),
        pytest.param(
            _with(caps={"recreate_mode": RecreateMode.ON_RUN}),
            False,
            "capabilities.recreate_mode",
            "did not offer",
            id="on-run-not-offered",
        ),
    ],
)
def test_unusable_info_is_refused_naming_the_field(info: DriverInfo, offered: bool, field: str, fragment: str) -> None:
    with pytest.raises(IncompatibleVersionError) as caught:
        validate_info(info, offered_recreate_on_run=offered)
    assert fragment in str(caught.value)
    assert caught.value.details["field"] == field
    assert caught.value.code == "INCOMPATIBLE_VERSION"


def test_major_mismatch_message_is_actionable() -> None:
    with pytest.raises(IncompatibleVersionError, match=r"install a release of the driver for API 1"):
        validate_info(_with(api_major=2), offered_recreate_on_run=True)
