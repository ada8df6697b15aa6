"""How the CLI shows progress and results: rich on a terminal, plain lines otherwise, JSON lines with --json.

Human progress goes to stderr, results to stdout. With ``--json`` stdout carries only JSON objects, one per
line (docs/cli.md documents every event); human remarks still go to stderr. Everything written, on both streams
and in every mode, passes through the command's ``Redactor`` (the secret values of the Environments it touches).
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any, Literal

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


class Output:
    """Renders one command's progress, result and errors."""

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
        self._spinner: Any = None
        if mode == "rich":
            from rich.console import Console

            self._console = Console(file=self.err, highlight=False)

    # --- progress (the daemon's progress messages) ---------------------------------------------------------

    def show(self, progress: dict[str, Any]) -> None:
        """Render one progress message of a daemon operation (a ``--json`` line of docs/cli.md minus "command").

        ``step`` messages come as ``started`` then ``succeeded`` or ``failed`` (with ``seconds``); ``note`` and
        ``plan`` are one-line remarks. With ``--json`` the message is printed as it is, plus "command".
        """
        fields = {k: v for k, v in progress.items() if k not in ("event", "command")}
        event = str(progress.get("event", "note"))
        if isinstance(fields.get("message"), str):
            fields["message"] = self.redactor.redact(fields["message"])
        if self.mode == "json":
            self.event(event, **fields)
            return
        message = str(fields.get("message", ""))
        if event != "step":
            if self.mode == "rich":
                self._console.print(_escape(message))
            else:
                self.line(message)
            return
        status = fields.get("status")
        seconds = float(fields.get("seconds") or 0.0)
        if status == "started":
            if self.mode == "rich":
                self._stop_spinner()
                self._spinner = self._console.status(f"{_escape(message)} ...", spinner="dots")
                self._spinner.start()
            else:
                self.line(f"{message} ...")
        elif status == "succeeded":
            if self.mode == "rich":
                self._stop_spinner()
                self._console.print(f"[green]✓[/green] {_escape(message)} [dim]({seconds:.1f}s)[/dim]")
            else:
                self.line(f"{message}: done ({seconds:.2f}s)")
        elif self.mode == "rich":  # failed
            self._stop_spinner()
            self._console.print(f"[red]✗[/red] {_escape(message)}")

    def _stop_spinner(self) -> None:
        spinner, self._spinner = self._spinner, None
        if spinner is not None:
            spinner.stop()

    def close(self) -> None:
        """Stop a spinner still turning (an operation that ended without finishing its step)."""
        self._stop_spinner()

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
        self._stop_spinner()
        message = self.redactor.redact(message)
        if self.mode == "json":
            self.event("error", error={"kind": kind, "exit_code": code, "message": message})
        print(f"vz {self.command}: error: {message}", file=self.err, flush=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
