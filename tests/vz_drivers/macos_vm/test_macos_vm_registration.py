"""macos_vm's declaration: valid, DEV for darwin hosts and targets only, in step with the backend's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from vz_core.errors import InvalidArgumentError
from vz_drivers.macos_vm._backend import MacosVmBackend
from vz_drivers.macos_vm.registration import DECLARATION, build_parser, vz_builtin_drivers


def test_the_declaration_is_valid_and_dev_on_macos_only() -> None:
    assert DECLARATION.problems() == []
    assert vz_builtin_drivers() == [DECLARATION]
    assert DECLARATION.targets == ("darwin",)
    assert [(r.host_os, r.target_os, r.status) for r in DECLARATION.matrix] == [("darwin", "darwin", "DEV")]
    assert "not verified on a Mac" in DECLARATION.matrix[0].note
    assert DECLARATION.plugin_command == ("vz-driver-macos-vm",)


def test_declared_options_are_exactly_what_the_backend_takes(tmp_path: Path) -> None:
    assert MacosVmBackend.declaration is DECLARATION
    with pytest.raises(InvalidArgumentError) as info:
        MacosVmBackend({"state_dir": str(tmp_path), "bogus": "1"})
    assert info.value.message == DECLARATION.unknown_keys_message(["bogus"])
    assert info.value.details["option"] == "bogus"


def test_host_options_cannot_come_from_a_project_file() -> None:
    scopes = {o.name: o.scope for o in DECLARATION.declared_options.values()}
    for name in ("allow_unpinned", "allow_unpinned_in_ci", "bases_file", "agent_binary", "python", "state_dir"):
        assert scopes[name] == "host", name
    assert scopes["stop_mode"] == "project"


def test_the_plugin_command_line_is_generated() -> None:
    parser = build_parser()
    args = parser.parse_args(["--state-dir", "/s", "--allow-unpinned", "true", "--stop-mode", "save"])
    assert DECLARATION.plugin_options(parser, args) == {"state_dir": "/s", "allow_unpinned": True, "stop_mode": "save"}


def test_registered_it_shows_as_dev_in_the_capability_matrix() -> None:
    from vz_core import capability_matrix
    from vz_core.registry import DriverRegistry
    from vz_drivers.macos_vm import registration

    registry = DriverRegistry(load_entry_points=False)
    registry.register(registration)
    rows = [e for e in capability_matrix.entries(registry) if e.driver == "macos_vm"]
    assert [(e.host_os, e.target_os, e.status) for e in rows] == [("darwin", "darwin", "DEV")]
    found = capability_matrix.lookup("macos_vm", "darwin", "darwin", registry=registry)
    assert found is not None and found.status == "DEV"
