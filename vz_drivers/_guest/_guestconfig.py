"""The per-Machine configuration script the guest init runs (``config.sh`` on the ``vzcfg`` share).

It is a list of calls to the functions of the init script (``vz_drivers._guest._initramfs.INIT_SCRIPT``), in
order, with every argument quoted for the shell: any byte but NUL survives. The script holds the Machine's
environment (secrets), so the host writes it mode 0600 into a private directory on its memory filesystem
(``/dev/shm``) and removes it once the guest agent serves; nothing of it appears on the QEMU command line.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vz_drivers._guest._initramfs import AGENT_PORT_PREFIX

__all__ = ["GuestConfig", "GuestMount", "env_list", "hosts_file", "render", "resolv_file"]

ROOT_DEVICE = "/dev/vda"
LOG_PATH = "/run/vz/main.log"
HOSTS_PATH = "/run/vz/cfg/hosts"
RESOLV_PATH = "/run/vz/cfg/resolv.conf"
DHCP_RESOLV_PATH = "/run/vz/resolv.conf"
"""What the DHCP event script writes (``vz_drivers._guest._initramfs.DHCP_SCRIPT``)."""


@dataclass(frozen=True)
class GuestMount:
    """A mount inside the guest root: a share (``tag``: 9p, or virtio-fs with ``GuestConfig.virtiofs``) or a
    tmpfs (``tag`` empty)."""

    target: str
    tag: str = ""
    read_only: bool = False
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class GuestConfig:
    """Everything the guest init needs to know about one Machine."""

    hostname: str
    mounts: tuple[GuestMount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    user: str = ""
    workdir: str = "/"
    stop_timeout: float = 10.0
    sessions: int = 1
    """virtio-serial ports with an agent each: port 0 is PID 1, the others serve more host connections."""
    network: bool = True
    dhcp: bool = False
    """The network comes up by DHCP on eth0 (``vz_network_dhcp``: vfkit's NAT), not by the static QEMU setup; with
    ``resolv_conf`` the lease's DNS servers become ``/etc/resolv.conf``."""
    resolv_conf: bool = False
    virtiofs: bool = False
    """Shares are virtio-fs (``vz_virtiofs``; vfkit) instead of 9p (``vz_share``; QEMU)."""
    vsock: tuple[int, int] | None = None
    """(agent port, ready port): the agent serves AF_VSOCK (``vz_agent_vsock``) instead of virtio-serial ports."""
    rosetta_tag: str = ""
    """The virtio-fs tag of the Rosetta share (vfkit on Apple silicon), registered for x86_64 binaries."""


def _call(*words: str) -> str:
    return " ".join(shlex.quote(w) if i else w for i, w in enumerate(words))


def render(config: GuestConfig) -> str:
    """The configuration script for ``config``."""
    lines = ["# vz Machine configuration (generated; read by /init)", _call("vz_root", ROOT_DEVICE, "ext4")]
    lines.append(_call("vz_hostname", config.hostname))
    share = "vz_virtiofs" if config.virtiofs else "vz_share"
    for mount in config.mounts:
        opts = ",".join(("ro" if mount.read_only else "rw", *mount.options))
        if mount.tag:
            lines.append(_call(share, mount.tag, mount.target, opts))
        else:
            lines.append(_call("vz_tmpfs", mount.target, opts))
    if config.rosetta_tag:
        lines.append(_call("vz_rosetta", config.rosetta_tag))
    if config.network:
        lines.append("vz_network_dhcp" if config.dhcp else "vz_network")
    lines.append(_call("vz_file", HOSTS_PATH, "/etc/hosts"))
    if config.resolv_conf:
        resolv = DHCP_RESOLV_PATH if config.network and config.dhcp else RESOLV_PATH
        lines.append(_call("vz_file", resolv, "/etc/resolv.conf"))
    args: list[str]
    if config.vsock is not None:
        args = [str(config.vsock[0]), str(config.vsock[1])]
    else:
        for port in range(1, config.sessions):
            lines.append(_call("vz_session_agent", f"{AGENT_PORT_PREFIX}{port}"))
        args = [f"{AGENT_PORT_PREFIX}0"]
    for name, value in config.env.items():
        args += ["--env", f"{name}={value}"]
    args += ["--poweroff", "--init", "--log", LOG_PATH, "--stop-timeout", f"{max(config.stop_timeout, 0.0):.3f}s"]
    if config.user:
        args += ["--main-user", config.user]
    args += ["--main-workdir", config.workdir or "/"]
    if config.argv:
        args += ["--", *config.argv]
    lines.append(_call("vz_agent_vsock" if config.vsock is not None else "vz_agent", *args))
    return "\n".join(lines) + "\n"


def hosts_file(hostname: str) -> str:
    return f"127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{hostname}\n"


def resolv_file() -> str:
    return "nameserver 10.0.2.3\n"


def env_list(image_env: Sequence[str], *layers: Mapping[str, str]) -> dict[str, str]:
    """The base environment of every command: the image's ``NAME=value`` list, then each layer on top."""
    env: dict[str, str] = {}
    for item in image_env:
        name, sep, value = item.partition("=")
        if sep and name:
            env[name] = value
    for layer in layers:
        env.update(layer)
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env
