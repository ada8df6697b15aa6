"""Pinning a built-in driver's installed console script (``pin_builtin``, what the vz daemon launches): its
SHA-256 taken once and checked against the installer's RECORD, its interpreter this one, its registration
module pinned too; a declaration without a console script gets a generated launcher script."""

from __future__ import annotations

import datetime
import functools
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

from vz_core.drivers._launch import ResolvedDriver
from vz_core.drivers._pinned import PinnedScript, source_sha256
from vz_core.errors import TrustError, UserError
from vz_core.registry import DriverDeclaration, DriverRegistry, check_driver_name

__all__ = ["console_script", "pin_builtin"]


def console_script(name: str, spec: DriverDeclaration, scripts_dir: Path | None = None) -> Path:
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
    return str(path), source_sha256(path)


def _generated_launcher(name: str, module: str | None, directory: Path) -> Path:
    """Write the console-script equivalent of a declaration that names none: this interpreter running the
    shared plugin main for ``name`` (a private file the caller pins and verifies like a console script)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    where = ["--module", module] if module else []
    text = (
        f"#!{sys.executable}\n"
        f"# vz: the plugin launcher of built-in driver {name!r}, whose declaration names no console script\n"
        "from vz_plugins import plugin_main\n"
        f"plugin_main({[*where, name]!r})\n"
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
        script = console_script(name, spec, Path(scripts_dir) if scripts_dir is not None else None)
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
