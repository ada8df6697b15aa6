"""Choosing the accelerator: KVM when it can really run the guest kernel, otherwise TCG, always with a reason.

``/dev/kvm`` existing is not enough. Hosts whose KVM is the PVM flavour (module ``kvm_pvm``, as on some cloud
sandboxes) only run guest kernels built for PVM: a stock kernel started there hangs before printing anything.
The checks, cheapest first:

1. ``accelerator=tcg`` asked for: TCG.
2. no ``/dev/kvm``, or it cannot be opened read-write: TCG.
3. ``kvm_pvm`` is the only KVM module and the guest kernel's config does not enable ``CONFIG_PVM_GUEST``: TCG.
4. otherwise a bounded probe boot: the guest kernel under KVM must print its banner on the serial console
   within a few seconds. The verdict is cached per (kernel, QEMU, host kernel) on disk.

``accelerator=kvm`` turns a TCG verdict into an error naming the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import UnavailableError
from vz_drivers._guest import Kernel

__all__ = ["ACCELERATORS", "Accelerator", "choose_accelerator", "guest_is_pvm", "kvm_modules", "probe_kvm"]

ACCELERATORS = ("auto", "kvm", "tcg")
PROBE_MARKER = b"Linux version"
DEFAULT_PROBE_TIMEOUT = 8.0


@dataclass(frozen=True)
class Accelerator:
    """The accelerator new Machines use (``"kvm"`` or ``"tcg"``) and why it was chosen."""

    name: str
    reason: str


def kvm_modules(sys_module: Path = Path("/sys/module")) -> set[str]:
    """The KVM flavours loaded in the host kernel (``kvm_intel``, ``kvm_amd``, ``kvm_pvm``)."""
    return {name for name in ("kvm_intel", "kvm_amd", "kvm_pvm") if (sys_module / name).exists()}


def guest_is_pvm(kernel: Kernel) -> bool | None:
    """Whether the guest kernel is built as a PVM guest; None when its configuration cannot be found."""
    candidates = [kernel.image.parent / f"config-{kernel.release}"] if kernel.release else []
    if kernel.modules_dir is not None:
        candidates.append(kernel.modules_dir / "build" / ".config")
    for config in candidates:
        try:
            text = config.read_text(errors="replace")
        except OSError:
            continue
        return "\nCONFIG_PVM_GUEST=y" in "\n" + text
    return None


async def probe_kvm(qemu: str, kernel_image: Path, timeout: float = DEFAULT_PROBE_TIMEOUT) -> bool:  # noqa: ASYNC109
    """Boot ``kernel_image`` under KVM without disks and wait (at most ``timeout`` s) for its banner on the serial
    console. True when it printed it; the probe VM is always killed and reaped."""
    args = [
        qemu,
        "-machine",
        "q35,accel=kvm",
        "-cpu",
        "host",
        "-m",
        "256",
        "-smp",
        "1",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-serial",
        "stdio",
        "-kernel",
        str(kernel_image),
        "-append",
        "console=ttyS0 earlyprintk=ttyS0 panic=-1 no_timer_check",
    ]
    proc = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert proc.stdout is not None
    seen = b""
    try:
        async with asyncio.timeout(timeout):
            while PROBE_MARKER not in seen:
                chunk = await proc.stdout.read(4096)
                if not chunk:
                    break
                seen = seen[-4096:] + chunk
    except TimeoutError:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
    return PROBE_MARKER in seen


def _cache_key(qemu: str, kernel: Kernel) -> str:
    try:
        st = os.stat(qemu)
        qemu_id = f"{qemu}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        qemu_id = qemu
    raw = "\0".join((qemu_id, kernel.fingerprint(), platform.release(), ",".join(sorted(kvm_modules()))))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


async def choose_accelerator(
    requested: str,
    *,
    qemu: str,
    kernel: Kernel,
    cache: Path,
    kvm_device: Path = Path("/dev/kvm"),
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
) -> Accelerator:
    """The accelerator for ``requested`` ("auto", "kvm" or "tcg").

    Raises ``UnavailableError`` (with the reason) when ``requested`` is "kvm" and KVM cannot run the guest here.
    """
    if requested == "tcg":
        return Accelerator("tcg", "TCG (software emulation) was requested with accelerator=tcg")
    verdict = await asyncio.to_thread(_quick_verdict, kernel, kvm_device)
    if verdict is None:
        verdict = await _probed_verdict(qemu=qemu, kernel=kernel, cache=cache, limit=probe_timeout)
    if verdict.name == "kvm":
        return verdict
    if requested == "kvm":
        raise UnavailableError(
            f"accelerator=kvm was requested but KVM cannot run the guest here: {verdict.reason}; use "
            "accelerator=auto (falls back to TCG) or fix KVM on this host",
            details={"option": "accelerator"},
        )
    return verdict


def _quick_verdict(kernel: Kernel, kvm_device: Path) -> Accelerator | None:
    """The verdict that needs no probe boot, or None when only a probe can tell."""
    if not kvm_device.exists():
        return Accelerator(
            "tcg", f"{kvm_device} does not exist (no hardware virtualization, or it is not exposed to this host)"
        )
    try:
        fd = os.open(kvm_device, os.O_RDWR)
    except OSError as exc:
        return Accelerator(
            "tcg", f"{kvm_device} cannot be opened ({exc.strerror}); add the user to the group owning it (kvm)"
        )
    os.close(fd)
    modules = kvm_modules()
    if "kvm_pvm" in modules and not modules & {"kvm_intel", "kvm_amd"}:
        pvm = guest_is_pvm(kernel)
        if pvm is False:
            return Accelerator(
                "tcg",
                f"{kvm_device} is PVM KVM (kvm_pvm), which only runs PVM-enabled guest kernels, and the guest kernel "
                f"{kernel.release or kernel.image} is not one (CONFIG_PVM_GUEST unset); using TCG",
            )
    return None


def _read_cached(path: Path) -> Accelerator | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        doc = json.loads(path.read_text())
        return Accelerator(str(doc["name"]), str(doc["reason"]))
    return None


def _write_cached(path: Path, verdict: Accelerator) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"name": verdict.name, "reason": verdict.reason}))
        os.replace(tmp, path)


async def _probed_verdict(*, qemu: str, kernel: Kernel, cache: Path, limit: float) -> Accelerator:
    modules = kvm_modules()
    cached = cache / f"{await asyncio.to_thread(_cache_key, qemu, kernel)}.json"
    verdict = await asyncio.to_thread(_read_cached, cached)
    if verdict is not None:
        return verdict
    if await probe_kvm(qemu, kernel.image, limit):
        verdict = Accelerator("kvm", f"KVM runs the guest kernel {kernel.release or kernel.image} (probe boot)")
    else:
        verdict = Accelerator(
            "tcg",
            f"a probe boot of the guest kernel {kernel.release or kernel.image} under KVM printed nothing within "
            f"{limit:g} s ({', '.join(sorted(modules)) or 'unknown KVM module'}); using TCG",
        )
    await asyncio.to_thread(_write_cached, cached, verdict)
    return verdict
