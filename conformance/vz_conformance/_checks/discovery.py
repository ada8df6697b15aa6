"""discovery: Info, Preflight, ProvisioningPreflight, TargetArchitecture."""

from __future__ import annotations

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._expect import category_of, describe, ensure, expect_error, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed
from vz_core import ARCHITECTURES, EgressPolicy, MountType, RecreateMode
from vz_core.errors import DriverError

__all__ = [
    "CASES",
    "check_info_valid",
    "check_preflight",
    "check_provisioning_preflight",
    "check_target_architecture",
]

_KNOWN_MOUNTS = {int(MountType.BIND), int(MountType.VOLUME), int(MountType.TMPFS)}
_KNOWN_MODES = {int(RecreateMode.DELETE), int(RecreateMode.STOP), int(RecreateMode.ON_RUN)}
_KNOWN_EGRESS = {int(EgressPolicy.ALLOW), int(EgressPolicy.DENY)}
_TARGET_OS = {"linux", "darwin", "windows"}


async def check_info_valid(ctx: CheckContext) -> Outcome:
    """Info names the driver and runtime, speaks API major 1, and declares only known, consistent values."""
    info = await expect_ok("Info", ctx.driver.info)
    ensure(info.api_major == 1, "Info", "api_major=1", info.api_major)
    for field in ("driver_name", "driver_version", "runtime_name"):
        value = getattr(info, field)
        ensure(isinstance(value, str) and bool(value.strip()), "Info", f"a non-empty {field}", value)
    caps = info.capabilities
    if caps is None:
        fail("Info", "the capabilities message to be present", "no capabilities")
    for index, kind in enumerate(caps.mount_types):
        ensure(
            int(kind) in _KNOWN_MOUNTS,
            "Info",
            "capabilities.mount_types of BIND, VOLUME or TMPFS only",
            f"mount_types[{index}]={int(kind)}",
            note="UNSPECIFIED and unknown values are refused by hosts",
        )
    ensure(len(set(caps.mount_types)) == len(caps.mount_types), "Info", "no duplicate mount types", caps.mount_types)
    ensure(
        int(caps.recreate_mode) in _KNOWN_MODES,
        "Info",
        "recreate_mode DELETE, STOP or ON_RUN",
        f"recreate_mode={int(caps.recreate_mode)}",
        note="UNSPECIFIED and unknown values are refused by hosts",
    )
    if caps.reuse_preflight:
        ensure(
            info.api_minor >= 2,
            "Info",
            "api_minor >= 2 when reuse_preflight is declared",
            f"api_minor={info.api_minor}",
        )
    opted = await expect_ok(
        "Info(supports_recreate_on_run=true)", lambda: ctx.driver.info(supports_recreate_on_run=True)
    )
    opted_mode = int((opted.capabilities or caps).recreate_mode)
    ensure(
        opted_mode in _KNOWN_MODES,
        "Info(supports_recreate_on_run=true)",
        "recreate_mode DELETE, STOP or ON_RUN",
        f"recreate_mode={opted_mode}",
    )
    if opted_mode == RecreateMode.ON_RUN:
        ensure(
            opted.api_minor >= 3,
            "Info(supports_recreate_on_run=true)",
            "api_minor >= 3 when answering ON_RUN",
            f"api_minor={opted.api_minor}",
        )
    ext = await expect_ok("Extensions (vz.machine.v1)", ctx.driver.extensions)
    if ext is not None:
        ensure(ext.extensions_version == 1, "Extensions", "extensions_version=1", ext.extensions_version)
        for policy in ext.egress_policies:
            ensure(int(policy) in _KNOWN_EGRESS, "Extensions", "egress_policies of ALLOW or DENY only", int(policy))
        unknown_os = sorted(set(ext.target_os) - _TARGET_OS)
        ensure(not unknown_os, "Extensions", f"target_os within {sorted(_TARGET_OS)}", unknown_os)
    return Passed()


async def check_preflight(ctx: CheckContext) -> Outcome:
    """Preflight succeeds, or refuses this host as UNAVAILABLE/UNSUPPORTED with an actionable message."""
    try:
        await ctx.driver.preflight()
    except Exception as exc:
        category = category_of(exc)
        if category not in {"UNAVAILABLE", "UNSUPPORTED"}:
            fail("Preflight", "success, or UNAVAILABLE/UNSUPPORTED for a host the driver cannot serve", describe(exc))
        if isinstance(exc, DriverError) and not exc.message.strip():
            fail("Preflight", f"{category} with an actionable message", "an empty message")
        return Passed(note=f"refused this host as {category}: {exc}")
    return Passed()


async def check_provisioning_preflight(ctx: CheckContext) -> Outcome:
    """ProvisioningPreflight succeeds when advertised; otherwise it is refused as UNSUPPORTED."""
    if not ctx.caps.provisioning_preflight:
        return await ctx.not_applicable(
            cap.PROVISIONING_PREFLIGHT,
            "ProvisioningPreflight refused as UNSUPPORTED",
            lambda: expect_error(
                "ProvisioningPreflight",
                ctx.driver.provisioning_preflight,
                "UNSUPPORTED",
                note="capabilities.provisioning_preflight=false",
            ),
        )
    await expect_ok("ProvisioningPreflight", ctx.driver.provisioning_preflight)
    return Passed()


async def check_target_architecture(ctx: CheckContext) -> Outcome:
    """TargetArchitecture answers exactly "amd64" or "arm64" (before any Machine exists)."""
    workspace_id = ctx.new_id("arch")
    arch = await expect_ok("TargetArchitecture", lambda: ctx.driver.target_architecture(workspace_id))
    ensure(arch in ARCHITECTURES, "TargetArchitecture", f"exactly one of {list(ARCHITECTURES)}", arch)
    return Passed()


CASES = (
    Case(
        "discovery.info_valid",
        "Info: names, API major 1, known enums, capabilities consistent with API minor",
        check_info_valid,
    ),
    Case(
        "discovery.preflight",
        "Preflight succeeds or refuses the host as UNAVAILABLE/UNSUPPORTED with a message",
        check_preflight,
    ),
    Case(
        "discovery.provisioning_preflight",
        "ProvisioningPreflight succeeds when advertised, else UNSUPPORTED",
        check_provisioning_preflight,
        gated_by=(cap.PROVISIONING_PREFLIGHT,),
    ),
    Case("discovery.target_architecture", "TargetArchitecture is exactly amd64 or arm64", check_target_architecture),
)
