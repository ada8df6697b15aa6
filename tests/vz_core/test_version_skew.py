"""Version skew between a host and a plugin, tested both ways with real plugin processes (#31).

The plugins are kept as fixtures (``tests/vz_plugins/testdrivers.py``, ``SKEW``): each answers Info as a plugin
built against that Runtime Protocol version would. This host speaks 1.3. What negotiates and what is refused,
with which message, is the table in docs/driver-authors.md ("Versioning"):

* any 1.x minor negotiates, older and newer; the host uses only what both sides know;
* a capability the plugin's own minor does not have (reuse_preflight before 1.2, RECREATE_MODE_ON_RUN before
  1.3) is refused, naming the field and the version it needs;
* another major is refused, naming both versions and what to install;
* an older host (one that does not offer recreate-on-run, as a 1.2 host) gets DELETE from a 1.3 plugin;
* vz.machine.v1: a plugin without the Extensions service is a plain driver (no extensions); one built against
  a newer extension set (fields this host does not know) negotiates, the unknown fields ignored.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vz_core import RecreateMode
from vz_core.errors import IncompatibleVersionError
from vz_core.negotiate import negotiate
from vz_core.rpc import RemoteDriver
from vz_core.transport import LaunchSpec, PluginLauncher

TESTDRIVERS = Path(__file__).resolve().parents[1] / "vz_plugins" / "testdrivers.py"


def _plugin(kind: str) -> RemoteDriver:
    def prepare() -> LaunchSpec:
        return LaunchSpec(kind, [sys.executable, str(TESTDRIVERS), kind])

    return RemoteDriver(PluginLauncher(prepare, name=kind), mode="warm")


@pytest.mark.parametrize(
    ("kind", "minor", "recreate"),
    [
        ("api-1.0", 0, RecreateMode.DELETE),
        ("api-1.2", 2, RecreateMode.DELETE),
        ("api-1.3", 3, RecreateMode.ON_RUN),
        ("api-1.9", 9, RecreateMode.ON_RUN),
    ],
)
async def test_older_and_newer_minor_versions_negotiate(kind: str, minor: int, recreate: RecreateMode) -> None:
    driver = _plugin(kind)
    try:
        info = await negotiate(driver)
        assert (info.api_major, info.api_minor) == (1, minor)
        assert info.capabilities is not None and info.capabilities.recreate_mode == recreate
        assert await driver.find("nothing") is None  # and the host goes on to use it
    finally:
        await driver.close()


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("api-1.1-claims-reuse", "reuse_preflight is advertised by API 1.1; it needs 1.2 or newer"),
        ("api-1.2-claims-on-run", "RECREATE_MODE_ON_RUN is advertised by API 1.2; it needs 1.3 or newer"),
        (
            "api-2.0",
            "speaks Runtime Protocol 2.0, but this host speaks 1.x (up to 1.3); install a release of the driver for "
            "API 1, or a vz release that speaks API 2",
        ),
    ],
)
async def test_what_a_plugins_version_does_not_have_is_refused(kind: str, message: str) -> None:
    driver = _plugin(kind)
    try:
        with pytest.raises(IncompatibleVersionError) as refused:
            await negotiate(driver)
        assert message in str(refused.value)
    finally:
        await driver.close()


async def test_an_older_host_gets_what_it_asked_for_from_a_newer_plugin() -> None:
    """A host that does not offer recreate-on-run (a 1.2 host) gets DELETE from a 1.3 plugin, and an ON_RUN answer
    it did not offer would be refused."""
    driver = _plugin("api-1.3")
    try:
        info = await negotiate(driver, supports_recreate_on_run=False)
        assert info.capabilities is not None and info.capabilities.recreate_mode == RecreateMode.DELETE
    finally:
        await driver.close()


async def test_extension_sets_older_and_newer() -> None:
    plain, newer = _plugin("api-1.3"), _plugin("ext-newer")
    try:
        assert await plain.extensions() is None  # no vz.machine.v1 service: a plain Runtime Protocol driver
        got = await newer.extensions()
        assert got is not None and got.target_os == ("linux",) and got.profiles == ("developer",)
        assert got.pids_limits is False  # a fact the plugin did not state is not assumed
        await negotiate(newer)
    finally:
        await plain.close()
        await newer.close()
