"""The daemon's log: size-capped with one rotated copy, every record masked with the service's secrets."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from vz_core.daemon import _log
from vz_core.redact import Redactor


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def test_log_is_size_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_root: None) -> None:
    monkeypatch.setattr(_log, "LOG_MAX_BYTES", 4000)
    path = tmp_path / "daemon.log"
    log = _log.setup_logging(str(path))
    for i in range(400):
        log.info("line %04d %s", i, "x" * 40)
    assert path.stat().st_size <= 4000
    rotated = tmp_path / "daemon.log.1"
    assert rotated.exists() and rotated.stat().st_size <= 4000
    assert not (tmp_path / "daemon.log.2").exists()
    assert "line 0399" in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600


def test_records_are_redacted(tmp_path: Path, restore_root: None) -> None:
    secrets = Redactor()
    path = tmp_path / "daemon.log"
    log = _log.setup_logging(str(path), redactor=lambda: secrets)
    secrets.add("hunter2-token")  # learned after the logger was set up: the filter asks each time
    log.warning("driver said: %s", "login with hunter2-token failed")
    try:
        raise ValueError("bad value hunter2-token")
    except ValueError:
        log.exception("call failed")
    text = path.read_text()
    assert "hunter2-token" not in text
    assert "driver said: login with *** failed" in text and "ValueError: bad value ***" in text
