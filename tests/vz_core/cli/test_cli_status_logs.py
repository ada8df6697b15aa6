"""`vz status --logs`: a Machine's log (its main process's output) within the five verbs, through the real
console script, daemon and a plugin driver whose Machines' main process prints known lines."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from vzcli import Vz, add_test_driver, fake_machine, write_project


@pytest.fixture
def talking(vz: Vz, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    go = tmp_path / "go"
    add_test_driver(vz, "talking", cwd=tmp_path, options={"go": str(go)})
    project = write_project(
        tmp_path / "proj",
        fake_machine("web", driver="talking"),
        fake_machine("db", driver="talking"),
        default_machine="web",
    )
    vz.ok("up", cwd=project)
    try:
        yield project, go
    finally:
        vz.run("delete", cwd=project)


def _until(stream: object, needle: bytes) -> bytes:
    seen = b""
    while needle not in seen:
        line = stream.readline()  # type: ignore[attr-defined]
        assert line, f"the log ended before {needle!r}; got {seen!r}"
        seen += line
    return seen


def test_logs_tail_and_machine(vz: Vz, talking: tuple[Path, Path]) -> None:
    project, _ = talking
    assert vz.ok("status", "--logs", cwd=project) == "one\ntwo\nthree\n"
    assert vz.ok("status", "--logs", "--tail", "2", cwd=project) == "two\nthree\n"
    assert vz.ok("status", "--logs", "--tail", "0", cwd=project) == ""
    assert vz.ok("status", "--logs", "--machine", "db", "--environment", "default", cwd=project) == "one\ntwo\nthree\n"
    assert vz.ok("--environment", "default", "status", "--logs", "--machine", "db", cwd=project).endswith("three\n")
    assert "--machine nope" in vz.fails(3, "status", "--logs", "--machine", "nope", cwd=project)


def test_follow_prints_what_is_added_and_ctrl_c_ends_it(vz: Vz, talking: tuple[Path, Path]) -> None:
    project, go = talking
    proc = vz.popen("status", "--logs", "--follow", "--tail", "1", cwd=project, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert _until(proc.stdout, b"three\n") == b"three\n"
        go.touch()
        assert _until(proc.stdout, b"four\n") == b"four\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--follow",), "--follow: only with --logs"),
        (("--tail", "3"), "--tail: only with --logs"),
        (("--logs", "--all"), "--logs shows one Machine's log"),
        (("--logs", "--json"), "--json has no shape for them"),
        (("--logs", "--tail", "-1"), "--tail -1: give a number of lines, 0 or more"),
    ],
)
def test_log_option_mistakes_exit_2(vz: Vz, tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    project = write_project(tmp_path / "p", fake_machine("web"))
    assert fragment in vz.fails(2, "status", *args, cwd=project)
    vz.assert_recorded_nothing()


def test_help_status_names_the_log_options(vz: Vz, tmp_path: Path) -> None:
    out = vz.ok("help", "status", cwd=tmp_path)
    assert "--logs" in out and "--follow" in out and "--tail N" in out


def test_service_needs_logs(vz: Vz, tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", fake_machine("web"))
    assert "--service: only with --logs" in vz.fails(2, "status", "--service", "web", cwd=project)
    vz.assert_recorded_nothing()
