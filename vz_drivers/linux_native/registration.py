"""Registers linux_native as a built-in driver (cheap to import: no driver code is loaded here)."""

from __future__ import annotations

from vz_core.registry import BuiltinDriver, hookimpl


@hookimpl
def vz_builtin_drivers() -> list[BuiltinDriver]:
    return [
        BuiltinDriver(
            name="linux_native",
            summary="Linux Machines as runc containers: own namespaces, cgroup limits, overlay root layer",
            factory="vz_drivers.linux_native:LinuxNativeDriver",
            plugin_command=("vz-driver-linux-native",),
            targets=("linux",),
            options={
                "state_dir": "where Machines are recorded (default <vz state>/drivers/linux_native)",
                "image_dir": "image store root (default: the shared vz image cache)",
                "runc": "path of runc (default: found on PATH)",
                "runc_sha256": "pinned SHA-256 of runc (default: trust on first use)",
                "cgroup_parent": "cgroup directory of all Machines (default vz)",
                "subnet": "IPv4 range for Machines with egress allowed (default 10.231.0.0/16)",
                "stop_timeout": "seconds between SIGTERM and SIGKILL on Stop (default 10)",
                "insecure_registries": "comma-separated registry hosts reached over plain HTTP",
                "agent_binary": "a prebuilt guest agent (default: built from the bundled sources)",
            },
        )
    ]
