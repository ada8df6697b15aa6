"""What a driver name resolves to, and the launch specs of its plugin: built-in (this interpreter running the
shared plugin main), built-in pinned (its verified console script) or external (its verified binary)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core.drivers._manifests import ExternalRecord, ManifestStore
from vz_core.drivers._pinned import PinnedScript, source_sha256, trust_reason
from vz_core.errors import NotFoundError, TrustError, UserError
from vz_core.registry import OPTIONS_ENV, DriverDeclaration, DriverRegistry, check_driver_name

if TYPE_CHECKING:
    from vz_core.redact import Redactor
    from vz_core.rpc import Mode, RemoteDriver
    from vz_core.transport import LaunchSpec, PluginLauncher

__all__ = ["PLUGIN_MAIN", "ResolvedDriver", "launcher_for", "remote_driver", "resolve"]

PLUGIN_MAIN = "from vz_plugins import plugin_main; plugin_main()"


@dataclass(frozen=True)
class ResolvedDriver:
    """What a name stands for: exactly one of ``builtin`` or ``external``; a built-in may carry ``pinned`` (its
    console script, verified at every launch: the daemon's path)."""

    name: str
    builtin: DriverDeclaration | None = None
    external: ExternalRecord | None = None
    builtin_module: str | None = None
    """The registration module that declared a built-in (``DriverRegistry.module_of``)."""
    pinned: PinnedScript | None = None

    def launch_spec(self, options: dict[str, Any] | None = None) -> Callable[[], LaunchSpec]:
        """A ``prepare`` callable for ``PluginLauncher``: external binaries are verified on every call."""
        from vz_core.transport import LaunchSpec
        from vz_core.trust import verify_binary

        if self.builtin is not None and self.pinned is not None:
            pinned = self.pinned
            pinned_env = {OPTIONS_ENV: json.dumps(options)} if options else {}

            def prepare_pinned() -> LaunchSpec:
                try:
                    binary = verify_binary(
                        pinned.script, pinned.sha256, driver_dir=pinned.script.parent, name=self.name
                    )
                    if pinned.module_file:
                        module = Path(pinned.module_file)
                        try:
                            actual = source_sha256(module)
                        except TrustError:
                            binary.close()
                            raise
                        if actual != pinned.module_sha256:
                            binary.close()
                            raise TrustError(
                                f"SHA-256 mismatch for its registration module {module}: pinned "
                                f"{pinned.module_sha256}, the file has {actual}"
                            )
                except TrustError as exc:
                    raise TrustError(
                        f"built-in driver {self.name!r}: refusing to launch its console script {pinned.script}: "
                        f"{trust_reason(exc, self.name)}. It was pinned at {pinned.pinned_at} with SHA-256 "
                        f"{pinned.sha256} ({pinned.anchor}); if vz was reinstalled or upgraded, restart the "
                        "daemon (`vz daemon stop`, the next command starts a new one), otherwise reinstall vz"
                    ) from None
                return LaunchSpec(self.name, [str(pinned.script), *pinned.args], binary=binary, env=pinned_env)

            return prepare_pinned
        if self.builtin is not None:
            builtin = self.builtin
            env = {OPTIONS_ENV: json.dumps(options)} if options else {}

            # The shared plugin main of every built-in (what its console script runs too); naming the registration
            # module spares the plugin an entry-point scan before its handshake.
            where = ["--module", self.builtin_module] if self.builtin_module else []
            argv = [sys.executable, "-c", PLUGIN_MAIN, *where, builtin.name]

            def prepare_builtin() -> LaunchSpec:
                return LaunchSpec(self.name, list(argv), env=env)

            return prepare_builtin
        record = self.external
        assert record is not None
        if options:
            raise UserError(f"driver {self.name!r} is external: pass its options through its own configuration")

        def prepare_external() -> LaunchSpec:
            manifest = record.manifest
            path = manifest.binary_path(record.driver_dir)
            entry = manifest.entry_for()
            home = manifest.binary_home(record.driver_dir)
            binary = verify_binary(path, entry.sha256, driver_dir=home, name=self.name)
            return LaunchSpec(
                self.name,
                [str(path), *manifest.args],
                binary=binary,
                plaintext=manifest.plaintext,
                cwd=str(record.driver_dir),
            )

        return prepare_external


def resolve(name: str, *, registry: DriverRegistry | None = None, store: ManifestStore | None = None) -> ResolvedDriver:
    """The one driver ``name`` stands for; ``UserError`` for a name that is not a driver name (e.g. a path),
    ``NotFoundError`` listing what is installed for an unknown one."""
    check_driver_name(name)
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else ManifestStore()
    if name in registry.names():
        return ResolvedDriver(name, builtin=registry.get(name), builtin_module=registry.module_of(name))
    record = store.get(name)
    if record is not None:
        return ResolvedDriver(name, external=record)
    builtins = ", ".join(registry.names()) or "none"
    externals = ", ".join(store.names()) or "none"
    raise NotFoundError(
        f"unknown driver {name!r}; built-in: {builtins}; external: {externals} "
        "(add an external driver with `vz driver add <manifest>`)"
    )


def launcher_for(
    name: str,
    *,
    options: dict[str, Any] | None = None,
    handshake_timeout: float = 15.0,
    supervised: bool = True,
    redactor: Redactor | None = None,
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
) -> PluginLauncher:
    """A launcher for driver ``name`` (resolved now; external binaries verified at each launch)."""
    from vz_core.transport import PluginLauncher

    resolved = resolve(name, registry=registry, store=store)
    return PluginLauncher(
        resolved.launch_spec(options),
        name=name,
        handshake_timeout=handshake_timeout,
        supervised=supervised,
        redactor=redactor,
    )


def remote_driver(
    name: str,
    *,
    options: dict[str, Any] | None = None,
    mode: Mode = "warm",
    idle_timeout: float | None = 300.0,
    redactor: Redactor | None = None,
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
) -> RemoteDriver:
    """Driver ``name`` as an out-of-process ``RemoteDriver`` (nothing is launched until the first call).

    ``redactor`` masks secrets in what the plugin says (its stderr and its errors); give the command's, which
    knows every secret of the Environment.
    """
    from vz_core.rpc import RemoteDriver

    launcher = launcher_for(name, options=options, redactor=redactor, registry=registry, store=store)
    return RemoteDriver(launcher, mode=mode, idle_timeout=idle_timeout, name=name, redactor=redactor)
