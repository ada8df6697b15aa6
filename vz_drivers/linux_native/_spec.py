"""The OCI runtime spec (config.json) of a Machine, generated from its record on every start."""

from __future__ import annotations

import resource
from typing import Any

from vz_drivers.linux_native._records import LinuxNativePaths, LinuxNativeRecord
from vz_drivers.linux_native._seccomp import seccomp_profile

__all__ = [
    "AGENT_PATH",
    "ALL_CAPABILITIES",
    "DEVELOPER_CAPABILITIES",
    "HARDENED_CAPABILITIES",
    "RUN_DIR",
    "build_spec",
    "normalize_capability",
]

AGENT_PATH = "/.vz/agent"
"""Where the guest agent binary appears inside every Machine (read-only bind mount)."""
RUN_DIR = "/.vz/run"
"""Where the Machine's host-side run directory (agent socket, main log) appears inside."""

# The default set of container engines: enough for package managers and developer tools.
DEVELOPER_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
# Hardened: what the guest agent needs to run commands as other users, nothing more; no new privileges.
HARDENED_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_KILL",
    "CAP_NET_BIND_SERVICE",
)
ALL_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
)


def normalize_capability(name: str) -> str | None:
    """``"net_admin"`` / ``"CAP_NET_ADMIN"`` → ``"CAP_NET_ADMIN"``; None when unknown ("ALL" is handled by callers)."""
    upper = name.strip().upper()
    if not upper.startswith("CAP_"):
        upper = "CAP_" + upper
    return upper if upper in ALL_CAPABILITIES else None


def _capabilities(record: LinuxNativeRecord) -> list[str]:
    if record.privileged:
        return list(ALL_CAPABILITIES)
    base = DEVELOPER_CAPABILITIES if record.profile == "developer" else HARDENED_CAPABILITIES
    caps = list(base)
    for cap in record.cap_add:
        if cap == "ALL":
            return list(ALL_CAPABILITIES)
        if cap not in caps:
            caps.append(cap)
    return caps


def build_spec(
    record: LinuxNativeRecord,
    paths: LinuxNativePaths,
    *,
    agent_binary: str,
    agent_args: list[str],
    env: dict[str, str],
    cgroups_path: str,
    hostname: str,
    swap_limit: bool = True,
    memory_bytes: int = 0,
    pids: int = 0,
) -> dict[str, Any]:
    """The complete OCI runtime spec for one start of ``record``.

    ``memory_bytes`` and ``pids`` are the limits in force (the record's, or the driver's defaults for this host
    when the record asks for none: docs/security.md, "Resource limits"); 0 leaves that controller unlimited.

    The container's process is the guest agent in init mode (PID 1: child subreaper, runs the main process
    with the Machine's user, logs its output to ``RUN_DIR/main.log``); it runs as root so that it can run
    commands as any user.
    """
    caps = _capabilities(record)
    # runc may not raise the hard limit beyond the driver's own: take the driver's hard limit.
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1048576)
    # The agent starts every command (main and execs) with its own environment as the base
    # (--inherit-env): environment values are secrets and must not appear in its command line.
    base = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME": hostname}
    base.update(env)
    env_list = [f"{k}={v}" for k, v in base.items()]
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev"] + ([] if record.privileged else ["ro"]),
        },
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime"] + ([] if record.privileged else ["ro"]),
        },
        {
            "destination": AGENT_PATH,
            "type": "bind",
            "source": agent_binary,
            "options": ["rbind", "ro", "nosuid", "nodev"],
        },
        {
            "destination": RUN_DIR,
            "type": "bind",
            "source": str(paths.run),
            "options": ["rbind", "rw", "nosuid", "nodev"],
        },
        {"destination": "/etc/hosts", "type": "bind", "source": str(paths.etc / "hosts"), "options": ["rbind", "ro"]},
        {
            "destination": "/etc/hostname",
            "type": "bind",
            "source": str(paths.etc / "hostname"),
            "options": ["rbind", "ro"],
        },
        {
            "destination": "/etc/resolv.conf",
            "type": "bind",
            "source": str(paths.etc / "resolv.conf"),
            "options": ["rbind", "ro"],
        },
    ]
    if memory_bytes:
        mounts.append(
            {
                "destination": "/proc/meminfo",
                "type": "bind",
                "source": str(paths.etc / "meminfo"),
                "options": ["rbind", "ro"],
            }
        )
    if record.cpus:
        mounts.append(
            {
                "destination": "/sys/devices/system/cpu/online",
                "type": "bind",
                "source": str(paths.etc / "cpu-online"),
                "options": ["rbind", "ro"],
            }
        )
    # User mounts come last so that they may shadow image content (never the agent's own mounts: validated).
    for m in record.mounts:
        if m.type == "tmpfs":
            opts = ["nosuid", "nodev", "mode=1777", *m.options]
            if m.read_only:
                opts.append("ro")
            mounts.append({"destination": m.target, "type": "tmpfs", "source": "tmpfs", "options": opts})
        else:
            mounts.append(
                {
                    "destination": m.target,
                    "type": "bind",
                    "source": m.host_path,
                    "options": ["rbind", "ro" if m.read_only else "rw", "nosuid", "nodev"],
                }
            )
    resources: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}]}
    if record.cpuset:
        resources["cpu"] = {"cpus": record.cpuset}
    if memory_bytes:
        # Swap included in the limit (no swapping beyond it) where the controller can say so.
        resources["memory"] = {"limit": memory_bytes}
        if swap_limit:
            resources["memory"]["swap"] = memory_bytes
    if pids:
        resources["pids"] = {"limit": pids}
    linux: dict[str, Any] = {
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
        "cgroupsPath": cgroups_path,
        "resources": resources,
    }
    if record.seccomp:
        linux["seccomp"] = seccomp_profile(caps)
    if not record.privileged:
        linux["maskedPaths"] = [
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/sys/firmware",
            "/proc/scsi",
        ]
        linux["readonlyPaths"] = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": [AGENT_PATH, *agent_args],
            "env": env_list,
            "cwd": "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}],
            "noNewPrivileges": record.no_new_privileges,
        },
        "root": {"path": str(paths.rootfs), "readonly": False},
        "hostname": hostname,
        "mounts": mounts,
        "linux": linux,
    }
