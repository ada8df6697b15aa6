"""#26 item 2 through the real `vz` console script and daemon: one Machine cannot take every PID on the host, and
every Machine has a memory limit.

A linux_native Machine's cgroup gets a pids limit (``resources.pids``, default 4096 or an eighth of the host's
``kernel.pid_max`` when smaller) and a memory limit, swap included (``resources.memory``, default half of the
host's memory). The tests read the limits from the Machine's own cgroup files on the host: the Machine's cgroup
path is what ``/proc/self/cgroup`` says inside it (there is no cgroup namespace), so nothing here depends on how
the driver names it.

The fork bomb runs in a Machine limited to 256 tasks and one CPU, so that it cannot harm the concurrent test
workers of ``scripts/test.sh``; while it is at its limit the daemon answers ``vz status``, the other Machine of
the Environment answers ``vz exec`` and the host can still fork. It is always ended: by ``vz delete``, and should
that fail, by freezing and killing its cgroup's tasks from the host.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.root]

CGROUP = Path("/sys/fs/cgroup")
BOMB_PIDS = 256
# The classic bomb (`:(){ :|:& };:`, named b: busybox sh takes no ":" function). The sleep started first (and
# waited for) keeps the `vz exec` that runs it alive until the test ends it: the bomb is in its process group.
BOMB = "sleep 100000 & b(){ b|b& }; b; wait"


@pytest.fixture(scope="module")
def agent_binary() -> str:
    """The guest agent built once (vz's own cache) and given to every ``vz`` run as ``VZ_AGENT_BINARY``."""
    from vz_drivers.agent import ensure_agent_binary

    return str(ensure_agent_binary())


class Vz:
    def __init__(self, home: Path, agent: str) -> None:
        beside = Path(sys.executable).parent / "vz"
        self.exe = str(beside) if beside.exists() else (shutil.which("vz") or "vz")
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
        self.env.update(VZ_HOME=str(home), VZ_AGENT_BINARY=agent)

    def run(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.exe, *args], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def __call__(self, *args: str, cwd: Path, timeout: float = 300) -> str:
        proc = self.run(*args, cwd=cwd, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"vz {' '.join(args)} → {proc.returncode}: {proc.stderr}")
        return proc.stdout

    def popen(self, *args: str, cwd: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [self.exe, *args],
            cwd=cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def environments(self, cwd: Path) -> list[str]:
        report = json.loads(self("status", "--all", "--json", cwd=cwd))
        return [e["id"] for e in report["environments"]]


def write_project(root: Path, project_id: str, machines: list[dict[str, object]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    base = {"profile": "developer", "driver": "linux_native", "image": "vz:default", "egress": "deny"}
    full = [{**base, "workspace": {"projection": "none"}, **m} for m in machines]
    (root / "vz.json").write_text(json.dumps({"version": 1, "project_id": project_id, "machines": full}))
    return root


def cgroup_dirs(vz: Vz, cwd: Path, machine: str) -> dict[str, Path]:
    """The Machine's cgroup directory per controller ("pids", "memory"), from /proc/self/cgroup inside it."""
    text = vz("exec", "--machine", machine, "--", "cat", "/proc/self/cgroup", cwd=cwd)
    dirs: dict[str, Path] = {}
    unified = (CGROUP / "cgroup.controllers").exists()
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if unified and controllers == "":
            dirs = {"pids": CGROUP / rel, "memory": CGROUP / rel}
        for name in controllers.split(","):
            if name in ("pids", "memory"):
                dirs[name] = CGROUP / name / rel
    assert set(dirs) == {"pids", "memory"}, text
    assert all(d.is_dir() for d in dirs.values()), dirs
    return dirs


def read(path: Path) -> str:
    return path.read_text().strip()


def refused(dirs: dict[str, Path]) -> int:
    """How many forks the kernel refused the cgroup at its pids limit (pids.events "max")."""
    events = dict(line.split() for line in read(dirs["pids"] / "pids.events").splitlines())
    return int(events["max"])


def pids_limit(dirs: dict[str, Path]) -> int:
    return int(read(dirs["pids"] / "pids.max"))


def memory_limits(dirs: dict[str, Path]) -> tuple[int, int | None]:
    """(memory limit, memory + swap limit) in bytes; the second is None where swap is not accounted."""
    memory = dirs["memory"]
    if (memory / "memory.max").exists():  # cgroup v2: memory.swap.max is the swap alone
        limit = int(read(memory / "memory.max"))
        swap = memory / "memory.swap.max"
        return limit, limit + int(read(swap)) if swap.exists() else None
    swap_file = memory / "memory.memsw.limit_in_bytes"
    memsw = int(read(swap_file)) if swap_file.exists() else None
    return int(read(memory / "memory.limit_in_bytes")), memsw


def host_task_limit() -> int:
    return min(int(read(Path("/proc/sys/kernel/pid_max"))), int(read(Path("/proc/sys/kernel/threads-max"))))


def host_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def kill_cgroup(pids_dir: Path) -> None:
    """End every task of a cgroup from the host: freeze it (v1 freezer, or v2 cgroup.freeze) so that nothing
    forks while it is emptied, SIGKILL each task, thaw."""
    rel = pids_dir.relative_to(CGROUP / "pids") if (CGROUP / "pids") in pids_dir.parents else None
    freezer = CGROUP / "freezer" / rel if rel is not None else None
    if freezer is not None and (freezer / "freezer.state").exists():
        (freezer / "freezer.state").write_text("FROZEN")
    elif (pids_dir / "cgroup.freeze").exists():
        (pids_dir / "cgroup.freeze").write_text("1")
    try:
        procs = pids_dir / "cgroup.procs"
        for pid in procs.read_text().split() if procs.exists() else []:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        if freezer is not None and (freezer / "freezer.state").exists():
            (freezer / "freezer.state").write_text("THAWED")
        elif (pids_dir / "cgroup.freeze").exists():
            (pids_dir / "cgroup.freeze").write_text("0")


@pytest.fixture
def vz(tmp_path: Path, agent_binary: str) -> Iterator[Vz]:
    if os.geteuid() != 0:
        pytest.fail("linux_native needs root (namespaces, cgroups, runc)")
    runner = Vz(tmp_path / "home", agent_binary)
    try:
        yield runner
    finally:
        if (tmp_path / "home").exists():
            for env_id in runner.environments(tmp_path):
                runner.run("delete", "--environment", env_id, cwd=tmp_path)
            runner.run("daemon", "stop", cwd=tmp_path)


def test_a_fork_bomb_stops_at_its_machines_limit_and_the_rest_keeps_answering(vz: Vz, tmp_path: Path) -> None:
    project = write_project(
        tmp_path / "bomb",
        "r3-limits-bomb",
        [{"name": "bomb", "resources": {"pids": BOMB_PIDS, "cpus": 1}}, {"name": "peer"}],
    )
    vz("up", cwd=project)
    bomb = cgroup_dirs(vz, project, "bomb")
    peer = cgroup_dirs(vz, project, "peer")
    assert pids_limit(bomb) == BOMB_PIDS
    bomber = vz.popen("exec", "--machine", "bomb", "--", "sh", "-c", BOMB, cwd=project)
    try:
        # Wait (no timing asserted) until the kernel refused the bomb a fork at its Machine's limit; it never
        # holds more tasks than that. (busybox sh exits when a fork fails, so the bomb's population then shrinks.)
        current = bomb["pids"] / "pids.current"
        deadline = time.monotonic() + 120
        seen = 0
        while refused(bomb) == 0 and time.monotonic() < deadline:
            seen = max(seen, int(read(current)))
            assert seen <= BOMB_PIDS
            time.sleep(0.05)
        assert refused(bomb) > 0, f"the bomb was never refused a fork (at most {seen} tasks seen)"
        # While it runs: the daemon answers, the other Machine runs commands, the host forks.
        status = vz("status", "--json", cwd=project)
        assert '"bomb"' in status and '"peer"' in status, status
        assert vz("exec", "--machine", "peer", "--", "sh", "-c", "echo $((6 * 7))", cwd=project) == "42\n"
        assert subprocess.run(["true"], check=False).returncode == 0
        assert int(read(current)) <= BOMB_PIDS
        # The other Machine has its own limit (the default), untouched by the bomb.
        assert pids_limit(peer) not in (BOMB_PIDS, host_task_limit())
        assert int(read(peer["pids"] / "pids.current")) < 64
    finally:
        bomber.kill()  # the agent then kills the command's process group: the bomb
        bomber.wait()
        result = vz.run("delete", cwd=project)
        if result.returncode != 0 or bomb["pids"].exists():
            kill_cgroup(bomb["pids"])
            vz.run("delete", cwd=project)
    assert result.returncode == 0, result.stderr
    assert not bomb["pids"].exists() and not peer["pids"].exists()


def test_a_machine_without_resources_gets_the_default_limits(vz: Vz, tmp_path: Path) -> None:
    project = write_project(tmp_path / "plain", "r3-limits-plain", [{"name": "plain"}])
    vz("up", cwd=project)
    dirs = cgroup_dirs(vz, project, "plain")
    tasks = host_task_limit()
    assert pids_limit(dirs) == min(4096, tasks // 8)
    memory, memsw = memory_limits(dirs)
    half = host_memory() // 2 // (1 << 20) * (1 << 20)
    assert memory == half
    if memsw is not None:  # swap accounted: swap is no way around the limit
        assert memsw == half
    # The Machine sees its limit as its memory.
    meminfo = vz("exec", "--machine", "plain", "--", "grep", "^MemTotal:", "/proc/meminfo", cwd=project)
    assert int(meminfo.split()[1]) * 1024 == half
    vz("delete", cwd=project)


def test_declared_limits_are_applied(vz: Vz, tmp_path: Path) -> None:
    project = write_project(
        tmp_path / "sized", "r3-limits-sized", [{"name": "sized", "resources": {"pids": 100, "memory": "300MiB"}}]
    )
    vz("up", cwd=project)
    dirs = cgroup_dirs(vz, project, "sized")
    assert pids_limit(dirs) == 100
    memory, memsw = memory_limits(dirs)
    assert memory == 300 << 20 and memsw in (None, 300 << 20)
    vz("delete", cwd=project)


@pytest.mark.parametrize(
    ("pids", "driver", "message"),
    [
        (10, "linux_native", "greater than or equal to 32"),
        ("many", "linux_native", "valid integer"),
        (4_194_305, "linux_native", "less than or equal to 4194304"),
        (None, "linux_native", "more than half of the"),
        (256, "fake", "does not enforce a pids limit"),
    ],
)
def test_a_bad_pids_value_is_refused_before_anything_is_created(
    vz: Vz, tmp_path: Path, pids: object, driver: str, message: str
) -> None:
    value = host_task_limit() // 2 + 1 if pids is None else pids
    project = write_project(tmp_path / "bad", "r3-limits-bad", [{"name": "m", "driver": driver, "resources": {}}])
    definition = json.loads((project / "vz.json").read_text())
    definition["machines"][0]["resources"] = {"pids": value}
    if driver == "fake":
        definition["machines"][0].pop("egress")
    (project / "vz.json").write_text(json.dumps(definition))
    result = vz.run("up", cwd=project)
    assert result.returncode != 0
    assert "$.machines[0].resources.pids" in result.stderr and message in result.stderr, result.stderr
    assert vz.environments(project) == []
    assert list(vz.home.glob("drivers/*/machines/*")) == []  # no Machine was ever recorded, so none was made
