"""Helpers for the suite's own tests: synthetic reports that pass the gate, and the fake driver's providers."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

from vz_conformance import _capabilities as cap
from vz_conformance import _catalogue
from vz_conformance._providers import ExternalProvider, InProcessProvider, ProviderMode, sha256_of
from vz_conformance._report import (
    CaseEntry,
    DriverRecord,
    HostRecord,
    Report,
    RunRecord,
    Selection,
    info_record,
)
from vz_conformance._runner import suite_version
from vz_conformance.adapters import FakeAdapter

from vz_core import Capabilities, DriverInfo, Extensions, MountType, RecreateMode

NOW = datetime(2026, 1, 1, tzinfo=UTC)
INFO = DriverInfo(
    "fake",
    "1.0",
    "fake",
    "1",
    Capabilities(recreate_mode=RecreateMode.DELETE, provisioning_preflight=True, logs=True, reuse_preflight=True),
)
EXTENSIONS = Extensions()
ON_RUN = RecreateMode.ON_RUN


def passing_run(mode: ProviderMode, labels: list[str] | None = None) -> RunRecord:
    """A run in which every case passed, or is not applicable for a capability INFO declares absent."""
    record = info_record(INFO, EXTENSIONS, ON_RUN)
    values = record.to_values()
    cases = []
    for case in _catalogue.select(mode, labels):
        absent = [name for name in case.gated_by if not cap.declared(name, *values)]
        if absent:
            cases.append(
                CaseEntry(
                    id=case.id,
                    label=case.label,
                    outcome="not-applicable",
                    capability=absent[0],
                    refusal="RunImage refused as UNSUPPORTED, nothing created",
                    duration_s=0.01,
                    attempts=1,
                )
            )
        else:
            cases.append(CaseEntry(id=case.id, label=case.label, outcome="passed", duration_s=0.01, attempts=1))
    source = "registry" if mode == "in-process" else "plugin"
    return RunRecord(
        provider_mode=mode,
        driver=DriverRecord(source=source, name="fake"),
        info=record,
        started_at=NOW,
        finished_at=NOW,
        cases=cases,
    )


def passing_report(mode: str, labels: list[str] | None = None) -> Report:
    modes: list[ProviderMode] = ["in-process", "external"] if mode == "parity" else [mode]  # type: ignore[list-item]
    chosen = [label for label in _catalogue.LABELS if labels is None or label in labels]
    return Report(
        suite_version=suite_version(),
        catalogue_digest=_catalogue.digest(),
        provider_mode=mode,  # type: ignore[arg-type]
        selection=Selection(labels=chosen),
        host=HostRecord(os="linux", arch="amd64", python="3.11"),
        started_at=NOW,
        finished_at=NOW,
        runs=[passing_run(m, labels) for m in modes],
    )


def fake_plugin() -> Path:
    found = shutil.which("vz-driver-fake")
    assert found is not None, "vz-driver-fake must be installed (pip install -e .)"
    return Path(found)


def fake_providers(
    state: Path, *, faults: tuple[str, ...] = (), handshake_timeout: float = 15.0
) -> tuple[InProcessProvider, ExternalProvider]:
    """The fake driver in-process and as its plugin, with ``faults`` and separate state directories."""
    adapter = FakeAdapter()
    in_process = InProcessProvider(
        "fake", options={**adapter.driver_options(state / "in-process"), "faults": list(faults)}
    )
    plugin = fake_plugin()
    fault_args = [arg for name in faults for arg in ("--fault", name)]
    external = ExternalProvider(
        plugin,
        sha256_of(plugin),
        args=[*adapter.plugin_args(state / "external"), *fault_args],
        handshake_timeout=handshake_timeout,
        name="fake",
    )
    return in_process, external


# Not a mount type the driver declares in INFO, so mounts cases are not applicable in passing reports.
assert MountType.BIND not in (INFO.capabilities or Capabilities()).mount_types
