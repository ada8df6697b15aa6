"""When `vz exec` ends: with the command's main process (docker exec's end) by default, even while a background
process of the command still holds its output; with --pass-pipes the caller's pipes are the command's own, so
their reader waits for every holder (ssh's end). Through the real console script, daemon and linux_native.

No clock is read: the background process waits for a file that only the test creates, so "ended before it"
is a fact, not a duration.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from vzcli import Vz

pytestmark = pytest.mark.slow

GO = "/tmp/vz-test-exec-ending-go"
BACKGROUND = f'echo main; (while [ ! -e {GO} ]; do sleep 0.05; done; echo late) & echo "bg $!"'


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Vz, Path]]:
    root = tmp_path_factory.mktemp("exec-ending")
    vz = Vz(root / "home", extra_env={k: os.environ[k] for k in ("PYTHONPATH", "VZ_AGENT_BINARY") if k in os.environ})
    work = root / "proj"
    work.mkdir()
    machine = {"name": "web", "profile": "developer", "driver": "linux_native", "image": "vz:default"}
    machine["workspace"] = {"projection": "none"}
    (work / "vz.json").write_text(json.dumps({"version": 1, "project_id": "exec-ending", "machines": [machine]}))
    vz.ok("up", cwd=work, timeout=600)
    try:
        yield vz, work
    finally:
        vz.run("delete", cwd=work, timeout=600)
        vz.run("daemon", "stop", cwd=work)


def _release(vz: Vz, work: Path) -> None:
    vz.ok("exec", "--", "touch", GO, cwd=work)


def test_default_ends_with_the_main_process(native: tuple[Vz, Path]) -> None:
    vz, work = native
    vz.ok("exec", "--", "rm", "-f", GO, cwd=work)
    try:
        # capture_output reads both pipes to their end: it returns only once nothing holds them.
        proc = vz.run("exec", "--", "sh", "-c", BACKGROUND, cwd=work, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(b"main\nbg ") and b"late" not in proc.stdout
        assert vz.ok("exec", "--", "sh", "-c", f"test -e {GO} && echo released || echo waiting", cwd=work) == (
            "waiting\n"
        )
    finally:
        _release(vz, work)


def test_pass_pipes_keeps_the_reader_until_every_holder_closed(native: tuple[Vz, Path]) -> None:
    vz, work = native
    vz.ok("exec", "--", "rm", "-f", GO, cwd=work)
    proc = vz.popen("exec", "--pass-pipes", "--", "sh", "-c", BACKGROUND, cwd=work, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert proc.wait(60) == 0  # vz exec itself ended with the main process...
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        seen = b""
        while not seen.count(b"\n") >= 2:
            select.select([fd], [], [], 30)
            seen += os.read(fd, 4096)
        assert seen.startswith(b"main\nbg ")
        with pytest.raises(BlockingIOError):  # ...but the pipe is still held open in the Machine: no end of file
            os.read(fd, 4096)
        _release(vz, work)
        os.set_blocking(fd, True)
        rest = proc.stdout.read()
        assert rest == b"late\n"  # the background process wrote into the caller's own pipe, then closed it
    finally:
        _release(vz, work)
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_files_keep_the_fast_path(native: tuple[Vz, Path], tmp_path: Path) -> None:
    """A file has no reader to keep waiting: it is handed over as it is, and the background's late line lands."""
    vz, work = native
    vz.ok("exec", "--", "rm", "-f", GO, cwd=work)
    out = tmp_path / "out"
    with out.open("wb") as f:
        proc = subprocess.run(
            [vz.exe, "exec", "--", "sh", "-c", BACKGROUND], cwd=work, env=vz.env(), stdout=f, timeout=60, check=False
        )
    assert proc.returncode == 0
    assert out.read_bytes().startswith(b"main\nbg ")
    _release(vz, work)
    for _ in range(600):  # the background process appends to the file itself once released
        if out.read_bytes().endswith(b"late\n"):
            break
        select.select([], [], [], 0.05)
    assert out.read_bytes().endswith(b"late\n")
