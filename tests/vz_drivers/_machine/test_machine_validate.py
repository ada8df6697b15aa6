"""Shared RunImage validation of agent-Machine drivers: reserved targets (also '//'-prefixed), users, names."""

from __future__ import annotations

from pathlib import Path

import pytest

from vz_core import Mount, MountType, RunImageRequest
from vz_core.errors import InvalidArgumentError, UnsupportedError
from vz_drivers._machine import Rules, check_target, check_user_syntax, validate_common

RULES = Rules(
    display="test driver",
    architecture="amd64",
    cpus=4,
    memory_bytes=1 << 34,
    min_memory_bytes=32 << 20,
    min_memory_why="32 MiB",
    profiles=("developer",),
)


@pytest.mark.parametrize(
    "target",
    [
        "/proc",
        "//proc",
        "///proc/sys",
        "//.vz",
        "//.vz/run",
        "/.vz",
        "//dev",
        "/dev/shm",
        "//sys",
        "/sys/./fs",
        "/./proc",
    ],
)
def test_reserved_targets_are_refused_however_written(target: str) -> None:
    with pytest.raises(InvalidArgumentError, match="reserved"):
        check_target(target, "mounts[0]")


@pytest.mark.parametrize(("target", "norm"), [("//data", "/data"), ("/data/", "/data"), ("/a/./b", "/a/b")])
def test_targets_are_normalized(target: str, norm: str) -> None:
    assert check_target(target, "mounts[0]") == norm


@pytest.mark.parametrize("target", ["", "relative", "/a/../proc", "/", "//", "/a\x00b"])
def test_bad_targets_are_refused(target: str) -> None:
    with pytest.raises(InvalidArgumentError):
        check_target(target, "mounts[0]")


def test_a_workspace_at_a_double_slash_reserved_target_fails_before_anything(tmp_path: Path) -> None:
    req = RunImageRequest(
        workspace_id="w", image="vz:default", workspace_mount=Mount(MountType.BIND, str(tmp_path), "//sys")
    )
    with pytest.raises(InvalidArgumentError, match="reserved") as info:
        validate_common(req, RULES)
    assert info.value.details["field"] == "workspace_mount"


@pytest.mark.parametrize("user", ["root\n", "a:b\n", "na me", ":g", "x" * 70])
def test_malformed_users_are_refused(user: str) -> None:
    with pytest.raises(InvalidArgumentError):
        check_user_syntax(user, field="user")


@pytest.mark.parametrize("user", ["", "root", "1000", "1000:1000", "dev:staff", "machine$"])
def test_valid_users_pass(user: str) -> None:
    check_user_syntax(user, field="user")


def test_environment_names_and_values_are_checked() -> None:
    for env in ({"A\n=": "x"}, {"": "x"}, {"A": "x\x00y"}):
        with pytest.raises(InvalidArgumentError, match="environment"):
            validate_common(RunImageRequest(workspace_id="w", image="vz:default", environment=env), RULES)


def test_a_known_profile_the_backend_lacks_is_unsupported_an_unknown_one_invalid() -> None:
    with pytest.raises(UnsupportedError, match="hardened"):
        validate_common(RunImageRequest(workspace_id="w", image="i", labels=("vz.profile=hardened",)), RULES)
    with pytest.raises(InvalidArgumentError, match="paranoid"):
        validate_common(RunImageRequest(workspace_id="w", image="i", labels=("vz.profile=paranoid",)), RULES)


def test_volume_names_end_without_a_newline() -> None:
    req = RunImageRequest(workspace_id="w", image="i", mounts=(Mount(MountType.VOLUME, "data\n", "/data"),))
    with pytest.raises(InvalidArgumentError, match="volume name"):
        validate_common(req, RULES)


def test_the_route_domain_label_is_refused_unless_the_backend_joins_route_domains() -> None:
    from dataclasses import replace

    from vz_drivers.linux_native._host import host_facts
    from vz_drivers.linux_native._validate import rules_for as linux_native_rules
    from vz_drivers.qemu._validate import HostLimits
    from vz_drivers.qemu._validate import rules_for as qemu_rules

    request = RunImageRequest(workspace_id="w", image="vz:default", labels=('vz.network={"v":1}',))
    with pytest.raises(UnsupportedError, match=r"label vz\.network .*not supported by test driver") as info:
        validate_common(request, RULES)
    assert info.value.details == {"field": "labels", "label": "vz.network"}
    # A backend that joins route domains leaves the label to its own parser (vz_core.network.label).
    assert validate_common(request, replace(RULES, route_domains=True)).labels["vz.network"] == '{"v":1}'
    assert linux_native_rules(host_facts()).route_domains
    assert qemu_rules(HostLimits(cpus=2, memory_bytes=1 << 30)).route_domains
