"""Fixtures of the hyperv driver tests: a stand-in Hyper-V host (scripts checked against the documented
parameter sets), a backend that believes it runs on Windows, and the real guest-disk tools of this host."""

from __future__ import annotations

from pathlib import Path

import pytest
from hyperv_standin import WINDOWS, StandInHyperV

from vz_drivers._machine import AgentMachineDriver
from vz_drivers.hyperv._driver import HypervBackend


@pytest.fixture
def standin() -> StandInHyperV:
    return StandInHyperV()


@pytest.fixture
def backend(tmp_path: Path, standin: StandInHyperV) -> HypervBackend:
    """A backend on a private state directory, on a (stand-in) Windows host with Hyper-V."""
    b = HypervBackend(state_dir=tmp_path / "state", runner=standin, host=WINDOWS, stop_timeout=0.2)
    b.stop_slack = 0.2
    AgentMachineDriver(b)  # a backend boots as a driver's: it keeps each boot's identity key there
    return b


@pytest.fixture(scope="session")
def agent_binary() -> str:
    from vz_drivers._agent import ensure_agent_binary

    return str(ensure_agent_binary())


@pytest.fixture(scope="session")
def hyperv_bundle(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The amd64 hyperv guest bundle, built here as `vz guest build --arch amd64 --format hyperv` does (pinned
    Debian packages fetched with apt-get download; nothing of this host's /boot or /lib/modules)."""
    import os

    if os.environ.get("VZ_HYPERV_GUEST"):  # a bundle built elsewhere (the Windows lane: no apt-get there)
        return os.environ["VZ_HYPERV_GUEST"]
    from vz_drivers._agent import ensure_agent_binary
    from vz_drivers._guest import build_bundle

    debs = Path(os.environ.get("VZ_GUEST_DEBS", str(Path.home() / ".cache" / "vz" / "guest-debs")))
    out = tmp_path_factory.mktemp("hyperv-bundle") / "bundle"
    return str(build_bundle("amd64", "hyperv", out, agent=ensure_agent_binary("amd64"), debs=debs).root)


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hyperv-images")
