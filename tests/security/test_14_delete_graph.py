"""#14 item 2 through the real `vz` console script: `vz delete` removes everything the Environment owns and says
so; a sibling Environment stays byte-identical; `--keep-volumes` keeps volumes listed and removable.

On linux_native (root) the Machine has a named volume; the built-in agent-Machine drivers remove a volume's
data (``delete_volume``), so nothing of the Environment is left on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture(scope="module")
def agent_binary() -> str:
    """The guest agent built once (vz's own cache) and given to every ``vz`` run as ``VZ_AGENT_BINARY``: a test's
    fresh VZ_HOME would otherwise build it again, which is not what these tests are about."""
    from vz_drivers.agent import ensure_agent_binary

    return str(ensure_agent_binary())


class Vz:
    def __init__(self, home: Path, agent: str) -> None:
        self.agent = agent
        beside = Path(sys.executable).parent / "vz"
        self.exe = str(beside) if beside.exists() else (shutil.which("vz") or "vz")
        self.home = home

    def __call__(self, *args: str, cwd: Path, code: int | None = 0, input: bytes = b"") -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
        env["VZ_HOME"] = str(self.home)
        env["VZ_AGENT_BINARY"] = self.agent
        proc = subprocess.run(
            [self.exe, *args], cwd=cwd, env=env, capture_output=True, input=input, timeout=300, check=False
        )
        if (
            code is not None and proc.returncode != code
        ):  # not an AssertionError: the xfail below expects only its own check
            raise RuntimeError(f"vz {' '.join(args)} → {proc.returncode} (wanted {code}): {proc.stderr.decode()}")
        return str(proc.stdout.decode())


def project(root: Path) -> Path:
    root.mkdir(parents=True)
    machine = {
        "name": "web",
        "profile": "developer",
        "driver": "linux_native",
        "image": "vz:default",
        "workspace": {"projection": "none"},
        "volumes": [{"name": "cache", "target": "/cache"}],
    }
    (root / "vz.json").write_text(json.dumps({"version": 1, "project_id": "graph", "machines": [machine]}))
    return root


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and "locks" not in p.parts
    }


def mentioning(root: Path, needle: str) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if needle in p.name or (p.is_file() and not p.is_symlink() and needle.encode() in p.read_bytes()):
            hits.append(str(p.relative_to(root)))
    return sorted(hits)


def env_ids(vz: Vz, cwd: Path) -> dict[str, str]:
    report = json.loads(vz("status", "--all", "--json", cwd=cwd))
    return {e["name"]: e["id"] for e in report["environments"]}


@pytest.fixture
def graph(tmp_path: Path, agent_binary: str) -> Iterator[tuple[Vz, Path, Path, dict[str, str]]]:
    """Environment "default" from worktree a and "sibling" from worktree b, each with a named volume and
    sentinels; everything is deleted afterwards, whatever happened."""
    if os.geteuid() != 0:
        pytest.fail("linux_native needs root (namespaces, cgroups, runc)")
    vz = Vz(tmp_path / "home", agent_binary)
    a, b = project(tmp_path / "a"), project(tmp_path / "b")
    try:
        vz("up", cwd=a)
        vz("up", "--environment", "sibling", cwd=b)
        for where in (a, b):
            vz("exec", "--", "sh", "-c", "head -c 4096 /dev/urandom > /cache/sentinel; echo x > sentinel", cwd=where)
        yield vz, a, b, env_ids(vz, a)
    finally:
        for env_id in env_ids(vz, tmp_path).values():
            vz("delete", "--environment", env_id, cwd=tmp_path, code=None)


def test_delete_reports_what_it_removed_and_keeps_the_sibling(graph: tuple[Vz, Path, Path, dict[str, str]]) -> None:
    vz, a, b, ids = graph
    sentinels = {p: d for p, d in digests(vz.home / "drivers").items() if p.endswith("sentinel")}
    assert len(sentinels) >= 4  # each Machine's root filesystem and each volume
    result = json.loads(vz("delete", "--json", cwd=a).splitlines()[-1])
    assert result["event"] == "result" and result["environment"]["state"] == "deleted"
    assert [m["state"] for m in result["machines"]] == ["deleted"]
    assert result["bindings"] == [str(a)] and result["operations_removed"] >= 2
    (volume,) = result["volumes"]
    assert volume["volume"] == "cache" and volume["state"] == "removed"  # through the driver's delete_volume
    listed = json.loads(vz("volume", "list", "--json", cwd=a))["volumes"]  # only the sibling's, in use
    assert [(v["environment_id"], v["state"]) for v in listed] == [(ids["sibling"], "attached")]
    # The sibling: its Machine, its volume and every byte the driver keeps for it are unchanged.
    after = {p: d for p, d in digests(vz.home / "drivers").items() if p.endswith("sentinel")}
    assert set(after) < set(sentinels) and all(sentinels[p] == d for p, d in after.items())
    assert any("volumes" in p for p in after) and any("volumes" not in p for p in after)
    assert ids["sibling"] in env_ids(vz, b).values()
    assert vz("exec", "--", "cat", "sentinel", cwd=b) == "x\n"
    # Nothing of the deleted Environment is left in vz's own files (locks, ...) nor in the store.
    assert [p for p in mentioning(vz.home, ids["default"]) if not p.startswith("drivers") and "state.db" not in p] == []
    db = sqlite3.connect(vz.home / "state.db")
    try:
        for table in ("environments", "machines", "bindings", "operations"):
            assert db.execute(f"SELECT COUNT(*) FROM {table} WHERE env_id = ?", (ids["default"],)).fetchone() == (0,)
        rows = db.execute("SELECT backend_name, state FROM volumes WHERE env_id = ?", (ids["default"],)).fetchall()
        assert rows == []
    finally:
        db.close()


def test_delete_leaves_nothing_of_the_environment_on_disk(graph: tuple[Vz, Path, Path, dict[str, str]]) -> None:
    vz, a, _, ids = graph
    vz("delete", cwd=a)
    vz("daemon", "stop", cwd=a)  # the daemon's state database is checkpointed and closed (no -wal left)
    assert mentioning(vz.home, ids["default"]) == []  # a kept volume's data lives under this test's VZ_HOME


def test_keep_volumes(graph: tuple[Vz, Path, Path, dict[str, str]]) -> None:
    vz, a, _, ids = graph
    out = vz("delete", "--keep-volumes", cwd=a)
    assert "volume" in out and "kept (--keep-volumes)" in out
    assert "vz volume list" in out
    listed = vz("volume", "list", cwd=a)
    assert "cache" in listed and ids["default"] in listed
