"""Removed 0.3 command families answer with a structured `legacy_command_removed` error (exit 2), never as an
unknown command, and never touch state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vzcli import Vz

from vz_core.cli._main import COMMANDS, LEGACY_COMMANDS

FAMILIES = ("run", "shell", "logs", "stack", "vm", "init")


def test_every_0_3_family_is_known_and_none_is_a_current_command() -> None:
    assert set(FAMILIES) <= set(LEGACY_COMMANDS)
    assert not set(LEGACY_COMMANDS) & set(COMMANDS)


@pytest.mark.parametrize("command", FAMILIES)
def test_removed_command_gives_migration_guidance(vz: Vz, tmp_path: Path, command: str) -> None:
    err = vz.fails(2, command, "something", cwd=tmp_path)
    assert "unknown command" not in err
    assert f"`vz {command}` was removed" in err and "instead:" in err
    assert err.count("\n") == 1
    assert not vz.home.exists()  # nothing was opened or written


@pytest.mark.parametrize("command", FAMILIES)
def test_removed_command_json_shape(vz: Vz, tmp_path: Path, command: str) -> None:
    proc = vz.run(command, "--json", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["event"] == "error" and doc["command"] == command
    error = doc["error"]
    assert error["kind"] == "legacy_command_removed" and error["exit_code"] == 2
    assert error["removed_command"] == command
    assert error["replacement"] == LEGACY_COMMANDS[command] and error["replacement"] in error["message"]


def test_an_unknown_command_is_still_unknown(vz: Vz, tmp_path: Path) -> None:
    err = vz.fails(2, "frobnicate", cwd=tmp_path)
    assert "unknown command 'frobnicate'" in err


def test_the_message_names_no_release_and_logs_points_at_status_logs(vz: Vz, tmp_path: Path) -> None:
    version = vz.ok("version", cwd=tmp_path).split()[1]
    err = vz.fails(2, "logs", cwd=tmp_path)
    assert "vz 0." not in err.replace(f"vz {version}", "")  # no release other than this one is claimed
    assert "`vz status --logs [--machine M] [--service S] [--follow] [--tail N]`" in err
