"""Resolve ``user[:group]`` against the image's /etc/passwd and /etc/group (never the host's).

The guest agent resolves users again inside the Machine for every command; the host resolves them before
creating anything, so an unknown user fails RunImage before any mutation, and so the workspace can be given to
the developer identity's uid/gid (9p shares keep host ownership).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import InvalidArgumentError
from vz_drivers.qemu._validate import check_user_syntax

__all__ = ["ResolvedUser", "resolve_user"]


@dataclass(frozen=True)
class ResolvedUser:
    name: str
    uid: int
    gid: int


def _table(path: Path) -> list[list[str]]:
    # An absolute symlink inside the image must never be followed out of its root filesystem.
    try:
        if path.is_symlink():
            return []
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def resolve_user(rootfs: Path, user: str, *, field: str) -> ResolvedUser:
    """Resolve ``user`` ("" = root, name, uid, name:group, uid:gid) inside the image ``rootfs``.

    Unknown names are an ``InvalidArgumentError``; numeric ids need no entry.
    """
    check_user_syntax(user, field=field)
    name, _, group = (user or "root").partition(":")
    entry = next(
        (row for row in _table(rootfs / "etc" / "passwd") if len(row) >= 4 and (row[0] == name or row[2] == name)),
        None,
    )
    if entry is None:
        if name == "root":
            entry = ["root", "x", "0", "0"]
        elif name.isdigit():
            entry = [name, "x", name, name]
        else:
            raise InvalidArgumentError(
                f"{field} {name!r} does not exist in the image (no entry in its /etc/passwd); create the user in the "
                "image or use a numeric uid",
                details={"field": field},
            )
    try:
        uid, gid = int(entry[2]), int(entry[3])
    except ValueError:
        raise InvalidArgumentError(
            f"{field} {name!r} has a malformed /etc/passwd entry in the image", details={"field": field}
        ) from None
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            rows = [row for row in _table(rootfs / "etc" / "group") if len(row) >= 3 and row[0] == group]
            if not rows or not rows[0][2].isdigit():
                raise InvalidArgumentError(
                    f"{field} group {group!r} does not exist in the image (no entry in its /etc/group)",
                    details={"field": field},
                )
            gid = int(rows[0][2])
    return ResolvedUser(name=entry[0], uid=uid, gid=gid)
