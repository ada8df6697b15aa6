"""The QEMU command line of a Machine, launching it detached, and finding the process again later.

A Machine's QEMU runs with ``-daemonize`` in a session of its own: it outlives the driver process (and the
plugin supervisor's clean-up of the plugin's session), and ``-daemonize`` makes the launching process exit only
once every device and socket is set up, so "launched" is a signal rather than a guess. The working directory
is the Machine's ``run/`` directory and every socket path is relative to it, so deep state directories never
hit the 108-byte limit of Unix socket paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from vz_core.errors import RuntimeFailureError, UnavailableError
from vz_drivers._machine import proc_start_time, tail
from vz_drivers.qemu._attach import GuestNetwork, open_taps

__all__ = [
    "QemuBinary",
    "Share",
    "VmSpec",
    "build_command",
    "find_qemu",
    "launch",
]

INSTALL_HINT = "install QEMU (Debian/Ubuntu: `apt-get install qemu-system-x86`) or pass the driver option qemu=<path>"
_VERSION_RE = re.compile(r"version (\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class QemuBinary:
    """A QEMU system emulator and its version ("7.2.22")."""

    path: str
    version: str


def find_qemu(path: str = "") -> QemuBinary:
    """``qemu-system-x86_64`` from ``path`` or PATH; ``UnavailableError`` saying what to install."""
    candidate = path or shutil.which("qemu-system-x86_64") or ""
    if not candidate or not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
        where = f"{path} is not an executable file" if path else "qemu-system-x86_64 is not on PATH"
        raise UnavailableError(f"QEMU is missing: {where}; {INSTALL_HINT}")
    try:
        done = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnavailableError(f"{candidate} --version failed ({exc}); {INSTALL_HINT}") from None
    match = _VERSION_RE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise UnavailableError(f"{candidate} does not look like QEMU (--version said {done.stdout[:100]!r})")
    return QemuBinary(path=os.path.abspath(candidate), version=match.group(1))


@dataclass(frozen=True)
class Share:
    """A host directory shared over virtio-9p under ``tag``."""

    tag: str
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class VmSpec:
    """Everything a Machine's QEMU command line depends on."""

    name: str
    accelerator: str
    cpus: int
    memory_mib: int
    kernel: Path
    initrd: Path
    disk: Path
    config_dir: Path
    shares: tuple[Share, ...] = ()
    egress: str = "allow"
    sessions: int = 1
    kernel_args: tuple[str, ...] = ()
    extra: tuple[str, ...] = field(default_factory=tuple)
    network: GuestNetwork | None = None
    """A version 2 Machine's route-domain attachment: tap devices instead of QEMU user networking."""


CONSOLE_LOG = "console.log"
QMP_SOCKET = "qmp.sock"
PIDFILE = "qemu.pid"
QEMU_LOG = "qemu.log"
"""QEMU's own messages (``-D``): its errors at start, and after ``-daemonize`` everything it writes to stderr, such
as "terminating on signal 15 from pid N (command)" (without it, QEMU sends them to /dev/null)."""


def agent_socket_name(port: int) -> str:
    return f"agent-{port}.sock"


def _security_model() -> str:
    # passthrough keeps real owners and modes on the host files (the workspace stays the developer's), which
    # needs root; an unprivileged QEMU stores guest ownership in extended attributes instead.
    return "passthrough" if os.geteuid() == 0 else "mapped-xattr"


