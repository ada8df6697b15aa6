"""Options the commands share may come before the command (`vz --json status`), as docker's global flags do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vzcli import Vz


def test_json_before_the_command_is_the_commands_json(vz: Vz, running: Path) -> None:
    before = json.loads(vz.ok("--json", "status", cwd=running))
    after = json.loads(vz.ok("status", "--json", cwd=running))

    def shape(report: dict[str, object]) -> list[tuple[str, str, list[str]]]:
        return [
            (e["id"], e["name"], [m["id"] for m in e["machines"]])
            for e in report["environments"]  # type: ignore[attr-defined]
        ]

    assert shape(before) == shape(after) and before["environments"][0]["name"] == "default"


def test_environment_and_file_before_exec(vz: Vz, running: Path, tmp_path: Path) -> None:
    probe = ("sh", "-c", 'echo "$VZ_ENVIRONMENT_ID"')
    env_id = vz.status(running)["environments"][0]["id"]
    assert vz.ok("--environment", "default", "exec", "--", *probe, cwd=running).strip() == env_id
    assert vz.ok("--environment=default", "exec", *probe, cwd=running).strip() == env_id
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = vz.ok("-f", str(running / "vz.json"), "exec", "--", *probe, cwd=elsewhere)
    assert out.strip() == env_id


def test_json_before_a_sub_command(vz: Vz, running: Path) -> None:
    assert json.loads(vz.ok("--json", "volume", "list", cwd=running)) == {"volumes": []}
    assert json.loads(vz.ok("--json", "daemon", "status", cwd=running))["running"] is True


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--bogus", "status"), "unknown option '--bogus' before the command"),
        (("--environment",), "--environment needs a value"),
        (("--json",), "no command after --json"),
        (("--json=1", "status"), "--json takes no value"),
    ],
)
def test_mistakes_before_the_command_exit_2(vz: Vz, tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    assert fragment in vz.fails(2, *args, cwd=tmp_path)
    assert not vz.home.exists()
