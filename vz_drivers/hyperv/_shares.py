"""A hyperv Machine's workspace and mounts: SMB shares of the Windows host, mounted by the guest (cifs).

Why SMB: Windows serves it natively (no server process of vz on the host), the Debian guest kernel has ``cifs``,
and the SMB server enforces each share's access list itself, so a read-only mount is refused writes by the host
whatever the guest does. (podman's Hyper-V machines serve 9p over Hyper-V sockets from a process of their own
instead; that works without a network adapter but needs that server running for the Machine's whole life.)

Per Machine (record key ``k``, 32 hex digits) and mount ``n`` there is one hidden share ``vz-<k>-<n>$`` of the
mount's host directory, open to exactly one account: a local account of this Machine, ``vz-<k[:16]>`` (no
group membership), never the developer's own. The account's password is random, new at every boot, handed to
PowerShell as data and to the guest over the agent channel at mount time, and otherwise kept nowhere (no file,
no record, no log: ``redact`` removes it from every message). A read-only mount's share grants Read only (and the
directory ACE ReadAndExecute), a read-write one Change (ACE Modify); the driver checks the access list
Windows reads back before the Machine boots. Shares are ``-Temporary`` and ``-EncryptData``; the guest mounts
them with SMB 3.1.1 and ``seal``.

Lifecycle: SHARE runs before the VM starts (it first removes whatever an earlier boot of the same Machine left:
shares, ACEs, firewall rule), the guest mounts after its agent answers, UNSHARE runs when the Machine stops
(the account is disabled) or is deleted (the account is removed); LIST_SHARES finds shares and accounts whose
Machine no longer exists in this state directory (a crash between creating and recording) so they are removed.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vz_core import ExecSpec
from vz_core.errors import RuntimeFailureError
from vz_drivers._guest import GUEST_BUSYBOX
from vz_drivers._machine import MountRecord
from vz_drivers.hyperv._scripts import SMB_PORT, SharesMade

__all__ = [
    "GUEST_ROOT",
    "MODULES_FILE",
    "MachineShares",
    "check_access",
    "describe",
    "generate_password",
    "machine_shares",
    "mount_options",
    "mount_spec",
    "orphans",
    "redact",
    "state_tag",
]

GUEST_ROOT = "/mnt/root"
"""Where the Machine's root is in the guest's initramfs (the mount command runs there, outside the image: the
image may have no ``mount`` or ``modprobe`` of its own, and the cifs modules are the initramfs's)."""
MODULES_FILE = "/etc/vz/modules.smb"
"""The initramfs's list of the cifs modules (loaded by the first mount of a boot)."""
_KEY_RE = re.compile(r"^[0-9a-f]{32}\Z")
_DESCRIPTION_RE = re.compile(r"^vz ([0-9a-f]{32}) ([0-9a-f]{12})\Z")
DESCRIPTION_MAX = 48
"""What ``New-LocalUser -Description`` accepts (the LocalAccounts module refuses longer comments)."""
_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class Share:
    name: str
    path: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class MachineShares:
    """Every Windows name of one Machine's shares, derived from its key alone."""

    key: str
    prefix: str
    account: str
    rule: str
    description: str
    shares: tuple[Share, ...]

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.shares if s.path]

    def share_args(self) -> list[dict[str, object]]:
        return [{"name": s.name, "path": s.path, "read_only": s.read_only} for s in self.shares]


def state_tag(state_root: Path) -> str:
    """A short, stable tag of one vz state directory (two vz homes on one host never take each other's shares)."""
    return hashlib.sha256(str(state_root).encode()).hexdigest()[:12]


def describe(key: str, tag: str) -> str:
    """The description of a Machine's shares and account: ``vz <key> <state tag>`` (48 characters, the most an
    account's comment may have), which is how leftovers are told from shares that are not this state's."""
    return f"vz {key} {tag}"


def machine_shares(key: str, mounts: Sequence[MountRecord], state_root: Path) -> MachineShares:
    """The shares of the Machine with record key ``key``: one per bind or volume mount (tmpfs stays in the guest)."""
    if not _KEY_RE.match(key):
        raise ValueError(f"not a Machine key: {key!r}")
    shared = [m for m in mounts if m.type in ("bind", "volume")]
    prefix = f"vz-{key}-"
    return MachineShares(
        key=key,
        prefix=prefix,
        account=f"vz-{key[:16]}",
        rule=f"vz-{key}-smb",
        description=describe(key, state_tag(state_root)),
        shares=tuple(
            # A volume's directory is known once the Machine's directory is made (host_path); until then: none.
            Share(name=f"{prefix}{n}$", path=m.host_path, target=m.target, read_only=m.read_only)
            for n, m in enumerate(shared)
        ),
    )


