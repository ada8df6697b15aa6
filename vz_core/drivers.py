"""Driver resolution, driver options, and the library behind ``vz driver list | add | verify | configure``.

A driver name is a name, never a path: one grammar (``DRIVER_NAME_PATTERN``, ``check_driver_name``) for
built-in drivers, external manifests and a Machine's ``driver`` in vz.json, checked before anything is looked
up. A name resolves to exactly one driver:

* **built-in** (``vz.drivers`` entry points, ``vz_core.registry``): Python code of this vz installation. Its
  plugin runs as ``<this interpreter> -c PLUGIN_MAIN --module REGISTRATION NAME`` (options in
  ``VZ_DRIVER_OPTIONS``), i.e. ``vz_core.registry.main``: the shared
  plugin main its console script uses too, i.e. the same code the host would import in-process, launched
  through the same door (supervisor, handshake, AutoMTLS) as any external driver. This launch (what
  ``remote_driver`` does outside the daemon) is not checksummed: it runs this interpreter on this
  installation's modules, which the host already trusts by running them.
  ``builtin_manifest()`` writes a manifest for a built-in's console script (with its SHA-256 now) for use by
  other hosts or to run a built-in through the external path.
* **built-in, pinned** (what the vz daemon launches): ``pin_builtin()`` builds the manifest-equivalent record of
  a built-in's installed console script (``vz-driver-<name>``, i.e. ``<registration>:main``) in memory: its
  SHA-256 is taken once, checked against the hash the installer wrote in the distribution's ``RECORD`` when
  there is one, and its ``#!`` interpreter must be this interpreter. ``ResolvedDriver.launch_spec`` then
  verifies the script with ``vz_core.trust.verify_binary`` at **every** launch and executes the sealed copy of
  the verified bytes, exactly like an external binary; the registration module's source file is pinned and
  checked at every launch too. A declaration without a console script gets a launcher script generated into a
  private directory (``launcher_dir``), pinned the same way. What that covers: the console script (which names
  the interpreter and the registration module it imports) and the registration module. The interpreter and
  the rest of the installed packages (site-packages, the editable source tree, the driver's own code) are not
  hashed: they are the code the daemon itself runs (same ``sys.executable``; the daemon's fingerprint names
  it), so a hash of them taken by that code would prove nothing the daemon does not already trust by running.
* **external**: added from a manifest (``vz_core.trust``) with ``add_manifest``; the validated manifest is
  recorded under ``<state dir>/driver-manifests/<name>.json`` together with its directory (where relative
  binary paths live). A record is found only among the drivers the user added: by exact name among the
  recorded files (never by joining a name into a path), not through a symlink, and only if the manifest it
  holds carries that same name. Its binary is verified before **every** launch.

Driver options come from two places. A Machine's ``driver_options`` in vz.json may set only options whose
declared scope is ``"project"``; ``validate_project_options`` refuses any other key, naming it and where to set
it instead. Options of scope ``"host"`` (binaries, host paths, host networks) live in the user's **host
configuration**, ``<state dir>/config/drivers.json`` (``HostConfig``; ``vz driver configure NAME KEY=VALUE``)::

    {"linux_native": {"subnet": "10.77.0.0/16", "runc": "/opt/runc/bin/runc"}, "qemu": {"accelerator": "tcg"}}

``effective_options`` merges both (a project value wins for a project option) and ``open_driver`` builds the
driver with them. External drivers take no options from vz (their own configuration applies).

The functions return plain data (dicts of str/bool/list) for the CLI and ``--json``.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import sys
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from vz_core._driver import Driver
from vz_core.errors import NotFoundError, TrustError, UserError
from vz_core.paths import state_dir
from vz_core.registry import (
    DRIVER_NAME_PATTERN,
    OPTIONS_ENV,
    DriverDeclaration,
    DriverRegistry,
    check_driver_name,
    is_driver_name,
)

if TYPE_CHECKING:
    # Imported where used: building a built-in driver in-process (``open_driver``, what `vz exec` does) must load
    # neither pydantic (manifests) nor grpc (plugins).
    from vz_core.redact import Redactor
    from vz_core.rpc import Mode, RemoteDriver
    from vz_core.transport import LaunchSpec, PluginLauncher
    from vz_core.trust import Manifest

__all__ = [
    "DRIVER_NAME_PATTERN",
    "DriverSource",
    "HostConfig",
    "ManifestStore",
    "PinnedScript",
    "ResolvedDriver",
    "add_manifest",
    "builtin_manifest",
    "check_driver_name",
    "configure",
    "driver_source",
    "effective_options",
    "host_config_path",
    "launcher_for",
    "list_drivers",
    "open_driver",
    "pin_builtin",
    "remote_driver",
    "resolve",
    "use_driver_source",
    "validate_project_options",
    "verify",
]


PLUGIN_MAIN = "from vz_core.registry import main; main()"
"""What a built-in's plugin process runs (``python -c``, like multiprocessing's spawn): the shared plugin main,
imported once (``-m vz_core.registry`` would execute that module twice)."""

_MAX_RECORD = 1 << 20  # a record is a small JSON file; a larger one is not ours


@dataclass(frozen=True)
class ExternalRecord:
    """An added external driver: its validated manifest and the directory its relative paths start from."""

    manifest: Manifest
    driver_dir: Path
    manifest_path: str
    added_at: str


class ManifestStore:
    """Recorded external drivers, one JSON file each under ``<root>`` (default ``<state dir>/driver-manifests``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else state_dir() / "driver-manifests"

    def _recorded(self) -> dict[str, str]:
        """Recorded driver name -> the record's file name, from the directory listing (regular files only)."""
        try:
            entries = list(os.scandir(self.root))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as exc:
            raise TrustError(f"cannot list the recorded drivers in {self.root}: {exc.strerror}") from None
        found: dict[str, str] = {}
        for entry in entries:
            stem, dot, suffix = entry.name.rpartition(".")
            if dot and suffix == "json" and is_driver_name(stem) and entry.is_file(follow_symlinks=False):
                found[stem] = entry.name
        return found

    def names(self) -> list[str]:
        return sorted(self._recorded())

    def get(self, name: str) -> ExternalRecord | None:
        """The record of the added driver ``name``, or ``None``. ``name`` is never joined into a path: it is looked
        up among the recorded files, which are opened without following symlinks."""
        if not is_driver_name(name):
            return None
        file_name = self._recorded().get(name)
        if file_name is None:
            return None
        path = self.root / file_name
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                data = f.read(_MAX_RECORD + 1)
            if len(data) > _MAX_RECORD:
                raise ValueError("larger than a record can be")
            raw = json.loads(data)
            manifest, driver_dir = raw["manifest"], Path(raw["driver_dir"])
            manifest_path, added_at = str(raw["manifest_path"]), str(raw["added_at"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise TrustError(
                f"the record of driver {name!r} ({path}) is unreadable ({type(exc).__name__}); add it again"
            ) from None
        from vz_core.trust import parse_manifest

        parsed = parse_manifest(manifest, source=f"recorded manifest of {name!r}")
        if parsed.name != name or not driver_dir.is_absolute():
            raise TrustError(
                f"the record of driver {name!r} ({path}) does not describe driver {name!r}; add it again with "
                "`vz driver add <manifest>`"
            )
        return ExternalRecord(manifest=parsed, driver_dir=driver_dir, manifest_path=manifest_path, added_at=added_at)

    def put(self, record: ExternalRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {
            "manifest": record.manifest.model_dump(mode="json", exclude_none=True),
            "driver_dir": str(record.driver_dir),
            "manifest_path": record.manifest_path,
            "added_at": record.added_at,
        }
        path = self.root / f"{check_driver_name(record.manifest.name, where='manifest name')}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)


@dataclass(frozen=True)
class PinnedScript:
    """The manifest-equivalent record of a built-in's installed console script (``pin_builtin``)."""

    name: str
    script: Path
    """Absolute path of the console script (``<scripts dir>/vz-driver-<name>``)."""
    sha256: str
    """Its SHA-256 when it was pinned; every launch verifies the file against it."""
    args: tuple[str, ...]
    interpreter: str
    """The interpreter its ``#!`` line names (the pinning interpreter)."""
    anchor: str
    """Where the expected hash was confirmed: ``"installation RECORD"`` (the installer's hash matched),
    ``"pinned"`` (no installer hash for it: taken from the file as found when pinned) or ``"generated"`` (a
    declaration without a console script: the daemon wrote this launcher script itself)."""
    pinned_at: str
    module_file: str = ""
    """The registration module's source file (pinned too: it is what the script imports first)."""
    module_sha256: str = ""

    def describe(self) -> dict[str, Any]:
        return {
            "script": str(self.script),
            "sha256": self.sha256,
            "interpreter": self.interpreter,
            "anchor": self.anchor,
            "pinned_at": self.pinned_at,
            "module_file": self.module_file,
            "module_sha256": self.module_sha256,
        }


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
                            actual = _source_sha256(module)
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
                        f"{_trust_reason(exc, self.name)}. It was pinned at {pinned.pinned_at} with SHA-256 "
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


def _trust_reason(exc: TrustError, name: str) -> str:
    """What a verification error says is wrong with the file, without the advice meant for manifests."""
    text = str(exc).split("; the file changed after the manifest was written", 1)[0]
    return text.removeprefix(f"driver {name!r}: ").replace("the manifest says", "pinned")


def _console_script(name: str, spec: DriverDeclaration, scripts_dir: Path | None = None) -> Path:
    if not spec.plugin_command:
        raise UserError(f"built-in driver {name!r} declares no plugin command")
    script = (scripts_dir if scripts_dir is not None else Path(sysconfig.get_path("scripts"))) / spec.plugin_command[0]
    if not script.is_file():
        raise UserError(
            f"the console script {script} of built-in driver {name!r} is not installed; reinstall vz "
            "(`pip install -e .` in its source tree)"
        )
    return script.absolute()


def _installed_hash(script: Path, module: str | None) -> str | None:
    """The SHA-256 (hex) the installer recorded for ``script`` in the RECORD of the distribution declaring the
    driver (found through its ``vz.drivers`` entry point), or None when there is no such record."""
    return _recorded_hashes(module, script.name).get(os.path.realpath(script))


@functools.lru_cache(maxsize=64)
def _recorded_hashes(module: str | None, file_name: str) -> dict[str, str]:
    """Real path -> SHA-256 (hex) of the files named ``file_name`` in the RECORD of the distribution(s) whose
    ``vz.drivers`` entry point is registration module ``module`` (read once per process: after a reinstall the
    daemon is restarted anyway, its fingerprint changes)."""
    import base64

    found: dict[str, str] = {}
    for dist in _driver_distributions().get(module or "", []):
        for entry in dist.files or ():
            if entry.name != file_name or entry.hash is None or entry.hash.mode != "sha256":
                continue
            raw = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4))
            found[os.path.realpath(str(dist.locate_file(entry)))] = raw.hex()
    return found


@functools.lru_cache(maxsize=1)
def _driver_distributions() -> dict[str, list[Any]]:
    """Registration module -> the distributions declaring it as a ``vz.drivers`` entry point."""
    from importlib import metadata

    from vz_core.registry import ENTRY_POINT_GROUP

    found: dict[str, list[Any]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.dist is not None:
            found.setdefault(ep.value, []).append(ep.dist)
    return found


def _shebang(script: Path) -> str:
    with open(script, "rb") as f:
        first = f.readline(4096)
    if not first.startswith(b"#!"):
        return ""
    return first[2:].decode(errors="replace").strip().split(" ", 1)[0]


def _source_sha256(path: Path) -> str:
    """SHA-256 of a source file (a regular file, not through a final symlink); ``TrustError`` otherwise."""
    import hashlib
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise TrustError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise TrustError(f"{path} is not a regular file")
        digest = hashlib.sha256()
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _module_pin(module: str | None) -> tuple[str, str]:
    """(source file, SHA-256) of registration module ``module`` (empty when it has no Python source file)."""
    import importlib.util

    if not module:
        return "", ""
    found = importlib.util.find_spec(module)
    origin = found.origin if found is not None else None
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        return "", ""
    path = Path(origin).absolute()
    return str(path), _source_sha256(path)


def _generated_launcher(name: str, module: str | None, directory: Path) -> Path:
    """Write the console-script equivalent of a declaration that names none: this interpreter running the
    shared plugin main for ``name`` (a private file the caller pins and verifies like a console script)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    where = ["--module", module] if module else []
    text = (
        f"#!{sys.executable}\n"
        f"# vz: the plugin launcher of built-in driver {name!r}, whose declaration names no console script\n"
        "from vz_core.registry import main\n"
        f"main({[*where, name]!r})\n"
    )
    script = directory / f"vz-driver-{name}"
    tmp = directory / f".vz-driver-{name}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, script)
    return script


def pin_builtin(
    name: str,
    *,
    registry: DriverRegistry | None = None,
    scripts_dir: str | os.PathLike[str] | None = None,
    launcher_dir: str | os.PathLike[str] | None = None,
) -> ResolvedDriver:
    """Built-in ``name`` resolved to its installed console script, SHA-256 pinned now (see the module docstring).

    ``scripts_dir``: where console scripts are (default: this interpreter's scripts directory). A declaration
    that names no console script (a Python driver package declaring only its factory) gets a generated launcher
    script in ``launcher_dir`` (a private directory; without one: ``UserError``), pinned the same way. The
    registration module's source file is pinned too.

    ``TrustError`` when the script differs from the hash its installer recorded, or runs another interpreter
    than this one; ``UserError`` when it is not installed. Launching it verifies the script (and the
    registration module) again, every time.
    """
    from vz_core.trust import sha256_of

    registry = registry if registry is not None else DriverRegistry()
    spec = registry.get(check_driver_name(name))
    module = registry.module_of(name)
    installed: str | None = None
    if not spec.plugin_command and launcher_dir is not None:
        script = _generated_launcher(name, module, Path(launcher_dir))
        digest = sha256_of(script, driver_dir=script.parent)
        anchor = "generated"
    else:
        script = _console_script(name, spec, Path(scripts_dir) if scripts_dir is not None else None)
        digest = sha256_of(script, driver_dir=script.parent)
        installed = _installed_hash(script, module)
        if installed is not None and installed != digest:
            raise TrustError(
                f"built-in driver {name!r}: its console script {script} has SHA-256 {digest}, but the vz "
                f"installation recorded {installed} for it: the script was modified after installation; reinstall vz"
            )
        anchor = "installation RECORD" if installed is not None else "pinned"
    interpreter = _shebang(script)
    if interpreter and os.path.realpath(interpreter) != os.path.realpath(sys.executable):
        raise TrustError(
            f"built-in driver {name!r}: its console script {script} runs {interpreter}, not this interpreter "
            f"({sys.executable}); reinstall vz for this interpreter"
        )
    module_file, module_sha256 = _module_pin(module)
    pinned = PinnedScript(
        name=name,
        script=script,
        sha256=digest,
        args=tuple(spec.plugin_command[1:]),
        interpreter=interpreter,
        anchor=anchor,
        pinned_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        module_file=module_file,
        module_sha256=module_sha256,
    )
    return ResolvedDriver(name, builtin=spec, builtin_module=module, pinned=pinned)


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


def _external_row(name: str, record: ExternalRecord) -> dict[str, Any]:
    from vz_core.trust import host_platform

    m = record.manifest
    plat = host_platform()
    row: dict[str, Any] = {
        "name": name,
        "origin": "external",
        "version": m.version,
        "api_version": m.api_version,
        "platforms": sorted(m.binaries),
        "plaintext": m.plaintext,
        "manifest": record.manifest_path,
        "added_at": record.added_at,
    }
    if plat in m.binaries:
        row["binary"] = str(m.binary_path(record.driver_dir))
        row["sha256"] = m.binaries[plat].sha256
    from vz_core._install import provenance_of

    row.update(provenance_of(name))
    return row


def list_drivers(*, registry: DriverRegistry | None = None, store: ManifestStore | None = None) -> list[dict[str, Any]]:
    """Every driver by name: built-in ones first, then external ones."""
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else ManifestStore()
    rows: list[dict[str, Any]] = []
    for name in registry.names():
        spec = registry.get(name)
        rows.append(
            {
                "name": name,
                "origin": "builtin",
                "summary": spec.summary,
                "targets": list(spec.targets),
                "plugin_command": list(spec.plugin_command),
            }
        )
    for name in store.names():
        record = store.get(name)
        if record is not None:
            rows.append(_external_row(name, record))
    return rows


def add_manifest(
    path: str | os.PathLike[str],
    *,
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    origin: Literal["url", "file"] = "file",
    source: str | None = None,
) -> dict[str, Any]:
    """Validate a manifest, check its signature against the trust roots (``vz_core._trustroots``, policy for
    ``origin``), verify this host's binary now, and record it (replacing an older record, which is kept for
    ``vz driver rollback``) with its provenance (``source``: where it came from, default the manifest's path).

    ``TrustError`` (nothing recorded) for an invalid manifest, a signature the trust roots refuse, a missing or
    malformed checksum, no binary for this host, or a binary that fails verification; ``UserError`` when the
    name is a built-in driver's.
    """
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else ManifestStore()
    manifest_path = Path(path).absolute()
    from vz_core.trust import load_manifest, sha256_of

    manifest = load_manifest(manifest_path)
    if manifest.name in registry.names():
        raise UserError(f"driver name {manifest.name!r} belongs to a built-in driver; give the manifest another name")
    from vz_core._install import check_signature, record_installed

    signer = check_signature(manifest_path, manifest, origin=origin)
    driver_dir = manifest_path.parent
    binary = manifest.binary_path(driver_dir)
    entry = manifest.entry_for()
    actual = sha256_of(binary, driver_dir=manifest.binary_home(driver_dir))
    if actual != entry.sha256:
        raise TrustError(
            f"driver {manifest.name!r}: SHA-256 mismatch for {binary}: the manifest says {entry.sha256}, "
            f"the file has {actual}; nothing was recorded"
        )
    previous = store.get(manifest.name)
    record = ExternalRecord(
        manifest=manifest,
        driver_dir=driver_dir,
        manifest_path=str(manifest_path),
        added_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    store.put(record)
    record_installed(manifest.name, signer, previous, record, origin=origin, source=source or str(manifest_path))
    row = _external_row(manifest.name, record)
    row["status"] = "updated" if previous is not None else "added"
    return row


def _verify_one(name: str, registry: DriverRegistry, store: ManifestStore) -> dict[str, Any]:
    from vz_core.trust import sha256_of

    resolved = resolve(name, registry=registry, store=store)
    if resolved.builtin is not None:
        row: dict[str, Any] = {"name": name, "origin": "builtin"}
        if not resolved.builtin.plugin_command:
            row.update(
                ok=True,
                detail="declares no console script: the vz daemon runs it through a launcher script it writes "
                "and pins at start (with the registration module)",
            )
            return row
        try:
            pinned = pin_builtin(name, registry=registry).pinned
        except (TrustError, UserError) as exc:
            row.update(ok=False, detail=str(exc))
            return row
        assert pinned is not None
        row.update(binary=str(pinned.script), actual=pinned.sha256, ok=True)
        if pinned.anchor == "installation RECORD":
            row.update(expected=pinned.sha256, detail="console script matches the hash its installation recorded")
        else:
            row["detail"] = "console script found; its installation recorded no hash for it to compare with"
        return row
    record = resolved.external
    assert record is not None
    result: dict[str, Any] = {"name": name, "origin": "external"}
    try:
        entry = record.manifest.entry_for()
        binary = record.manifest.binary_path(record.driver_dir)
        result.update(binary=str(binary), expected=entry.sha256)
        actual = sha256_of(binary, driver_dir=record.manifest.binary_home(record.driver_dir))
        result["actual"] = actual
    except TrustError as exc:
        result.update(ok=False, detail=str(exc))
        return result
    if actual != entry.sha256:
        result.update(ok=False, detail=f"SHA-256 mismatch: the manifest says {entry.sha256}, the file has {actual}")
    else:
        result.update(ok=True, detail="checksum matches")
    return result


def verify(
    name: str | None = None, *, registry: DriverRegistry | None = None, store: ManifestStore | None = None
) -> list[dict[str, Any]]:
    """Re-check driver ``name`` (or every driver): one result row each with ``ok`` and ``detail``.

    Nothing is cached, downloaded, run or deleted. An unknown name raises ``NotFoundError``.
    """
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else ManifestStore()
    names = [name] if name is not None else [*registry.names(), *store.names()]
    return [_verify_one(n, registry, store) for n in names]


def builtin_manifest(
    name: str, destination: str | os.PathLike[str], *, registry: DriverRegistry | None = None
) -> dict[str, Any]:
    """Write a manifest for built-in ``name``'s installed console script, with the script's SHA-256 now.

    The manifest pins this installation's script (whose ``#!`` line names this interpreter); it is meant for
    other Runtime Protocol hosts, or to run a built-in through the external, checksummed path. ``path`` is
    absolute, so the manifest file may live anywhere. Its ``options`` is the declaration's options as a JSON
    Schema (types, defaults, bounds, choices). Returns the manifest as a dict.
    """
    from vz_core.trust import host_platform, parse_manifest, sha256_of

    registry = registry if registry is not None else DriverRegistry()
    spec = registry.get(name)
    script = _console_script(name, spec)
    manifest = {
        "manifest_version": 1,
        "name": name,
        "version": _vz_version(),
        "api_version": "1.3",
        "binaries": {host_platform(): {"path": str(script), "sha256": sha256_of(script)}},
        "args": list(spec.plugin_command[1:]),
    }
    if spec.options is not None:  # the declaration's options, typed: what another host may check values against
        manifest["options"] = spec.options_schema()
    parse_manifest(manifest, source=f"generated manifest of {name!r}")
    Path(destination).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _vz_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("vz")
    except metadata.PackageNotFoundError:
        return "0"


# --- options: the project's (vz.json) and the host's (host configuration) ------------------------------------

HOST_CONFIG_FILE = "drivers.json"
_MAX_HOST_CONFIG = 1 << 20


def host_config_path() -> Path:
    """The user's host configuration of drivers: ``<state dir>/config/drivers.json`` (``VZ_HOME`` moves it)."""
    return state_dir() / "config" / HOST_CONFIG_FILE


_Value = str | int | float | bool | list[str]


def _check_value(value: Any, where: str) -> _Value:
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return list(value)
    raise UserError(f"{where}: must be a string, number, boolean or list of strings, not {type(value).__name__}")


class HostConfig:
    """The host configuration of drivers: driver name -> {option: value}, in one JSON file owned by the user.

    It may set any declared option of a built-in driver (host- and project-scoped ones); it is the only place
    host-scoped options come from. Written atomically; never read from a project directory.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else host_config_path()

    def load(self) -> dict[str, dict[str, _Value]]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise UserError(f"cannot read the driver host configuration {self.path}: {exc.strerror}") from None
        try:
            if len(data) > _MAX_HOST_CONFIG:
                raise ValueError(f"it is larger than {_MAX_HOST_CONFIG} bytes")
            raw = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise UserError(
                f"the driver host configuration {self.path} is not valid JSON ({exc}); fix or remove it"
            ) from None
        if not isinstance(raw, dict):
            raise UserError(f"the driver host configuration {self.path} must be a JSON object of driver names")
        config: dict[str, dict[str, _Value]] = {}
        for name, options in raw.items():
            where = f"{self.path}: {name!r}"
            check_driver_name(name, where=f"{self.path}")
            if not isinstance(options, dict):
                raise UserError(f"{where} must map option names to values")
            config[name] = {str(k): _check_value(v, f"{where}.{k}") for k, v in options.items()}
        return config

    def options_for(self, name: str) -> dict[str, _Value]:
        return dict(self.load().get(name, {}))

    def save(self, config: dict[str, dict[str, _Value]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        kept = {name: options for name, options in sorted(config.items()) if options}
        tmp.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)


def _builtin_or_refuse(
    name: str, registry: DriverRegistry, store: ManifestStore | None, where: str
) -> DriverDeclaration:
    resolved = resolve(name, registry=registry, store=store)
    if resolved.builtin is None:
        raise UserError(
            f"{where}: driver {name!r} is external; vz passes it no options (use the driver's own configuration)"
        )
    return resolved.builtin


def validate_project_options(
    name: str,
    options: Mapping[str, Any] | None,
    *,
    where: str = "driver_options",
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    recorded: bool = False,
) -> dict[str, Any]:
    """Check a Machine's ``driver_options`` from a project file (vz.json) before anything is mutated.

    Returns the options (a copy). Raises ``UserError`` naming ``where`` and the key: for a name that is not a
    driver name, options for an external driver, an unknown key (listing the valid ones), a key whose scope
    is ``"host"`` (saying where to set it instead), or a value the option's declaration refuses (its type and
    bounds: ``$.machines[0].driver_options.stop_timeout: must be a number of seconds in (0, 3600], got -1``).
    ``NotFoundError`` for an unknown driver. The plugin checks the same values again with the same code.

    ``recorded=True`` is for the options vz stored with an existing Machine (stop, delete, status): host-scoped
    keys an earlier vz accepted from a vz.json are then allowed, and a value today's declaration refuses is
    left out (its default applies), so that Machine stays reachable where it is; unknown keys are refused the
    same way. ``vz up`` never passes it.
    """
    check_driver_name(name, where=where.rpartition(".")[0] + ".driver" if "." in where else "driver")
    options = dict(options or {})
    registry = registry if registry is not None else DriverRegistry()
    if not options:
        resolve(name, registry=registry, store=store)
        return options
    declaration = _builtin_or_refuse(name, registry, store, where)
    declaration.check_option_keys(options, where=where)
    for key in sorted(options):
        option = declaration.declared_options.get(key)
        if option is not None and option.scope == "host" and not recorded:
            raise UserError(
                f"{where}.{key}: {name}'s option {key!r} ({option.help}) belongs to the host configuration, not to "
                f"a project file: set it with `vz driver configure {name} {key}=VALUE` (stored in "
                f"{host_config_path()}) and remove it from vz.json"
            )
    if recorded:
        return {key: value for key, value in options.items() if _accepted(declaration, key, value)}
    declaration.check_options(
        options, where=where, fix="correct it in vz.json, or remove it to use the default ({default})"
    )
    return options


def _accepted(declaration: DriverDeclaration, key: str, value: Any) -> bool:
    try:
        declaration.declared_options[key].parse(value)
    except ValueError:
        return False
    return True


def effective_options(
    name: str,
    project_options: Mapping[str, Any] | None = None,
    *,
    where: str = "driver_options",
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    host_config: HostConfig | None = None,
    recorded: bool = False,
) -> dict[str, Any]:
    """The options driver ``name`` is built with: its host configuration, then the project's (validated by
    ``validate_project_options``; a project value wins for a project-scoped option, a recorded one for any)."""
    registry = registry if registry is not None else DriverRegistry()
    project = validate_project_options(
        name, project_options, where=where, registry=registry, store=store, recorded=recorded
    )
    resolved = resolve(name, registry=registry, store=store)
    if resolved.builtin is None:
        return {}
    host = (host_config if host_config is not None else HostConfig()).options_for(name)
    resolved.builtin.check_options(
        host,
        where=f"{host_config_path()}: {name}",
        fix=f"change it with `vz driver configure {name} {{key}}=VALUE`, or remove it with "
        f"`vz driver configure {name} --unset {{key}}` (default: {{default}})",
    )
    return {**host, **project}


def open_driver(
    name: str,
    project_options: Mapping[str, Any] | None = None,
    *,
    where: str = "driver_options",
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    host_config: HostConfig | None = None,
    redactor: Redactor | None = None,
    recorded: bool = False,
) -> Driver:
    """Driver ``name`` ready to use, for a Machine whose vz.json gave ``project_options``.

    Built-in drivers are built in-process with ``effective_options``; external ones are served out-of-process
    (their binary verified at each launch). ``UserError`` for a bad name or option (nothing is built),
    ``NotFoundError`` for an unknown driver. ``redactor`` masks secrets in what an out-of-process driver says.
    ``recorded=True``: ``project_options`` are those stored with an existing Machine (see
    ``validate_project_options``).
    The caller closes the driver.
    """
    registry = registry if registry is not None else DriverRegistry()
    options = effective_options(
        name, project_options, where=where, registry=registry, store=store, host_config=host_config, recorded=recorded
    )
    resolved = resolve(name, registry=registry, store=store)
    if resolved.builtin is None:
        return remote_driver(name, redactor=redactor, registry=registry, store=store)
    try:
        return resolved.builtin.create(**options)
    except TypeError as exc:
        raise UserError(f"driver {name!r} rejected its options {sorted(options)}: {exc}") from None


class DriverSource(Protocol):
    """Where ``vz_core.env.acquire_driver`` gets drivers from when one is installed (``use_driver_source``): the
    vz daemon's ``SessionPool`` (shared, supervised plugin sessions; the handles' ``close`` keeps them)."""

    def driver(
        self,
        name: str,
        project_options: Mapping[str, Any] | None,
        *,
        where: str,
        recorded: bool,
        redactor: Redactor | None,
    ) -> Driver: ...


_source: DriverSource | None = None


def use_driver_source(source: DriverSource | None) -> DriverSource | None:
    """Make ``vz_core.env.acquire_driver`` get every driver from ``source`` (None: back to ``open_driver``, which
    builds built-ins in-process: tests and benchmarks). Returns the source that was in use. Process-wide."""
    global _source
    previous, _source = _source, source
    return previous


def driver_source() -> DriverSource | None:
    """The source installed with ``use_driver_source`` (None: drivers are opened with ``open_driver``)."""
    return _source


def configure(
    name: str,
    assignments: list[str] | None = None,
    unset: list[str] | None = None,
    *,
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    host_config: HostConfig | None = None,
) -> dict[str, Any]:
    """``vz driver configure NAME [KEY=VALUE ...] [--unset KEY ...]``: change and show a built-in driver's host
    configuration. Values are parsed by the option's declared kind. Returns ``{"name", "path", "options"}``."""
    registry = registry if registry is not None else DriverRegistry()
    declaration = _builtin_or_refuse(check_driver_name(name), registry, store, "vz driver configure")
    config_store = host_config if host_config is not None else HostConfig()
    config = config_store.load()
    current = dict(config.get(name, {}))
    changed = False
    for item in assignments or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"vz driver configure: {item!r} must look like KEY=VALUE")
        declaration.check_option_keys({key: text}, where="vz driver configure")
        option = declaration.declared_options.get(key)
        try:
            value = option.parse(text) if option is not None else text
        except ValueError as exc:
            raise UserError(f"vz driver configure: {exc}") from None
        current[key] = _check_value(list(value) if isinstance(value, tuple) else value, key)
        changed = True
    for key in unset or []:
        if key not in current:
            raise UserError(f"vz driver configure: {name} has no {key!r} in {config_store.path}")
        del current[key]
        changed = True
    if changed:
        config[name] = current
        config_store.save(config)
    return {"name": name, "path": str(config_store.path), "options": current}
