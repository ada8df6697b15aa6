"""The vfkit driver: Linux Machines on macOS through vfkit (Apple's Virtualization.framework).

Status: DEV. Written against vfkit 0.6's documented interface and tested here (Linux) against that interface
(flag grammar, a stand-in REST server, a stand-in vfkit process); not yet verified on a Mac. The macOS CI lane
(.github/workflows/macos.yml) is what turns it ACTIVE.

Info and Preflight always answer. On a host that is not macOS, or without vfkit, Preflight fails with the
reason (``UnsupportedError`` / ``UnavailableError``) and every Machine operation fails the same way before
touching anything; Find of a Machine that was never created answers "not found" so status works everywhere.
See docs/drivers/vfkit.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from vz_core import (
    Capabilities,
    Driver,
    DriverInfo,
    ExecEvent,
    ExecSpec,
    Extensions,
    MachineDetails,
    MountType,
    RecreateMode,
    RunImageRequest,
)
from vz_core.errors import DriverError, InvalidArgumentError, UnavailableError, UnsupportedError
from vz_drivers.vfkit._binary import VfkitBinary
from vz_drivers.vfkit._host import HostSupport, host_support
from vz_drivers.vfkit._options import DRIVER_NAME, VfkitOptions, parse_options

__all__ = ["DRIVER_NAME", "STATUS", "VfkitDriver"]

STATUS = "DEV (written to vfkit's documented interface; not verified on a Mac)"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vz")
    except Exception:
        return "0.0.0"


class VfkitDriver(Driver):
    """Linux Machines as vfkit virtual machines (macOS only). Options: see ``vz_drivers.vfkit._options``."""

    def __init__(self, **options: Any) -> None:
        self._opts: VfkitOptions = parse_options(**options)
        self._binary = VfkitBinary(
            self._opts.vfkit, state_root=self._opts.state_root, pinned_sha256=self._opts.vfkit_sha256
        )
        self._support: HostSupport | None = None

    @property
    def options(self) -> VfkitOptions:
        return self._opts

    def _host(self) -> HostSupport:
        if self._support is None:
            self._support = host_support()
        return self._support

    # ------------------------------------------------------------------ discovery (always answers)

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        runtime_version = ""
        if self._host().supported:
            try:
                runtime_version = (await asyncio.to_thread(self._binary.version))[0]
            except DriverError:
                runtime_version = ""
        return DriverInfo(
            driver_name=DRIVER_NAME,
            driver_version=_version(),
            runtime_name="vfkit",
            runtime_version=runtime_version,
            capabilities=Capabilities(
                mount_types=(MountType.BIND, MountType.VOLUME, MountType.TMPFS),
                requires_mount_streaming=False,
                requires_workspace_chown=False,
                recreate_mode=RecreateMode.DELETE,
                provisioning_preflight=True,
                reprovision=False,
                logs=True,
                reuse_preflight=True,
            ),
        )

    async def extensions(self) -> Extensions | None:
        host = self._host()
        facts: dict[str, str] = {
            "status": STATUS,
            "state_dir": str(self._opts.state_root),
            "host_os": host.system,
            "host_supported": "yes" if host.supported else f"no: {host.reason}",
            "agent_transport": "virtio-vsock (vfkit socketURL, connect mode)",
            "shares": "virtio-fs (read-only enforced in the guest)",
            "network": "virtio-net NAT (Virtualization.framework)",
            "rosetta": "available" if host.rosetta else "not available",
            "nested": "possible" if host.nested else "not available",
        }
        if host.supported:
            try:
                verified = await asyncio.to_thread(self._binary.verify)
                facts["vfkit"] = verified.source
                facts["vfkit_sha256"] = verified.sha256
                facts["vfkit_version"] = (await asyncio.to_thread(self._binary.version))[0]
            except DriverError as exc:
                facts["vfkit"] = f"unavailable: {exc.message}"
        return Extensions(
            target_os=("linux",),
            accelerator="virtualization.framework" if host.supported else "",
            accelerator_reason="" if host.supported else host.reason,
            facts=facts,
        )

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        host = self._host()
        if not host.supported:
            raise UnsupportedError(host.reason, details={"driver": DRIVER_NAME, "host_os": host.system})
        await asyncio.to_thread(self._binary.check_version)

    async def provisioning_preflight(self) -> None:
        await self.preflight()
        for name, value in (("kernel", self._opts.kernel), ("initrd", self._opts.initrd)):
            if not value:
                raise UnavailableError(
                    f"the vfkit driver needs the option {name}=<absolute path> (an uncompressed Linux kernel and "
                    "the vz guest initramfs built for it; see docs/drivers/vfkit.md)",
                    details={"option": name},
                )
        await self._lifecycle()

    async def target_architecture(self, workspace_id: str) -> str:
        _check_id(workspace_id)
        arch = self._host().architecture
        return arch if arch in ("amd64", "arm64") else "arm64"

    # ------------------------------------------------------------------ Machines

    async def _lifecycle(self) -> Driver:
        """The Machine lifecycle on a supported host (records, locks, agent); preflight passed before."""
        raise UnsupportedError(
            "the vfkit Machine lifecycle (records, boot, agent) is not available in this build; the driver is "
            f"{STATUS}",
            details={"driver": DRIVER_NAME},
        )

    async def _machines(self) -> Driver:
        await self.preflight()
        return await self._lifecycle()

    async def find(self, workspace_id: str) -> MachineDetails | None:
        _check_id(workspace_id)
        if not (self._opts.state_root / "machines").is_dir():
            return None  # nothing was ever created here (every non-macOS host)
        return await (await self._machines()).find(workspace_id)

    async def reuse_preflight(self, workspace_id: str, remote_user: str) -> None:
        _check_id(workspace_id)
        await (await self._machines()).reuse_preflight(workspace_id, remote_user)

    async def run_image(self, request: RunImageRequest) -> None:
        _check_id(request.workspace_id)
        if not request.image:
            raise InvalidArgumentError("RunImage needs an image", details={"field": "image"})
        await (await self._machines()).run_image(request)

    async def start(self, workspace_id: str) -> None:
        _check_id(workspace_id)
        await (await self._machines()).start(workspace_id)

    async def stop(self, workspace_id: str) -> None:
        _check_id(workspace_id)
        await (await self._machines()).stop(workspace_id)

    async def delete(self, workspace_id: str) -> None:
        _check_id(workspace_id)
        if not (self._opts.state_root / "machines").is_dir():
            return  # Delete of a missing Machine succeeds
        await (await self._machines()).delete(workspace_id)

    async def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        _check_id(spec.workspace_id)
        if not spec.argv:
            raise InvalidArgumentError("exec needs a non-empty argv", details={"field": "argv"})
        machines = await self._machines()
        async for event in machines.exec(spec, stdin):
            yield event

    async def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        _check_id(workspace_id)
        machines = await self._machines()
        async for chunk in machines.logs(workspace_id):
            yield chunk


def _check_id(workspace_id: str) -> None:
    if not workspace_id:
        raise InvalidArgumentError("workspace_id must not be empty", details={"field": "workspace_id"})
