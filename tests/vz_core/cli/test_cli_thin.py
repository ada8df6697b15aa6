"""The CLI is only a client of the daemon: no driver code runs in the `vz` process for up/exec/status/stop/delete.

Each real `vz` console-script run gets a ``sitecustomize`` on PYTHONPATH (written here, not part of vz) that
records, at interpreter exit, every module the process imported, in a file named by its pid. The daemon the
CLI starts inherits PYTHONPATH and records its own file under its own pid, so the test can tell them apart.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from vzcli import Vz, fake_machine, write_project

RECORDER = """\
import atexit
import os
import sys


def _record():
    out = os.path.join({out!r}, "modules-%d.txt" % os.getpid())
    with open(out, "w") as f:
        f.write(" ".join(sys.argv) + "\\n")
        f.write("\\n".join(sorted(sys.modules)) + "\\n")


atexit.register(_record)
"""

DRIVER_CODE = ("vz_drivers", "vz_conformance", "vz_plugins", "vz_core.rpc", "vz_core.transport", "vz_core._driver")
"""Built-in drivers, the reference fake, the plugin SDK, the Runtime Protocol client and the plugin launcher."""
HEAVY = ("grpc", "google.protobuf", "pydantic", "rich")
COSTLY_STDLIB = (
    "argparse",
    "array",
    "dataclasses",
    "enum",
    "json",
    "re",
    "selectors",
    "signal",
    "socket",
    "struct",
    "subprocess",
    "threading",
    "typing",
)
"""Standard modules that cost `vz exec -- true` (B7) a millisecond or more each (json pulls in re, socket and
signal build enums): its hot path uses the C modules under them (_json, _socket, _signal) instead."""


def _hits(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Vz, Path]:
    site = tmp_path / "site"
    out = tmp_path / "modules"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(RECORDER.format(out=str(out)))
    return Vz(tmp_path / "home", {"PYTHONPATH": str(site)}), out


def _modules_of(out: Path, pid: int) -> list[str]:
    path = out / f"modules-{pid}.txt"
    assert path.exists(), f"the vz process {pid} recorded no module list (sitecustomize did not run?)"
    return path.read_text().splitlines()[1:]


def _run(vz: Vz, out: Path, *args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[bytes], list[str]]:
    proc = subprocess.Popen(
        [vz.exe, *args], cwd=cwd, env=vz.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stdout, stderr = proc.communicate(timeout=120)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert proc.returncode == 0, f"vz {' '.join(args)} exited {proc.returncode}: {stderr.decode()}"
    return done, _modules_of(out, proc.pid)


def test_no_driver_code_runs_in_the_cli_process(recorded: tuple[Vz, Path], tmp_path: Path) -> None:
    vz, out = recorded
    project = write_project(tmp_path / "proj", fake_machine("web"))
    try:
        _, up = _run(vz, out, "up", cwd=project)
        done, exec_ = _run(vz, out, "exec", "--", "sh", "-c", "echo ran in $VZ_MACHINE_ID", cwd=project)
        status_run, status = _run(vz, out, "status", "--json", cwd=project)
        import json

        (env,) = json.loads(status_run.stdout)["environments"]
        (machine,) = env["machines"]
        assert done.stdout.decode() == f"ran in {machine['id']}\n"  # the Machine really ran the command
        assert machine["state"] == "running"
        _, stop = _run(vz, out, "stop", cwd=project)
        _, delete = _run(vz, out, "delete", cwd=project)
    finally:
        vz.run("delete", cwd=project)
        vz.run("daemon", "stop", cwd=tmp_path)  # the daemon and its plugins record their modules as they exit
    for name, modules in (("up", up), ("exec", exec_), ("status", status), ("stop", stop), ("delete", delete)):
        assert "vz_core.cli" in modules, f"vz {name}: the recorder saw no CLI (wrong process?)"
        assert _hits(modules, DRIVER_CODE) == [], f"vz {name} imported driver code in the CLI process"
        assert _hits(modules, ("grpc", "google.protobuf")) == [], f"vz {name} imported grpc in the CLI process"
    assert _hits(exec_, (*HEAVY, "asyncio", "vz_core.env")) == [], "vz exec's hot path imported heavy modules"
    assert _hits(exec_, COSTLY_STDLIB) == [], "vz exec's hot path imported costly standard modules"
    # The work happened elsewhere: the daemon (another pid, the same recorder) and the fake's plugin process.
    deadline = time.monotonic() + 20
    while True:
        records = [p.read_text().splitlines()[1:] for p in out.iterdir()]
        daemon = [m for m in records if "vz_core.daemon._server" in m]
        plugin = [m for m in records if "vz_conformance.fake" in m and "vz_core.cli" not in m]
        if (daemon and plugin) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert daemon, "no daemon process recorded: did the commands run in the CLI process?"
    assert plugin, "no driver plugin process recorded the fake driver's code"


def test_the_recorder_sees_driver_code_when_it_runs(recorded: tuple[Vz, Path], tmp_path: Path) -> None:
    """The check above can fail: a process that builds a driver shows it in its module list."""
    vz, out = recorded
    code = "from vz_core.env import DriverPool; from vz_conformance.fake import FakeDriver; FakeDriver()"
    proc = subprocess.run([sys.executable, "-c", code], env=vz.env(), cwd=tmp_path, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    (recorded_file,) = out.iterdir()
    modules = recorded_file.read_text().splitlines()[1:]
    assert _hits(modules, DRIVER_CODE) != []
