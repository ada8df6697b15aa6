"""How the CLI shows progress and results: rich on a terminal, plain lines otherwise, JSON lines with --json.

Human progress goes to stderr, results to stdout. With ``--json`` stdout carries only JSON objects, one per
line (docs/cli.md documents every event); human remarks still go to stderr. Everything written, on both streams
and in every mode, passes through the command's ``Redactor`` (the secret values of the Environments it touches).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Literal

from vz_core.env import Progress
from vz_core.redact import Redactor

__all__ = ["Output", "choose_mode"]

Mode = Literal["rich", "plain", "json"]


def choose_mode(json_flag: bool, stream: IO[str] | None = None) -> Mode:
    """JSON when asked; rich when stderr is a terminal (and TERM is not "dumb"); plain lines otherwise."""
    import os

    if json_flag:
        return "json"
    stream = stream or sys.stderr
    if stream.isatty() and os.environ.get("TERM", "") != "dumb" and not os.environ.get("VZ_PLAIN"):
        return "rich"
    return "plain"


class Output(Progress):
    """Renders Environment progress for one command."""

    def __init__(
        self,
        mode: Mode,
        command: str,
        *,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self.mode = mode
        self.command = command
        self.redactor = redactor if redactor is not None else Redactor()
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._console: Any = None
        if mode == "rich":
            from rich.console import Console

            self._console = Console(file=self.err, highlight=False)

    # --- Progress ---------------------------------------------------------------------------------------------

    @contextmanager
    def step(self, action: str, message: str, **fields: Any) -> Iterator[None]:
        message = self.redactor.redact(message)
        started = time.monotonic()
        if self.mode == "json":
            self.event("step", action=action, status="started", message=message, **fields)
        elif self.mode == "plain":
            self.line(f"{message} ...")
        try:
            if self.mode == "rich":
                with self._console.status(f"{message} ...", spinner="dots"):
                    yield
            else:
                yield
        except BaseException:
            seconds = round(time.monotonic() - started, 3)
            if self.mode == "json":
                self.event("step", action=action, status="failed", message=message, seconds=seconds, **fields)
            elif self.mode == "rich":
                self._console.print(f"[red]✗[/red] {_escape(message)}")
            raise
        seconds = round(time.monotonic() - started, 3)
        if self.mode == "json":
            self.event("step", action=action, status="succeeded", message=message, seconds=seconds, **fields)
        elif self.mode == "rich":
            self._console.print(f"[green]✓[/green] {_escape(message)} [dim]({seconds:.1f}s)[/dim]")
        else:
            self.line(f"{message}: done ({seconds:.2f}s)")

    def note(self, kind: str, message: str, **fields: Any) -> None:
        message = self.redactor.redact(message)
        if self.mode == "json":
            self.event(kind if kind == "plan" else "note", kind=kind, message=message, **fields)
        elif self.mode == "rich":
            self._console.print(_escape(message))
        else:
            self.line(message)

    # --- output -----------------------------------------------------------------------------------------------

    def line(self, text: str) -> None:
        """A human line on stderr."""
        print(self.redactor.redact(text), file=self.err, flush=True)

    def event(self, event: str, **fields: Any) -> None:
        """One JSON object on stdout (``{"event": ..., "command": ..., ...}``)."""
        data = self.redactor.redact_data({"event": event, "command": self.command, **fields})
        print(json.dumps(data, sort_keys=False), file=self.out, flush=True)

    def text(self, text: str) -> None:
        """Result text on stdout, as is (apart from redaction)."""
        self.out.write(self.redactor.redact(text))
        self.out.flush()

    def document(self, payload: dict[str, Any]) -> None:
        """One indented JSON document on stdout (`vz status --json`)."""
        self.text(json.dumps(self.redactor.redact_data(payload), indent=2) + "\n")

    def result(self, payload: dict[str, Any], human: list[str]) -> None:
        if self.mode == "json":
            self.event("result", **payload)
        else:
            for text in human:
                print(self.redactor.redact(text), file=self.out, flush=True)

    def error(self, code: int, kind: str, message: str) -> None:
        message = self.redactor.redact(message)
        if self.mode == "json":
            self.event("error", error={"kind": kind, "exit_code": code, "message": message})
        print(f"vz {self.command}: error: {message}", file=self.err, flush=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
