"""The daemon's log: ``<home>/daemon/daemon.log``, size-capped (one rotated copy), every record redacted.

The daemon's stdout and stderr point at the same file (a started daemon is detached with its stdio on the
log), so a stray traceback lands there too; after a rotation they are moved to the new file.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from collections.abc import Callable

from vz_core.platform.files import NOFOLLOW
from vz_core.redact import Redactor

__all__ = ["LOGGER", "LOG_BACKUPS", "LOG_MAX_BYTES", "RedactingFilter", "open_log", "setup_logging"]

LOG_MAX_BYTES = 4 * 1024 * 1024
"""The log is rotated when it would grow past this size."""
LOG_BACKUPS = 1
"""Rotated copies kept (``daemon.log.1``)."""
LOGGER = "vz.daemon"


def open_log(path: str) -> int:
    """An append descriptor on the log file (mode 0600), for a daemon's stdio."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600)


class RedactingFilter(logging.Filter):
    """Masks every secret the redactor knows (the daemon's session pool learns them) in each record."""

    def __init__(self, redactor: Callable[[], Redactor | None]) -> None:
        super().__init__()
        self._redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = self._redactor()
        if redactor is None:
            return True
        text = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg = redactor.redact(text)
        record.args = None
        if record.exc_text:
            record.exc_text = redactor.redact(record.exc_text)
        return True


class _Handler(logging.handlers.RotatingFileHandler):
    def __init__(self, path: str, stdio: bool) -> None:
        super().__init__(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8", delay=False)
        self._stdio = stdio

    def _open(self):  # type: ignore[no-untyped-def]  # the base class's signature is untyped
        return os.fdopen(open_log(self.baseFilename), "a", encoding="utf-8")

    def doRollover(self) -> None:
        super().doRollover()
        if self._stdio and self.stream is not None:
            self.stream.flush()
            fd = self.stream.fileno()
            os.dup2(fd, 1)
            os.dup2(fd, 2)


class _Echo(logging.StreamHandler):  # type: ignore[type-arg]
    pass


def setup_logging(
    path: str,
    *,
    stdio: bool = False,
    echo: bool = False,
    redactor: Callable[[], Redactor | None] | None = None,
    level: int = logging.INFO,
) -> logging.Logger:
    """The ``vz.daemon`` logger (and the root logger) writing to ``path``; ``stdio``: also move fds 1 and 2
    there (a detached daemon); ``echo``: also write to stderr (a daemon in the foreground)."""
    handler = _Handler(path, stdio)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"))
    if redactor is not None:
        handler.addFilter(RedactingFilter(redactor))
    if stdio and handler.stream is not None:
        fd = handler.stream.fileno()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler | _Echo)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    if echo:
        console = _Echo()
        console.setFormatter(handler.formatter)
        if redactor is not None:
            console.addFilter(RedactingFilter(redactor))
        root.addHandler(console)
    root.setLevel(level)
    return logging.getLogger(LOGGER)
