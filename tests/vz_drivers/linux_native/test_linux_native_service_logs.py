"""`vz status --logs --service S --follow` through the real `vz` (CLI, daemon, linux_native plugin): a service
writing a numbered line every 0.2 s is followed with every line exactly once, in order, and Ctrl-C ends it."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
from topology_testlib import vz_project

pytestmark = pytest.mark.root

TICK = "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done"
DEFINITION = {
    "version": 2,
    "project_id": "service-logs",
    "machines": [
        {
            "name": "m",
            "profile": "developer",
            "driver": "linux_native",
            "image": "vz:default",
            "workspace": {"projection": "none"},
            "services": [{"name": "tick", "port": 9003, "command": ["sh", "-c", TICK]}],
        }
    ],
}


def test_follow_sends_each_new_line_of_the_service_once(tmp_path: Path) -> None:
    with vz_project(tmp_path, DEFINITION) as vz:
        vz.ok("up")
        argv = [vz.exe, "status", "--logs", "--service", "tick", "--follow", "--tail", "1"]
        proc = subprocess.Popen(argv, cwd=vz.cwd, env=vz.environ, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        try:
            numbers: list[int] = []
            while len(numbers) < 20:
                line = proc.stdout.readline()
                assert line, f"the log ended after {numbers}"
                match = re.fullmatch(r"tick (\d+)\n", line)
                assert match, line
                numbers.append(int(match[1]))
            assert numbers == list(range(numbers[0], numbers[0] + 20)), numbers  # none repeated, none missed
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
