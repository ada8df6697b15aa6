"""keep_freed_heap: wide-frame buffers of about 1 MiB are reused from the heap instead of being faulted in again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = """
import resource, sys
from vz_core.rpc._heap import keep_freed_heap
print(keep_freed_heap())
def frames():  # three 1 MiB buffers alive at once, then freed, as a frame's encode, send and decode do
    a = b"x" * (1 << 20); b = b"y" * (1 << 20); c = b"z" * (1 << 20)
    del a, b, c
frames()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    frames()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _probe(**env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env={**clean, **env}, capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator thresholds are Linux-only")
def test_freed_frame_buffers_are_reused_without_page_faults() -> None:
    kept, faults = _probe()
    assert kept == "True"
    assert faults < 1000, f"{faults} page faults for 300 MiB of 1 MiB buffers"
    # The process's own choice wins: with a threshold set in its environment nothing is changed.
    kept, faults = _probe(MALLOC_TRIM_THRESHOLD_=str(128 * 1024))
    assert kept == "False"
    assert faults > 10000, "the default thresholds fault the buffers in again (what keep_freed_heap avoids)"
