"""Registers qemu as a built-in driver (cheap to import: no driver code is loaded here)."""

from __future__ import annotations

from vz_core.registry import BuiltinDriver, hookimpl


@hookimpl
def vz_builtin_drivers() -> list[BuiltinDriver]:
    return [
        BuiltinDriver(
            name="qemu",
            summary="Linux Machines as QEMU virtual machines: KVM where usable, otherwise TCG; guest agent as init",
            factory="vz_drivers.qemu:QemuDriver",
            plugin_command=("vz-driver-qemu",),
            targets=("linux",),
            options={
                "state_dir": "where Machines are recorded (default <vz state>/drivers/qemu)",
                "image_dir": "image store root (default: the shared vz image cache)",
                "qemu": "path of qemu-system-x86_64 (default: found on PATH)",
                "kernel": "guest kernel image (default: the newest /boot/vmlinuz-* with a module tree)",
                "modules": "module tree of that kernel (default /lib/modules/<release>)",
                "busybox": "statically linked busybox for the initramfs (default /bin/busybox)",
                "accelerator": "auto (KVM when it can run the guest, else TCG), kvm (required) or tcg",
                "sessions": "agent ports per Machine: host processes that can talk to it at once (default 3)",
                "stop_timeout": "seconds between SIGTERM and SIGKILL of the main process on Stop (default 10)",
                "boot_timeout": "seconds a boot may take until the guest agent answers (default 300)",
                "insecure_registries": "comma-separated registry hosts reached over plain HTTP",
                "agent_binary": "a prebuilt guest agent (default: built from the bundled sources)",
            },
        )
    ]
