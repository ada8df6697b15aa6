"""How an Exec ended (``ExecResult``), shared by the API client's exec path and the typed results (``_types``),
neither of which imports the other for it."""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` itself costs milliseconds on the CLI's hot path
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ExecResult"]


class ExecResult(dict[str, "Any"]):
    """How a command ended (``{"exit_code", "signal"}``), plus the output streams ``exec`` captured."""

    __slots__ = ("stderr", "stdout")

    def __init__(self, data: dict[str, Any], stdout: bytes = b"", stderr: bytes = b"") -> None:
        super().__init__(data)
        self.stdout = stdout
        """What the command wrote on stdout (or the terminal), when it was not given a descriptor."""
        self.stderr = stderr
        """What the command wrote on stderr, when it was not given a descriptor."""

    @property
    def exit_code(self) -> int:
        """The exit code (128+N when signal N ended it)."""
        value: int = self["exit_code"]
        return value

    @property
    def signal(self) -> str | None:
        """The signal's name when a signal ended it."""
        value: str | None = self.get("signal")
        return value
