"""linux_native's public surface and its registration (cheap: no driver code imported by registering)."""

from __future__ import annotations

import sys

import vz_drivers.linux_native as package
from vz_core.registry import DriverRegistry
from vz_drivers.linux_native import registration


def test_public_names_resolve() -> None:
    assert sorted(package.__all__) == ["DRIVER_NAME", "LinuxNativeDriver", "cleanup_state"]
    for name in package.__all__:
        assert getattr(package, name) is not None


def test_registered_under_its_name_with_a_plugin_command() -> None:
    registry = DriverRegistry(load_entry_points=False)
    registry.register(registration)
    spec = registry.get("linux_native")
    assert spec.plugin_command == ("vz-driver-linux-native",)
    assert spec.load() is package.LinuxNativeDriver
    assert "runc" in spec.options and "state_dir" in spec.options


def test_unknown_options_are_refused_by_name() -> None:
    import pytest

    from vz_core.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="bogus"):
        package.LinuxNativeDriver(bogus=1)
    assert "vz_drivers.linux_native._driver" in sys.modules