def build_command(qemu: str, spec: VmSpec, tap_fds: tuple[int, ...] = ()) -> list[str]:
    """The full argv of the Machine's QEMU (relative socket paths: run it in the Machine's run/ directory).

    With ``spec.network`` the Machine's NICs are the tap devices ``tap_fds`` (one per attachment, opened by
    ``vz_drivers.qemu._attach.open_taps``) and the guest learns its addresses from the kernel command line."""
    if spec.network is not None and len(tap_fds) != len(spec.network.attachments):
        wanted = len(spec.network.attachments)
        raise ValueError(f"{wanted} attachment(s) need as many tap descriptors, not {len(tap_fds)}")
    kvm = spec.accelerator == "kvm"
    # cryptomgr.notests: the crypto self-tests cost a few hundred ms of boot under TCG. Speculative-execution
    # mitigations protect nothing on an emulated CPU (TCG does not speculate) and slow it down. no_timer_check:
    # the kernel's boot-time test that the timer interrupt arrives through the IO-APIC counts ticks over a short
    # busy wait; a virtual CPU that the host does not run for a moment (TCG on a loaded host) fails it, and the
    # kernel panics with "IO-APIC + timer doesn't work!". VM kernels are commonly booted without that test.
    cmdline = ["console=ttyS0", "quiet", "panic=-1", "tsc=reliable", "no_timer_check", "8250.nr_uarts=1"]
    cmdline.append("cryptomgr.notests")
    if not kvm:
        cmdline.append("mitigations=off")
    cmdline += spec.kernel_args
    if spec.network is not None:
        cmdline += spec.network.kernel_args()
    args = [
        qemu,
        "-name",
        f"{spec.name},process={spec.name}",
        "-machine",
        "q35",
        "-accel",
        "kvm" if kvm else "tcg,thread=multi,tb-size=256",
        "-cpu",
        "host" if kvm else "max",
        "-smp",
        str(spec.cpus),
        "-m",
        f"{spec.memory_mib}M",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(spec.kernel),
        "-initrd",
        str(spec.initrd),
        "-append",
        " ".join(cmdline),
        "-chardev",
        f"file,id=console,path={CONSOLE_LOG}",
        "-serial",
        "chardev:console",
        "-qmp",
        f"unix:{QMP_SOCKET},server=on,wait=off",
        "-pidfile",
        PIDFILE,
        "-D",
        QEMU_LOG,
        "-device",
        "virtio-serial-pci,id=vser,max_ports=8",
    ]
    for port in range(spec.sessions):
        args += [
            "-chardev",
            f"socket,id=agent{port},path={agent_socket_name(port)},server=on,wait=off",
            "-device",
            f"virtserialport,bus=vser.0,nr={port + 1},chardev=agent{port},name=vz.agent.{port}",
        ]
    args += [
        "-drive",
        f"file={_escape(str(spec.disk))},if=none,id=root,format=raw,cache=writeback,discard=unmap",
        "-device",
        "virtio-blk-pci,drive=root",
        "-fsdev",
        f"local,id=fscfg,path={_escape(str(spec.config_dir))},security_model=none,readonly=on",
        "-device",
        "virtio-9p-pci,fsdev=fscfg,mount_tag=vzcfg",
    ]
    model = _security_model()
    for index, share in enumerate(spec.shares):
        ro = ",readonly=on" if share.read_only else ""
        args += [
            "-fsdev",
            f"local,id=fs{index},path={_escape(share.path)},security_model={model}{ro}",
            "-device",
            f"virtio-9p-pci,fsdev=fs{index},mount_tag={share.tag}",
        ]
    if spec.network is not None:
        # The route domain: each attachment a tap whose other end lives in the Environment's namespace; nothing
        # goes through the host's sockets. vhost stays off (no /dev/vhost-net descriptor to hand over).
        for index, (att, fd) in enumerate(zip(spec.network.attachments, tap_fds, strict=True)):
            args += [
                "-netdev",
                f"tap,id=net{index},fd={fd},vhost=off",
                "-device",
                f"virtio-net-pci,netdev=net{index},mac={spec.network.mac(att)},romfile=",
            ]
    else:
        # User networking: "restrict=on" isolates the guest (no connection leaves it; exec is unaffected: it uses
        # virtio-serial). Allowed egress is NAT through the host's own sockets.
        restrict = "on" if spec.egress == "deny" else "off"
        args += [
            "-netdev",
            f"user,id=net0,restrict={restrict},hostname={spec.name}",
            "-device",
            "virtio-net-pci,netdev=net0,romfile=",
        ]
    args += [*spec.extra, "-daemonize"]
    return args


def _escape(value: str) -> str:
    """Escape a value for QEMU's comma-separated option syntax (a literal comma is written twice)."""
    return value.replace(",", ",,")


async def launch(qemu: str, spec: VmSpec, run_dir: Path, *, wrapper: list[str] | None = None) -> tuple[int, int]:
    """Start the Machine's QEMU detached; return (pid, start time) once it has set up every device.

    ``wrapper`` is an argv prefix QEMU is run through (``nsenter --net=...`` for a Machine's own namespace).

    A version 2 Machine's taps are created in its route domain first and handed to QEMU; QEMU then holds the
    only descriptors (ours are closed whatever happens), so the taps go when QEMU goes.

    Raises ``RuntimeFailureError`` with QEMU's own message when it refuses to start.
    """
    for name in (CONSOLE_LOG, PIDFILE, QEMU_LOG, QMP_SOCKET, *(agent_socket_name(p) for p in range(spec.sessions))):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / name).unlink()
    fds = tuple(await open_taps(spec.network)) if spec.network is not None else ()
    try:
        argv = [*(wrapper or ()), *build_command(qemu, spec, fds)]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=run_dir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=fds,
        )
        # The launching process exits when the daemon is initialised; the daemon then drops its copies of our
        # pipes, so reading to the end does not wait for the VM.
        out, err = await proc.communicate()
    finally:
        for fd in fds:
            os.close(fd)
    if proc.returncode != 0:
        # Errors found before QEMU reads -D reach its stderr; later ones its log.
        message = ((err or out).decode(errors="replace") or tail(run_dir / QEMU_LOG)).strip()
        raise RuntimeFailureError(
            "QEMU refused to start the Machine: "
            + (message.splitlines()[-1] if message else f"it exited with status {proc.returncode} and no message"),
            runtime_message=message[-4000:],
        )
    try:
        pid = int((run_dir / PIDFILE).read_text().strip())
    except (OSError, ValueError):
        raise RuntimeFailureError("QEMU started but wrote no pid file") from None
    start = proc_start_time(pid)
    if start is None:
        said = tail(run_dir / QEMU_LOG).strip()
        raise RuntimeFailureError(
            "QEMU exited right after starting the Machine" + (f": {said.splitlines()[-1]}" if said else ""),
            runtime_message=(tail(run_dir / CONSOLE_LOG) + "\n" + said).strip(),
        )
    return pid, start
