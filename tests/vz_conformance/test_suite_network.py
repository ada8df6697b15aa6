"""The network label's own rules: not applicable only with a verified refusal, never passed on a host that cannot
build route domains, and the rig the cases share is removed when the run ends."""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from vz_conformance import InProcessProvider, run_suite
from vz_conformance._checks import network_rig
from vz_conformance.adapters import FakeAdapter
from vz_conformance.fake import FakeDriver

from vz_core import Extensions, RunImageRequest
from vz_core.errors import UnsupportedError
from vz_core.network.label import LABEL


class NoTopology(FakeDriver):
    """The fake without the fact, refusing the label as UNSUPPORTED (a driver that cannot attach)."""

    async def extensions(self) -> Extensions:
        return replace(await super().extensions(), facts={})

    async def run_image(self, request: RunImageRequest) -> None:
        if LABEL in request.label_map():
            raise UnsupportedError("no route domains here")
        await super().run_image(request)


class IgnoresLabel(NoTopology):
    """Without the fact, but silently ignoring the label: a refusal the suite must not accept."""

    async def run_image(self, request: RunImageRequest) -> None:
        labels = tuple(label for label in request.labels if not label.startswith(f"{LABEL}="))
        await FakeDriver.run_image(self, replace(request, labels=labels))


def _run(tmp_path: Path, factory: type[FakeDriver]) -> dict[str, tuple[str, str]]:
    provider = InProcessProvider(factory=factory, options={"state_dir": tmp_path / "state"})
    scratch = tmp_path / "scratch"
    scratch.mkdir(parents=True)
    report = asyncio.run(run_suite([provider], FakeAdapter(), labels=["network"], scratch=scratch))
    assert report.runs[0].cleanup_problems == []
    return {c.id: (c.outcome, c.failure or c.refusal or "") for c in report.runs[0].cases}


def test_without_the_fact_the_cases_are_not_applicable_only_after_a_verified_refusal(tmp_path: Path) -> None:
    refused = _run(tmp_path / "a", NoTopology)
    assert len(refused) == 9
    assert {outcome for outcome, _ in refused.values()} == {"not-applicable"}
    ignored = _run(tmp_path / "b", IgnoresLabel)
    assert {outcome for outcome, _ in ignored.values()} == {"failed"}
    assert all("UNSUPPORTED" in text for _, text in ignored.values())


def test_an_unmet_host_requirement_fails_every_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(network_rig, "requirements", lambda: "the network cases need root (test)")
    result = _run(tmp_path, FakeDriver)
    assert {outcome for outcome, _ in result.values()} == {"failed"}
    assert all("unmet requirement: the network cases need root (test)" in text for _, text in result.values())


@pytest.mark.host_exclusive  # compares every vzc-/vzf- namespace on the host (other runs of the suite make them)
@pytest.mark.skipif(os.geteuid() != 0, reason="route domains need root")
def test_the_fake_passes_and_the_run_leaves_nothing(tmp_path: Path) -> None:
    def ours() -> set[str]:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        return {line.split()[0] for line in out.splitlines() if line.startswith(("vzc-", "vzf-"))}

    before = ours()
    result = _run(tmp_path, FakeDriver)
    assert {outcome for outcome, _ in result.values()} == {"passed"}, result
    assert ours() == before
