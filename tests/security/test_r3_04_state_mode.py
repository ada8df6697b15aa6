"""#26 item 4: what vz keeps under VZ_HOME is private whatever the home's own mode.

Black-box through the real `vz` and daemon: a VZ_HOME the user made 0755 gets a warning naming the fix
(`chmod 700 <home>`) and nothing in it that another user could read (state.db, -wal, -shm 0600; vz's own
directories there 0700, so nothing below them is reachable); a state.db left 0644 by an older vz is repaired;
a VZ_HOME others may write to is refused, naming the fix.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_core" / "cli"))
from vzcli import Vz, fake_machine, write_project

STATE = ("state.db", "state.db-wal", "state.db-shm")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _exposed(home: Path) -> list[str]:
    """Entries under ``home`` another user can reach and read: every entry directly in the home must keep group
    and others out (a directory of mode 0700 keeps them out of everything below it)."""
    return sorted(f"{p.name} {_mode(p):04o}" for p in home.iterdir() if _mode(p) & 0o077)


def test_a_home_made_0755_is_warned_about_and_nothing_in_it_is_readable_by_others(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    vz = Vz(home)
    proj = write_project(tmp_path / "p", fake_machine("web"))
    try:
        for args in (("up",), ("status",), ("status", "--json"), ("exec", "--", "true")):
            proc = vz.run(*args, cwd=proj)
            assert proc.returncode == 0, proc.stderr.decode()
            err = proc.stderr.decode()
            assert f"warning: the vz state directory {home} (VZ_HOME)" in err, err
            assert f"`chmod 700 {home}`" in err
            assert b"warning" not in proc.stdout  # --json keeps stdout JSON only
        for name in STATE:
            assert (home / name).exists(), name
            assert _mode(home / name) == 0o600, f"{name} is {_mode(home / name):04o}"
        assert _mode(home / "daemon") == 0o700 and _mode(home / "daemon" / "daemon.log") == 0o600
        assert _mode(home) == 0o755  # the user's own directory is not changed behind their back
        assert _exposed(home) == []
    finally:
        vz.run("delete", cwd=proj)


def test_a_state_database_left_0644_is_repaired(tmp_path: Path) -> None:
    home = tmp_path / "home"
    vz = Vz(home)
    proj = write_project(tmp_path / "p", fake_machine("web"))
    try:
        vz.ok("up", cwd=proj)
        # Left readable by an older vz, with the daemon running (the store repairs it when opened) ...
        for name in STATE:
            os.chmod(home / name, 0o644)
        vz.ok("status", cwd=proj)
        assert {name: _mode(home / name) for name in STATE} == dict.fromkeys(STATE, 0o600)
        # ... and with the daemon stopped (the next daemon repairs it at start, with vz's directories).
        vz.ok("daemon", "stop", cwd=proj)
        for name in ("state.db", "drivers"):
            os.chmod(home / name, 0o644 if name == "state.db" else 0o755)
        vz.ok("status", cwd=proj)
        assert _mode(home / "state.db") == 0o600 and _mode(home / "drivers") == 0o700
        assert _exposed(home) == []
    finally:
        vz.run("delete", cwd=proj)


def test_a_home_others_may_write_to_is_refused_naming_the_fix(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    vz = Vz(home)
    proj = write_project(tmp_path / "p", fake_machine("web"))
    for args in (("up",), ("status", "--json"), ("exec", "--", "true")):
        err = vz.fails(125 if args[0] == "exec" else 2, *args, cwd=proj)
        assert f"the vz state directory {home} (VZ_HOME) is writable by other users (mode 0777)" in err, err
        assert f"`chmod 700 {home}`" in err
    assert sorted(p.name for p in home.iterdir()) == []  # refused before anything was written
