"""Windows Job Objects: exercised for real on Windows; elsewhere the module says plainly it cannot run."""

from __future__ import annotations

import sys

import pytest

from vz_core.errors import PluginError
from vz_core.transport import _windows


@pytest.mark.skipif(sys.platform == "win32", reason="checks the refusal on other systems")
def test_job_objects_refuse_clearly_off_windows() -> None:
    with pytest.raises(PluginError, match="only available on Windows"):
        _windows.create_kill_on_close_job()


@pytest.mark.skipif(sys.platform != "win32", reason="Job Objects exist only on Windows")
def test_job_object_kills_its_processes_when_closed() -> None:
    import subprocess
    import time

    job = _windows.create_kill_on_close_job()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        creationflags=_windows.CREATE_SUSPENDED | _windows.CREATE_NEW_PROCESS_GROUP,
    )
    try:
        _windows.assign_and_resume(job, proc.pid)
        assert proc.poll() is None
        _windows.close_job(job)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is not None, "closing the job's last handle killed its process"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
