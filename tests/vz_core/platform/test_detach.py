"""The daemon's ready line (vz_core.platform.detach): handed to the child and read back with a deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from vz_core.platform.detach import LAUNCHER_EXITS, read_line, ready_handoff


def test_the_ready_line_is_read_up_to_its_newline() -> None:
    r, w = os.pipe()
    try:
        os.write(w, b"ready 42\nmore")
        assert read_line(r, time.monotonic() + 30).startswith(b"ready 42\n")
    finally:
        os.close(r)
        os.close(w)


def test_no_line_before_the_deadline_is_a_timeout() -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(TimeoutError):
            read_line(r, time.monotonic() + 0.05)
    finally:
        os.close(r)
        os.close(w)


def test_an_exit_without_a_line_reads_as_what_came() -> None:
    r, w = os.pipe()
    os.write(w, b"partial")
    os.close(w)
    try:
        assert read_line(r, time.monotonic() + 30) == b"partial"
    finally:
        os.close(r)


def test_the_child_gets_the_write_end_and_writes_its_line() -> None:
    """What a client does when it starts the daemon: the child finds the pipe from its arguments alone."""
    r, w = os.pipe()
    args, options = ready_handoff(w)
    child = (
        "import os, sys\n"
        "kind, value = sys.argv[1], int(sys.argv[2])\n"
        "if kind == '--ready-handle':\n"
        "    from vz_core.platform.detach import ready_fd_from_handle\n"
        "    value = ready_fd_from_handle(value)\n"
        "os.write(value, b'ready 1\\n')\n"
    )
    try:
        proc = subprocess.Popen([sys.executable, "-c", child, *args], close_fds=True, **options)
    finally:
        os.close(w)
    try:
        assert read_line(r, time.monotonic() + 60) == b"ready 1\n"
    finally:
        os.close(r)
        proc.wait()
    assert args[0] == ("--ready-handle" if sys.platform == "win32" else "--ready-fd")
    assert LAUNCHER_EXITS is (sys.platform != "win32")
