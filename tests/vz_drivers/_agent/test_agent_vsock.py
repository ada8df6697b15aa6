"""The agent over AF_VSOCK, for real: a TCG guest with Debian's kernel and its ``vsock_loopback`` module.

The host has no vsock transport, so the test boots a small initramfs (busybox, the agent, the vsock modules and
a probe cross-built from tests/vz_drivers/_agent/vsock_probe) under QEMU. Inside it the probe listens on the
ready port, starts ``vz-agent serve --listen vsock:1234 --ready-vsock 1:1235``, waits for ``ready\\n``, opens
two connections to CID 1 (local) and does HELLO + PING on each (one session per connection), then stops the
agent with SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vz_drivers._guest import CpioEntry, find_busybox, find_kernel, resolve_modules, strip_module_signature, write_cpio

PROBE = Path(__file__).parent / "vsock_probe"

INIT = """#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
/bin/busybox modprobe vsock_loopback || echo "VSOCK-PROBE-FAILED: modprobe vsock_loopback"
/sbin/vsock-probe /sbin/vz-agent
/bin/busybox poweroff -f
"""


def _build_probe(out: Path, cache: Path) -> None:
    package = cache / "gopath" / "src" / "vsock-probe"
    package.mkdir(parents=True)
    shutil.copyfile(PROBE / "main.go", package / "main.go")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO") and k != "CGO_ENABLED"}
    env.update(GOOS="linux", GOARCH="amd64", CGO_ENABLED="0", GO111MODULE="off", GOFLAGS="")
    gocache = os.environ.get("GOCACHE", "")  # scripts/test.sh shares Go's build cache between the run's builds
    env.update(GOPATH=str(cache / "gopath"), GOCACHE=gocache if os.path.isabs(gocache) else str(cache / "gocache"))
    done = subprocess.run(
        ["go", "build", "-o", str(out), "."], cwd=package, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_agent_serves_sessions_over_vsock_and_signals_ready_over_vsock(tmp_path: Path, agent_binary: str) -> None:
    for tool in ("qemu-system-x86_64", "go"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} missing (qemu-system-x86, golang-go)")
    kernel = find_kernel()
    probe = tmp_path / "vsock-probe"
    _build_probe(probe, tmp_path / "go")
    entries = [CpioEntry.directory(d) for d in ("bin", "dev", "proc", "sys", "sbin", "lib", "lib/modules")]
    mod_dir = f"lib/modules/{kernel.release}"
    entries.append(CpioEntry.directory(mod_dir))
    entries.append(CpioEntry.char_device("dev/console", 5, 1))
    entries.append(CpioEntry.file("bin/busybox", find_busybox().read_bytes(), 0o755))
    entries.append(CpioEntry.file("sbin/vz-agent", Path(agent_binary).read_bytes(), 0o755))
    entries.append(CpioEntry.file("sbin/vsock-probe", probe.read_bytes(), 0o755))
    deps = []
    for module in resolve_modules(kernel, ("vsock_loopback",)):
        entries.append(CpioEntry.file(f"{mod_dir}/{module.name}.ko", strip_module_signature(module.read())))
        deps.append(f"{module.name}.ko:" + "".join(f" {d}.ko" for d in module.deps))
    assert any(line.startswith("vsock.ko") for line in deps), deps
    entries.append(CpioEntry.file(f"{mod_dir}/modules.dep", ("\n".join(deps) + "\n").encode()))
    entries.append(CpioEntry.file("init", INIT.encode(), 0o755))
    initrd = tmp_path / "initrd.cpio"
    with initrd.open("wb") as f:
        write_cpio(f, entries)
    command = [
        "qemu-system-x86_64", "-accel", "tcg", "-m", "256", "-smp", "1", "-nodefaults", "-no-reboot",
        "-display", "none", "-serial", "stdio", "-kernel", str(kernel.image), "-initrd", str(initrd),
        "-append", "console=ttyS0 panic=-1 quiet loglevel=3",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False, stdin=subprocess.DEVNULL)
    console = done.stdout
    assert "VSOCK-PROBE-OK ready two-sessions" in console, console[-3000:] + done.stderr[-2000:]
    assert "VSOCK-PROBE-FAILED" not in console
