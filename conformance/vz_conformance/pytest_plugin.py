"""pytest plugin of the vz conformance suite (registered through the ``pytest11`` entry point).

Options (or the ini keys of the same name without dashes, e.g. ``vz_driver = mydriver``)::

    --vz-driver NAME                 a registered driver, built in-process
    --vz-plugin PATH --vz-sha256 HEX a plugin binary, launched through the supervisor
    --vz-plugin-arg ARG              extra plugin argument (repeatable)
    --vz-driver-option KEY=VALUE     in-process factory option (repeatable)
    --vz-adapter MODULE:ATTR         your Adapter (or implement the ``pytest_vz_adapter`` hook)
    --vz-provider-mode MODE          in-process | external (default: from the source)
    --vz-through-daemon              external: the vz daemon's own plugin of --vz-driver (Drivers.Connect)

The catalogue becomes one test per case through ``test_vz_conformance``: collect it by running
``pytest --pyargs vz_conformance.pytest_suite --vz-driver NAME`` or by importing it into a test module of
yours. Each case carries the marker ``vz_<label>`` (``-m vz_exec``) and ``vz_conformance``. A case that is not
applicable (the capability is declared absent and the refusal was verified) passes and says so in its
``vz_outcome`` user property; it is never skipped.

Fixtures: ``vz_adapter``, ``vz_provider`` (session), ``vz_driver`` (a connected Driver) and ``vz_machine``
(a created Machine's ``RunImageRequest``, deleted afterwards); the last two are async and need pytest-asyncio.

This module is imported by every pytest session in an environment where vz is installed, so it imports the
suite only when a vz option or fixture is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from vz_conformance._labels import LABELS

if TYPE_CHECKING:
    from vz_conformance._adapter import Adapter
    from vz_conformance._case import Case
    from vz_conformance._providers import DriverProvider
    from vz_core import Driver, RunImageRequest

__all__ = ["test_vz_conformance"]

LABEL_MARKER_PREFIX = "vz_"
_OPTIONS = ("vz_driver", "vz_plugin", "vz_sha256", "vz_adapter", "vz_provider_mode")


class _HookSpecs:
    @pytest.hookspec(firstresult=True)
    def pytest_vz_adapter(self, config: pytest.Config, driver_name: str) -> Adapter | None:
        """Return the Adapter for the driver under test (``driver_name`` is the registered name or the plugin
        file name); the first non-None answer wins."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(_HookSpecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vz-conformance", "vz driver conformance suite")
    group.addoption("--vz-driver", metavar="NAME", help="registered driver to test in-process")
    group.addoption("--vz-plugin", metavar="PATH", help="plugin binary to test out of process")
    group.addoption("--vz-sha256", metavar="HEX", help="SHA-256 of --vz-plugin (verified before every launch)")
    group.addoption("--vz-plugin-arg", metavar="ARG", action="append", default=[], help="extra plugin argument")
    group.addoption(
        "--vz-driver-option",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="option for the in-process driver factory",
    )
    group.addoption("--vz-adapter", metavar="MODULE:ATTR", help="the Adapter describing the driver under test")
    group.addoption(
        "--vz-provider-mode",
        choices=("in-process", "external"),
        help="default: in-process for --vz-driver, external for --vz-plugin",
    )
    group.addoption(
        "--vz-through-daemon",
        action="store_true",
        default=False,
        help="external: test the vz daemon's own plugin of --vz-driver (its warm session, through Drivers.Connect)",
    )
    for name in _OPTIONS:
        parser.addini(name, f"default for --{name.replace('_', '-')}", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vz_conformance: a case of the vz conformance suite")
    for label in LABELS:
        config.addinivalue_line("markers", f"{LABEL_MARKER_PREFIX}{label}: vz conformance cases of label {label!r}")


def _opt(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    if value in (None, []):
        ini = config.getini(name)
        return ini or value
    return value


def _mode(config: pytest.Config) -> str:
    driver, plugin = _opt(config, "vz_driver"), _opt(config, "vz_plugin")
    if not driver and not plugin:
        raise pytest.UsageError("the vz conformance tests need --vz-driver NAME or --vz-plugin PATH --vz-sha256 HEX")
    mode = _opt(config, "vz_provider_mode") or ("in-process" if driver else "external")
    if mode == "in-process" and not driver:
        raise pytest.UsageError("--vz-provider-mode in-process needs --vz-driver NAME")
    return str(mode)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "vz_case" not in metafunc.fixturenames:
        return
    from vz_conformance._catalogue import select

    mode = _mode(metafunc.config)
    params = [
        pytest.param(
            case,
            id=case.id,
            marks=[getattr(pytest.mark, f"{LABEL_MARKER_PREFIX}{case.label}"), pytest.mark.vz_conformance],
        )
        for case in select("in-process" if mode == "in-process" else "external")
    ]
    metafunc.parametrize("vz_case", params)


def _driver_name(config: pytest.Config) -> str:
    return str(_opt(config, "vz_driver") or Path(str(_opt(config, "vz_plugin"))).name)


@pytest.fixture(scope="session")
def vz_adapter(pytestconfig: pytest.Config) -> Adapter:
    """The Adapter for the driver under test: the ``pytest_vz_adapter`` hook, ``--vz-adapter``, the suite's
    own adapter for the driver name, or the POSIX defaults."""
    from vz_conformance.adapters import adapter_for, load_adapter

    name = _driver_name(pytestconfig)
    hooked = pytestconfig.hook.pytest_vz_adapter(config=pytestconfig, driver_name=name)
    if hooked is not None:
        return hooked  # type: ignore[no-any-return]
    spec = _opt(pytestconfig, "vz_adapter")
    return load_adapter(spec) if spec else adapter_for(name)


@pytest.fixture(scope="session")
def vz_provider(
    pytestconfig: pytest.Config, vz_adapter: Adapter, tmp_path_factory: pytest.TempPathFactory
) -> DriverProvider:
    """Where the driver under test comes from (a private state directory for the whole session)."""
    from vz_conformance._providers import DaemonProvider, ExternalProvider, InProcessProvider, sha256_of

    mode = _mode(pytestconfig)
    state = tmp_path_factory.mktemp("vz-state")
    options: dict[str, Any] = dict(vz_adapter.driver_options(state))
    for pair in pytestconfig.getoption("vz_driver_option"):
        key, sep, value = pair.partition("=")
        if not sep:
            raise pytest.UsageError(f"--vz-driver-option {pair!r} must look like KEY=VALUE")
        options[key] = value
    if mode == "in-process":
        return InProcessProvider(str(_opt(pytestconfig, "vz_driver")), options=options)
    plugin = _opt(pytestconfig, "vz_plugin")
    if pytestconfig.getoption("vz_through_daemon"):
        if plugin or not _opt(pytestconfig, "vz_driver"):
            raise pytest.UsageError("--vz-through-daemon tests a registered driver (--vz-driver NAME), not --vz-plugin")
        from vz_core.drivers import pin_builtin

        pinned = pin_builtin(str(_opt(pytestconfig, "vz_driver"))).pinned
        assert pinned is not None
        name = str(_opt(pytestconfig, "vz_driver"))
        return DaemonProvider(name, pinned.script, pinned.sha256, options=options, args=pinned.args)
    digest = _opt(pytestconfig, "vz_sha256")
    args = [*vz_adapter.plugin_args(state), *pytestconfig.getoption("vz_plugin_arg")]
    if plugin:
        if not digest:
            raise pytest.UsageError("--vz-plugin needs --vz-sha256 HEX")
        return ExternalProvider(Path(str(plugin)).absolute(), str(digest), args=args, env=vz_adapter.plugin_env())
    from vz_core.registry import DriverRegistry

    spec = DriverRegistry().get(str(_opt(pytestconfig, "vz_driver")))
    found = shutil.which(spec.plugin_command[0]) if spec.plugin_command else None
    if found is None:
        raise pytest.UsageError(f"driver {spec.name!r} has no plugin command on PATH; pass --vz-plugin PATH")
    return ExternalProvider(
        found,
        sha256_of(Path(found)),
        args=[*spec.plugin_command[1:], *args],
        env=vz_adapter.plugin_env(),
        name=spec.name,
    )


def test_vz_conformance(
    vz_case: Case, vz_provider: DriverProvider, vz_adapter: Adapter, tmp_path: Path, record_property: Any
) -> None:
    """One case of the catalogue, run exactly once against a fresh connection; its Machines are deleted."""
    from vz_conformance._runner import run_cases

    run = asyncio.run(run_cases(vz_provider, vz_adapter, [vz_case], scratch=tmp_path))
    entry = run.cases[0]
    shown: str = entry.outcome
    if entry.outcome == "not-applicable":
        shown = f"not-applicable ({entry.capability}: {entry.refusal})"
    record_property("vz_outcome", shown)
    problems = [entry.failure] if entry.outcome == "failed" and entry.failure else []
    problems += [f"left behind: {p}" for p in run.cleanup_problems]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
async def vz_driver(vz_provider: DriverProvider) -> AsyncIterator[Driver]:
    """A connected Driver (externally: a freshly launched plugin), closed after the test."""
    driver = await vz_provider.connect()
    try:
        yield driver
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(driver.close(), 10)


@pytest.fixture
async def vz_machine(
    vz_driver: Driver, vz_adapter: Adapter, request: pytest.FixtureRequest
) -> AsyncIterator[RunImageRequest]:
    """A running Machine made from the adapter's request (unique id); deleted after the test."""
    import secrets

    workspace_id = f"vzc-{secrets.token_hex(4)}-{request.node.name[:24]}"
    req = vz_adapter.unique_request(workspace_id, "pytest")
    await vz_driver.run_image(req)
    try:
        yield req
    finally:
        with contextlib.suppress(Exception):
            await vz_driver.delete(workspace_id)
