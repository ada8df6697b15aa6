"""Host files of agent-Machine drivers: a full disk ends in a clear error, logs are never read through links."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from vz_core.errors import DriverError, UnavailableError
from vz_drivers._machine import MachinePaths, MachineRecord, RecordBook, atomic_write, read_chunks_nofollow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, mounted for the test and unmounted after it."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _fill(disk: Path) -> None:
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)


def test_a_full_disk_is_a_clear_error_naming_the_path(small_disk: Path) -> None:
    target = small_disk / "record.json"
    atomic_write(target, b"old")
    _fill(small_disk)
    with pytest.raises(UnavailableError) as info:
        atomic_write(target, b"x" * 200_000)
    message = info.value.message
    assert str(target) in message and "ENOSPC" in message and "free space" in message
    assert info.value.details["path"] == str(target)
    assert target.read_bytes() == b"old", "a failed write must leave the old content"
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "record.json"], "a temporary file stayed"


def test_saving_a_record_on_a_full_disk_is_a_driver_error(small_disk: Path) -> None:
    book = RecordBook(small_disk / "state", MachineRecord, MachinePaths)
    book.ensure()
    _fill(small_disk)
    record = MachineRecord(
        workspace_id="w",
        key="k" * 32,
        machine_id="m",
        created_at="",
        image_ref="vz:default",
        image_digest="",
        argv=["x" * 300_000],
        environment={},
        image_env=[],
        working_dir="/",
        user="",
        developer_identity="root",
        labels={},
        mounts=[],
        cpus=0,
        memory_bytes=0,
        egress="allow",
    )
    with pytest.raises(DriverError, match=r"record\.json"):
        book.save(record)


def test_a_read_only_directory_is_a_clear_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], check=True)
    try:
        with pytest.raises(UnavailableError, match="read-only"):
            atomic_write(ro / "f", b"data")
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_logs_are_read_from_regular_files_only(tmp_path: Path) -> None:
    log = tmp_path / "main.log"
    log.write_bytes(b"a" * 40000)
    assert b"".join(read_chunks_nofollow(log)) == b"a" * 40000
    secret = tmp_path / "secret"
    secret.write_bytes(b"host secret")
    link = tmp_path / "link.log"
    link.symlink_to(secret)
    assert list(read_chunks_nofollow(link)) == []
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    assert list(read_chunks_nofollow(fifo)) == [], "a FIFO must neither block nor be read"
    assert list(read_chunks_nofollow(tmp_path / "missing.log")) == []
