"""Small host-side file operations of the mount and storage cases (tiny files in the suite's scratch dir)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["names", "read", "write"]


def write(path: str | Path, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def read(path: str | Path) -> str | None:
    """The file's text, or None when it does not exist."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return None


def names(directory: str | Path) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir())
