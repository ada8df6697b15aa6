"""Small host-side file operations of the mount and storage cases (tiny files in the suite's scratch dir)."""

from __future__ import annotations

from pathlib import Path

from vz_conformance._expect import ensure

__all__ = ["names", "read", "require", "write"]


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


def require(path: Path, text: str, what: str) -> None:
    """Fail unless the host file ``path`` holds exactly ``text``; ``what`` names the content."""
    found = read(path)
    ensure(found == text, "host filesystem", f"{path} with {what}", found if found is not None else "no such file")
