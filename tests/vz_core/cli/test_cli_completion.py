"""`vz completion bash` run the way bash runs it: the script sourced in a real bash, ``_vz`` called with
COMP_WORDS/COMP_CWORD as bash sets them, COMPREPLY read back. Names come from the real daemon."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from vzcli import Vz


def _complete(vz: Vz, script: Path, cwd: Path, line: str) -> list[str]:
    """The candidates bash offers for ``line`` (the word under the cursor is the last one, possibly empty)."""
    words = line.split(" ")
    program = (
        f"source {shlex.quote(str(script))}\n"
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        "_vz\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = vz.env()
    env["PATH"] = f"{Path(vz.exe).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(["bash", "--norc", "-c", program], cwd=cwd, env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    return sorted(w for w in proc.stdout.decode().splitlines() if w)


@pytest.fixture
def script(vz: Vz, tmp_path: Path) -> Path:
    path = tmp_path / "vz.bash"
    path.write_text(vz.ok("completion", "bash", cwd=tmp_path))
    return path


def test_commands_flags_and_sub_commands(vz: Vz, script: Path, running: Path) -> None:
    assert _complete(vz, script, running, "vz ex") == ["exec"]
    assert _complete(vz, script, running, "vz st") == ["status", "stop"]
    assert _complete(vz, script, running, "vz --json st") == ["status", "stop"]
    assert _complete(vz, script, running, "vz --") == ["--environment", "--file", "--help", "--json", "--version"]
    assert "--machine" in _complete(vz, script, running, "vz exec --ma")
    assert _complete(vz, script, running, "vz exec --env") == ["--env", "--env-file", "--environment"]
    assert _complete(vz, script, running, "vz status --lo") == ["--logs"]
    assert _complete(vz, script, running, "vz volume ") == ["list", "rm"]
    assert _complete(vz, script, running, "vz daemon st") == ["start", "status", "stop"]
    assert {"list", "add", "verify", "configure"} <= set(_complete(vz, script, running, "vz driver "))
    assert "--lines" in _complete(vz, script, running, "vz daemon logs --")
    assert _complete(vz, script, running, "vz completion ") == ["bash", "fish", "zsh"]
    assert _complete(vz, script, running, "vz exec -- ") == []  # the command's own words: bash's default


def test_environment_and_machine_names_from_the_daemon(vz: Vz, script: Path, running: Path) -> None:
    assert _complete(vz, script, running, "vz --environment ") == ["default"]
    assert _complete(vz, script, running, "vz exec --machine ") == ["db", "web"]
    assert _complete(vz, script, running, "vz exec --environment default --machine d") == ["db"]
    assert _complete(vz, script, running, "vz status --machine w") == ["web"]


def test_no_daemon_no_names_and_none_started(vz: Vz, script: Path, tmp_path: Path) -> None:
    (tmp_path / "vz.json").write_text('{"version": 1, "project_id": "x", "machines": []}')
    assert _complete(vz, script, tmp_path, "vz exec --machine ") == []
    assert not (vz.home / "daemon" / "daemon.json").exists()


def test_names_seen_before_are_offered_when_the_daemon_is_gone(vz: Vz, script: Path, running: Path) -> None:
    assert _complete(vz, script, running, "vz exec --machine ") == ["db", "web"]
    vz.ok("daemon", "stop", cwd=running)
    assert _complete(vz, script, running, "vz exec --machine ") == ["db", "web"]  # from the cache
    assert not (vz.home / "daemon" / "daemon.json").exists()  # and no daemon was started to refresh it


def test_zsh_and_fish_scripts_and_mistakes(vz: Vz, tmp_path: Path) -> None:
    zsh = vz.ok("completion", "zsh", cwd=tmp_path)
    assert "bashcompinit" in zsh and "complete -o default -F _vz vz" in zsh
    fish = vz.ok("completion", "fish", cwd=tmp_path)
    assert "complete -c vz -f -l machine -r -a '(vz __complete machines 2>/dev/null)'" in fish
    assert "complete -c vz -n '__fish_seen_subcommand_from status' -l logs" in fish
    assert "which shell: bash, zsh or fish" in vz.fails(2, "completion", "tcsh", cwd=tmp_path)
    assert "completion" in vz.ok("--help", cwd=tmp_path)
