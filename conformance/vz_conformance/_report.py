"""The conformance report: one JSON document per run (or per parity pair), validated by its JSON Schema.

Shape::

    {schema_version, suite_version, catalogue_digest, provider_mode: in-process|external|parity,
     selection: {labels, case_filter, dry_run}, host: {os, arch, python}, started_at, finished_at,
     runs: [{provider_mode, driver: {...}, info: {...}, started_at, finished_at, cleanup_problems,
             cases: [{id, label, outcome, capability, refusal, note, duration_s, attempts, failure}]}]}

A parity report holds two runs (in-process, then external). ``schema()`` is the published JSON Schema.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vz_core import Capabilities, DriverInfo, EgressPolicy, Extensions, MountType, RecreateMode

__all__ = [
    "SCHEMA_VERSION",
    "CaseEntry",
    "DriverRecord",
    "EntryOutcome",
    "HostRecord",
    "InfoRecord",
    "Report",
    "RunRecord",
    "Selection",
    "info_record",
    "load_report",
    "schema",
]

SCHEMA_VERSION = 1
EntryOutcome = Literal["passed", "failed", "not-applicable", "skipped"]
Mode = Literal["in-process", "external"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CaseEntry(_Model):
    """One case as it ran: ``attempts`` is 1 for every case that ran (0 only in a dry run)."""

    id: str = Field(pattern=r"^[a-z]+\.[a-z0-9_]+$")
    label: str
    outcome: EntryOutcome
    capability: str | None = Field(default=None, description="declared-absent capability (not-applicable only)")
    refusal: str | None = Field(default=None, description="the refusal the suite verified (not-applicable only)")
    note: str | None = None
    duration_s: float = Field(ge=0)
    attempts: int = Field(ge=0)
    failure: str | None = Field(default=None, description="the assertion text (failed only)")


class CapabilitiesRecord(_Model):
    mount_types: list[int]
    requires_mount_streaming: bool
    requires_workspace_chown: bool
    recreate_mode: int
    provisioning_preflight: bool
    reprovision: bool
    logs: bool
    reuse_preflight: bool


class ExtensionsRecord(_Model):
    extensions_version: int
    target_os: list[str]
    profiles: list[str]
    tty: bool
    accelerator: str
    snapshots: bool
    egress_policies: list[int]
    resource_limits: bool
    storage_limits: bool
    terminal: bool = False
    topology: bool = Field(
        default=False, description="the Extensions fact 'topology' is present (the driver reads the vz.network label)"
    )
    services: bool = Field(default=False, description="SetServices, ServiceStates and ServiceLogs are served")


class InfoRecord(_Model):
    """The driver's Info as the suite received it (enum values as numbers), plus its extensions and the
    recreate mode it answers to a host that opted in to recreate-on-run."""

    driver_name: str
    driver_version: str
    runtime_name: str
    runtime_version: str
    api_major: int
    api_minor: int
    capabilities: CapabilitiesRecord | None
    recreate_mode_on_run: int | None
    extensions: ExtensionsRecord | None

    def to_values(self) -> tuple[DriverInfo, Extensions | None, RecreateMode | int | None]:
        caps = None
        if self.capabilities is not None:
            c = self.capabilities
            caps = Capabilities(
                mount_types=tuple(_enum(MountType, m) for m in c.mount_types),
                requires_mount_streaming=c.requires_mount_streaming,
                requires_workspace_chown=c.requires_workspace_chown,
                recreate_mode=_enum(RecreateMode, c.recreate_mode),
                provisioning_preflight=c.provisioning_preflight,
                reprovision=c.reprovision,
                logs=c.logs,
                reuse_preflight=c.reuse_preflight,
            )
        info = DriverInfo(
            self.driver_name,
            self.driver_version,
            self.runtime_name,
            self.runtime_version,
            caps,
            self.api_major,
            self.api_minor,
        )
        ext = None
        if self.extensions is not None:
            e = self.extensions
            ext = Extensions(
                extensions_version=e.extensions_version,
                target_os=tuple(e.target_os),
                profiles=tuple(e.profiles),
                tty=e.tty,
                accelerator=e.accelerator,
                snapshots=e.snapshots,
                egress_policies=tuple(_enum(EgressPolicy, p) for p in e.egress_policies),
                resource_limits=e.resource_limits,
                storage_limits=e.storage_limits,
                terminal=e.terminal,
                facts={"topology": "declared in the report"} if e.topology else {},
                services=e.services,
            )
        on_run = None if self.recreate_mode_on_run is None else _enum(RecreateMode, self.recreate_mode_on_run)
        return info, ext, on_run


def _enum(cls: Any, value: int) -> Any:
    try:
        return cls(value)
    except ValueError:
        return value


def info_record(info: DriverInfo, ext: Extensions | None, on_run: RecreateMode | int | None) -> InfoRecord:
    caps = None
    if info.capabilities is not None:
        c = info.capabilities
        caps = CapabilitiesRecord(
            mount_types=[int(m) for m in c.mount_types],
            requires_mount_streaming=c.requires_mount_streaming,
            requires_workspace_chown=c.requires_workspace_chown,
            recreate_mode=int(c.recreate_mode),
            provisioning_preflight=c.provisioning_preflight,
            reprovision=c.reprovision,
            logs=c.logs,
            reuse_preflight=c.reuse_preflight,
        )
    extensions = None
    if ext is not None:
        extensions = ExtensionsRecord(
            extensions_version=ext.extensions_version,
            target_os=list(ext.target_os),
            profiles=list(ext.profiles),
            tty=ext.tty,
            accelerator=ext.accelerator,
            snapshots=ext.snapshots,
            egress_policies=[int(p) for p in ext.egress_policies],
            resource_limits=ext.resource_limits,
            storage_limits=ext.storage_limits,
            terminal=ext.terminal,
            topology=bool(ext.facts.get("topology")),
            services=ext.services,
        )
    return InfoRecord(
        driver_name=info.driver_name,
        driver_version=info.driver_version,
        runtime_name=info.runtime_name,
        runtime_version=info.runtime_version,
        api_major=info.api_major,
        api_minor=info.api_minor,
        capabilities=caps,
        recreate_mode_on_run=None if on_run is None else int(on_run),
        extensions=extensions,
    )


class DriverRecord(_Model):
    """Where the driver came from: a registered name (in-process), a plugin binary and its checksum launched by
    the suite, or the vz daemon's own session of a registered driver (``--through-daemon``: the installed
    console script and its checksum, launched by the daemon)."""

    source: Literal["registry", "plugin", "daemon"]
    name: str
    plugin_path: str | None = None
    sha256: str | None = None
    args: list[str] = Field(default_factory=list)
    options: list[str] = Field(default_factory=list, description="names of in-process options (values not recorded)")


class RunRecord(_Model):
    provider_mode: Mode
    driver: DriverRecord
    info: InfoRecord | None
    info_error: str | None = None
    started_at: datetime
    finished_at: datetime
    cleanup_problems: list[str] = Field(default_factory=list)
    cases: list[CaseEntry]


class Selection(_Model):
    """What was asked for. Only whole labels, no case filter and no dry run can satisfy the gate."""

    labels: list[str]
    case_filter: list[str] | None = None
    dry_run: bool = False


class HostRecord(_Model):
    os: str
    arch: str
    python: str


class Report(_Model):
    schema_version: Literal[1] = 1
    suite_version: str
    catalogue_digest: str
    provider_mode: Literal["in-process", "external", "parity"]
    selection: Selection
    host: HostRecord
    started_at: datetime
    finished_at: datetime
    runs: list[RunRecord] = Field(min_length=1, max_length=2)

    def dump(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2) + "\n")


def load_report(path: Path) -> Report:
    """Parse and validate a report file (pydantic.ValidationError / json errors propagate)."""
    return Report.model_validate(json.loads(path.read_text()))


def schema() -> dict[str, Any]:
    """The published JSON Schema of a report."""
    doc = Report.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["$id"] = "vz-conformance-report.schema.json"
    doc["title"] = "vz conformance report"
    return doc
