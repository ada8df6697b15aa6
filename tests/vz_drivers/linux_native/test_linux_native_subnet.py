"""The Machine subnet (a host-scoped option): special-purpose or host-routed ranges are refused before anything
exists on the host (no nftables table, no link)."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from pathlib import Path

import pytest

from vz_core.errors import InvalidArgumentError
from vz_drivers.linux_native import LinuxNativeDriver
from vz_drivers.linux_native._network import check_subnet, host_routes, host_table_name


def _tables() -> str:
    nft = shutil.which("nft")
    if nft is None:
        pytest.fail("nft is missing: apt-get install nftables")
    return subprocess.run([nft, "list", "tables"], capture_output=True, text=True, check=True).stdout


@pytest.mark.host_exclusive  # compares every nft table of the host before and after
@pytest.mark.parametrize(
    ("subnet", "why"),
    [
        ("127.0.0.0/16", "loopback"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("224.0.0.0/16", "multicast"),
        ("240.0.0.0/16", "reserved"),
        ("255.255.255.0/28", "reserved"),
        ("0.0.0.0/16", "this network"),
    ],
)
def test_special_ranges_are_refused_and_leave_nothing(subnet: str, why: str, tmp_path: Path) -> None:
    before = _tables()
    with pytest.raises(InvalidArgumentError, match=why) as info:
        LinuxNativeDriver(state_dir=tmp_path / "state", subnet=subnet)
    assert info.value.details["option"] == "subnet"
    assert _tables() == before
    assert host_table_name(ipaddress.IPv4Network(subnet)) not in _tables()
    assert not (tmp_path / "state").exists()


def test_a_range_the_host_routes_is_refused() -> None:
    routes = [("eth0", ipaddress.IPv4Network("192.168.40.0/24")), ("vzabc", ipaddress.IPv4Network("10.231.0.4/30"))]
    with pytest.raises(ValueError, match=r"192\.168\.40\.0/24 on eth0"):
        check_subnet(ipaddress.IPv4Network("192.168.0.0/16"), routes)
    # Routes through vz's own veth ends are Machines on the same subnet, not a conflict.
    check_subnet(ipaddress.IPv4Network("10.231.0.0/16"), routes)


def test_the_hosts_own_routes_are_read() -> None:
    routes = host_routes()
    assert all(net.prefixlen > 0 for _, net in routes), "the default route is never a conflict"
    for dev, net in routes:
        if not dev.startswith("vz"):
            with pytest.raises(InvalidArgumentError, match="host route"):
                LinuxNativeDriver(subnet=str(net.supernet(new_prefix=max(net.prefixlen - 1, 1))))
            break


def test_bad_syntax_and_tiny_ranges_are_refused(tmp_path: Path) -> None:
    for subnet in ("10.0.0.0/33", "not-a-subnet", "10.231.0.0/29"):
        with pytest.raises(InvalidArgumentError, match="subnet"):
            LinuxNativeDriver(state_dir=tmp_path / "state", subnet=subnet)