def generate_password(length: int = 32) -> str:
    """A random password of letters and digits (no character the mount data would have to escape), with every
    class Windows' complexity rule counts."""
    while True:
        pw = "".join(secrets.choice(_ALPHABET) for _ in range(length))
        if any(c.islower() for c in pw) and any(c.isupper() for c in pw) and any(c.isdigit() for c in pw):
            return pw


def redact(text: str, *secret_values: str) -> str:
    for value in secret_values:
        if value:
            text = text.replace(value, "***")
    return text


def check_access(made: SharesMade, wanted: MachineShares) -> None:
    """Refuse unless every share exists with exactly the access it should have: the Machine's account alone,
    Read for a read-only mount, Change for a read-write one (what Windows read back, not what was asked)."""
    by_name = {s.name: s for s in made.shares}
    for share in wanted.shares:
        got = by_name.get(share.name)
        if got is None:
            raise RuntimeFailureError(
                f"Hyper-V share: {share.name} for {share.target} was not created", details={"share": share.name}
            )
        right = "Read" if share.read_only else "Change"
        entries = {(a.account.lower(), a.right, a.control) for a in got.access}
        if entries != {(made.account.lower(), right, "Allow")}:
            raise RuntimeFailureError(
                f"Hyper-V share {share.name} ({share.target}) has the access list {sorted(entries)}; expected only "
                f"{right} for {made.account}: refusing to boot the Machine with it",
                details={"share": share.name},
            )


def orphans(
    listing_shares: Sequence[tuple[str, str, str]], accounts: Sequence[tuple[str, str]], tag: str, exists: set[str]
) -> set[str]:
    """Machine keys of this state directory (``tag``) whose shares or account are left while the Machine is gone
    (``exists``: keys whose Machine directory is there)."""
    keys: set[str] = set()
    for _name, _path, description in listing_shares:
        match = _DESCRIPTION_RE.match(description)
        if match and match.group(2) == tag and match.group(1) not in exists:
            keys.add(match.group(1))
    for _name, description in accounts:
        match = _DESCRIPTION_RE.match(description)
        if match and match.group(2) == tag and match.group(1) not in exists:
            keys.add(match.group(1))
    return keys


def mount_options(made: SharesMade, share: Share, *, uid: int, gid: int, port: int = SMB_PORT) -> str:
    """The cifs mount data of one share, without the password (the guest adds it from stdin)."""
    for value in (made.user, made.domain):
        if not re.match(r"^[A-Za-z0-9._-]+\Z", value):
            raise RuntimeFailureError(f"Hyper-V share: unexpected account or domain name {value!r}")
    return ",".join(
        [
            "ro" if share.read_only else "rw",
            "vers=3.1.1",
            "seal",
            "sec=ntlmssp",
            f"port={int(port)}",
            f"username={made.user}",
            f"domain={made.domain}",
            f"uid={int(uid)}",
            f"gid={int(gid)}",
            "forceuid",
            "forcegid",
            "file_mode=0755",
            "dir_mode=0755",
            "mfsymlinks",
            "actimeo=1",
        ]
    )


_MOUNT_SCRIPT = (
    r"""b=@BUSYBOX@
IFS= read -r p || exit 64
"$b" modprobe -a $("$b" cat @MODULES@) || { echo "vz: cannot load the cifs modules" >&2; exit 67; }
d=@ROOT@
IFS=/
set -f
for c in $2; do
	[ -n "$c" ] || continue
	d="$d/$c"
	if [ -L "$d" ]; then
		echo "vz: the mount target $2 is a symbolic link in the Machine" >&2
		exit 66
	fi
	[ -d "$d" ] || "$b" mkdir "$d" || exit 65
done
unset IFS
exec "$b" mount -i -t cifs -o "$3,password=$p" "$1" "$d"
""".replace("@MODULES@", MODULES_FILE)
    .replace("@ROOT@", GUEST_ROOT)
    .replace("@BUSYBOX@", GUEST_BUSYBOX)
)
"""Run by the initramfs's busybox outside the image's root: the password arrives on stdin (never in the exec
request), the cifs modules are loaded, the target is created inside the Machine's root (never through a symbolic
link of the image), then cifs mounts the share with the mount data."""


def mount_spec(
    workspace_id: str, made: SharesMade, share: Share, *, uid: int, gid: int, address: str = "", port: int = SMB_PORT
) -> ExecSpec:
    """The exec (as root, outside the image's root: ``root_override="/"``) that mounts ``share``; its stdin must be
    the password and a newline."""
    unc = f"//{address or made.host_address}/{share.name}"
    options = mount_options(made, share, uid=uid, gid=gid, port=port)
    return ExecSpec(
        workspace_id=workspace_id,
        argv=(GUEST_BUSYBOX, "sh", "-c", _MOUNT_SCRIPT, "vz-mount", unc, share.target, options),
        user="0:0",
        workdir="/",
    )
