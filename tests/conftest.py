"""Suite-wide guards: every test must leave no child process, mount, or environment change behind."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


def _children() -> dict[int, float]:
    out: dict[int, float] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            out[proc.pid] = proc.create_time()
        except psutil.Error:
            continue
    return out


def _mounts(root: str) -> set[str]:
    # Only mounts under this session's temporary root: other processes on the machine share the mount table.
    # scripts/leak-check.sh checks the whole machine after the suite.
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return {p for p in (line.split()[4] for line in lines) if p.startswith(root)}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    root = str(tmp_path_factory.getbasetemp())
    before_children = _children()
    before_mounts = _mounts(root)
    before_env = _env()
    yield
    # Processes get a short grace period to finish exiting (killed trees are reaped asynchronously).
    deadline = time.monotonic() + 5.0
    leaked: dict[int, float] = {}
    while True:
        leaked = {pid: t for pid, t in _children().items() if before_children.get(pid) != t}
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    problems: list[str] = []
    if leaked:
        names = []
        for pid in leaked:
            try:
                names.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:120]}")
            except psutil.Error:
                names.append(str(pid))
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        problems.append("child processes left behind: " + "; ".join(names))
    new_mounts = _mounts(root) - before_mounts
    if new_mounts:
        problems.append(f"mounts left behind: {sorted(new_mounts)}")
    env_now = _env()
    if env_now != before_env:
        changed = sorted(k for k in set(env_now) | set(before_env) if env_now.get(k) != before_env.get(k))
        for key in changed:
            if key in before_env:
                os.environ[key] = before_env[key]
            else:
                os.environ.pop(key, None)
        problems.append(f"environment variables changed: {changed}")
    if problems:
        pytest.fail(f"{request.node.nodeid} leaked: " + " | ".join(problems), pytrace=False)
