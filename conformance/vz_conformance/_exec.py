"""Running a command through ``Driver.exec`` and judging the frames it produced.

``collect`` reads the whole event stream (including anything a faulty driver sends after the exit) so the
strict frame rules can be judged where a case asks for them; every other case only needs the output and the
single exit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from vz_conformance._expect import fail
from vz_core import MAX_CHUNK, Driver, ExecExit, ExecOutput, ExecSpec

__all__ = ["ExecResult", "chunks", "close_iterator", "collect"]


async def chunks(data: bytes, size: int = MAX_CHUNK) -> AsyncIterator[bytes]:
    """``data`` as stdin frames of at most ``size`` bytes (no frame at all for empty data)."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def close_iterator(iterator: object) -> None:
    """Close an async generator (cancelling a remote stream) if it can be closed."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


def _preview(data: bytes, limit: int = 160) -> str:
    text = repr(data[:limit])
    return text + (f" ... ({len(data)} bytes)" if len(data) > limit else "")


@dataclass
class ExecResult:
    """Everything one Exec produced, in order."""

    argv: tuple[str, ...]
    events: list[ExecOutput | ExecExit | object] = field(default_factory=list)
    stdout: bytes = b""
    stderr: bytes = b""
    exit: ExecExit | None = None
    exits: int = 0
    after_exit: int = 0

    def record(self, event: object) -> None:
        self.events.append(event)
        if self.exit is not None:
            self.after_exit += 1
        if isinstance(event, ExecExit):
            self.exits += 1
            if self.exit is None:
                self.exit = event
        elif isinstance(event, ExecOutput) and self.exit is None:
            if event.stream == "stdout":
                self.stdout += event.data
            else:
                self.stderr += event.data

    def where(self) -> str:
        """A short description for failure texts: the argv and what came back."""
        return (
            f"argv={list(self.argv)!r}, exit={self.exit!r}, "
            f"stdout={_preview(self.stdout)}, stderr={_preview(self.stderr)}"
        )

    def require_exit(self) -> ExecExit:
        """The exit frame; a stream that ended without one is never success."""
        if self.exit is None:
            fail(
                "Exec",
                "exactly one exit frame at the end of the stream",
                "the stream ended without an exit",
                note=self.where(),
            )
        return self.exit

    def require_success(self) -> ExecResult:
        """Fail unless the command exited 0 with an empty signal."""
        exit_ = self.require_exit()
        if not exit_.success:
            fail(
                "Exec",
                "exit frame exit_code=0, signal=''",
                f"exit_code={exit_.exit_code}, signal={exit_.signal!r}",
                note=self.where(),
            )
        return self

    def frame_problems(self, *, sizes_only: bool = False) -> list[str]:
        """Every violation of the output frame rules: 1..MAX_CHUNK bytes per output frame, no unknown frame,
        and (unless ``sizes_only``) exactly one exit with nothing after it."""
        problems: list[str] = []
        for index, event in enumerate(self.events):
            if isinstance(event, ExecOutput):
                size = len(event.data)
                if not 1 <= size <= MAX_CHUNK:
                    problems.append(f"frame {index} ({event.stream}) carries {size} bytes, allowed 1..{MAX_CHUNK}")
            elif not isinstance(event, ExecExit):
                problems.append(f"frame {index} has no payload ({event!r})")
        if sizes_only:
            return problems
        if self.exits != 1:
            problems.append(f"{self.exits} exit frames, expected exactly 1")
        if self.after_exit:
            problems.append(f"{self.after_exit} frame(s) after the exit frame, expected none")
        return problems


async def collect(
    driver: Driver,
    spec: ExecSpec,
    stdin: bytes | AsyncIterator[bytes] = b"",
    *,
    within: float = 30.0,
) -> ExecResult:
    """Run ``spec`` with ``stdin`` and read the stream to its end (at most ``within`` seconds).

    Errors raised by the driver propagate unchanged (a check decides whether the category was right); a stream
    still open after that is a failure naming what had arrived.
    """
    source = chunks(stdin) if isinstance(stdin, bytes) else stdin
    result = ExecResult(argv=spec.argv)
    stream = driver.exec(spec, source)
    try:
        async with asyncio.timeout(within):
            async for event in stream:
                result.record(event)
    except TimeoutError:
        fail("Exec", f"the stream to end within {within:g} s", "it was still open", note=result.where())
    finally:
        await close_iterator(stream)
    return result
