"""Resolve ``user[:group]`` against the image's /etc/passwd and /etc/group (never the host's).

The guest agent resolves users again inside the Machine for every command; the host resolves them before
creating anything, so an unknown user fails RunImage before any mutation, and so the workspace can be given to
the developer identity's uid/gid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import InvalidArgumentError

__all__ = ["ResolvedUser", "check_user_syntax", "resolve_user"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}\$?\Z")


@dataclass(frozen=True)
class ResolvedUser:
    """A user as the kernel sees it."""

    name: str
    uid: int
    gid: int
    additional_gids: tuple[int, ...] = ()
    home: str = "/"


def check_user_syntax(user: str, *, field: str) -> None:
    """Reject malformed ``user[:group]`` strings before anything else happens."""
    if not user:
        return
    name, _, group = user.partition(":")
    for part, what in ((name, "user"), (group, "group")):
        if part == "" and what == "user":
            raise InvalidArgumentError(
                f"{field} {user!r} has an empty user name; use 'name', 'uid', 'name:group' or 'uid:gid'",
                details={"field": field},
            )
        if part and not (part.isdigit() or _NAME_RE.match(part)):
            raise InvalidArgumentError(
                f"{field} {user!r} is not a valid {what}; use letters, digits, '_', '.', '-' or a number",
                details={"field": field},
            )


def _read_table(path: Path) -> list[list[str]]:
    # The path may be an absolute symlink inside the image: never follow it out of the root filesystem.
    try:
        if path.is_symlink():
            return []
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def resolve_user(rootfs: Path, user: str, *, field: str) -> ResolvedUser:
    """Resolve ``user`` ("" = root, name, uid, name:group, uid:gid) inside the image ``rootfs``.

    Unknown names are an ``InvalidArgumentError``; numeric ids need no entry (like OCI runtimes).
    """
    check_user_syntax(user, field=field)
    name, _, group = (user or "root").partition(":")
    passwd = _read_table(rootfs / "etc" / "passwd")
    groups = _read_table(rootfs / "etc" / "group")
    entry: list[str] | None = None
    for row in passwd:
        if len(row) >= 4 and (row[0] == name or (name.isdigit() and row[2] == name)):
            entry = row
            break
    if entry is None:
        if not name.isdigit():
            if name == "root":
                entry = ["root", "x", "0", "0", "", "/root"]
            else:
                raise InvalidArgumentError(
                    f"{field} {name!r} does not exist in the image (no entry in its /etc/passwd); "
                    "create the user in the image or use a numeric uid",
                    details={"field": field},
                )
        else:
            entry = [name, "x", name, name, "", "/"]
    try:
        uid, gid = int(entry[2]), int(entry[3])
    except ValueError:
        raise InvalidArgumentError(
            f"{field} {name!r} has a malformed /etc/passwd entry in the image", details={"field": field}
        ) from None
    home = entry[5] if len(entry) > 5 and entry[5] else "/"
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            match = [row for row in groups if len(row) >= 3 and row[0] == group]
            if not match or not match[0][2].isdigit():
                raise InvalidArgumentError(
                    f"{field} group {group!r} does not exist in the image (no entry in its /etc/group)",
                    details={"field": field},
                )
            gid = int(match[0][2])
    extra = sorted(
        {
            int(row[2])
            for row in groups
            if len(row) >= 4 and row[2].isdigit() and entry[0] in row[3].split(",") and int(row[2]) != gid
        }
    )
    return ResolvedUser(name=entry[0], uid=uid, gid=gid, additional_gids=tuple(extra), home=home)
