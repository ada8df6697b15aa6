"""Installing external drivers from a URL, upgrades, rollback, removal, and the provenance of every added driver.

Layout, under ``<state dir>/driver-installs/<name>/`` (private to the user, mode 0700)::

    state.json                     # {"current": PROVENANCE, "previous": {"record": RECORD, "provenance": ...}}
    v1.4.0-9f86d081884c/           # one directory per installed version (version, first 12 digits of SHA-256)
        manifest.json              # the manifest exactly as served (its signature covers it)
        acme                       # the binary, stored as the manifest's ``file``
    .staging/<sha256>.part         # a download in progress (resumed by the next attempt)

``add_url`` fetches the manifest (at most ``MAX_MANIFEST_BYTES``), checks its signature against the trust roots
under the ``url`` policy, picks this host's binary (refusing a manifest without one), refuses a downgrade unless
asked, downloads the binary (``vz_core._download``: limits, resume, SHA-256), writes the version directory
under a temporary name and renames it into place, makes the binary executable only after all of that, launches
it once to check its Info (``vz_core.negotiate``), and only then records it (``vz_core.drivers.add_manifest``,
which verifies signature and checksum again, over the files on disk). Until that last step the previous
version stays recorded and runs; a failure leaves it as it was.

A running plugin is never changed underneath: each version has its own directory, and a launch executes a
sealed copy of the verified bytes (``vz_core.trust``), so a plugin the daemon runs keeps running the version it
started with until the daemon restarts it. ``rollback`` makes the previous version current again (after
verifying its binary); the version directories kept are exactly the current and the previous one.

Every ``add_manifest`` (from a file or a URL) records provenance: where the manifest came from, its version,
who signed it (key id and name, or unsigned) and when it was added; ``vz driver list`` shows it.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import shutil
import threading
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core._download import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT, check_url, fetch_bytes, fetch_file, redact_url
from vz_core._provenance import (
    check_signature,
    installs_root,
    load_state,
    provenance_of,
    record_installed,
    record_json,
    save_state,
)
from vz_core._trustroots import SignerCheck, TrustRoots
from vz_core.errors import NotFoundError, TrustError, UserError
from vz_core.registry import check_driver_name

if TYPE_CHECKING:
    from vz_core import DriverInfo
    from vz_core.drivers import ExternalRecord, ManifestStore
    from vz_core.registry import DriverRegistry
    from vz_core.trust import Manifest

__all__ = [
    "add_url",
    "check_signature",
    "compare_versions",
    "installs_root",
    "provenance_of",
    "record_installed",
    "remove",
    "rollback",
    "upgrade",
]

_CAPABILITIES = "capabilities.json"
"""In a version directory: what its plugin's Info offered when it was installed (``_capability_summary``)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


# -- versions ------------------------------------------------------------------------------------------------
_VERSION = re.compile(r"v?(\d+(?:\.\d+)*)([-+].*)?")


def compare_versions(old: str, new: str) -> int | None:
    """-1, 0 or 1 as ``new`` is older than, equal to or newer than ``old`` (numeric dotted versions, an optional
    ``v`` prefix; a ``-pre`` release orders before its release); ``None`` when either cannot be ordered."""
    a, b = _VERSION.fullmatch(old), _VERSION.fullmatch(new)
    if a is None or b is None:
        return None
    ka = [int(x) for x in a.group(1).split(".")]
    kb = [int(x) for x in b.group(1).split(".")]
    width = max(len(ka), len(kb))
    ka += [0] * (width - len(ka))
    kb += [0] * (width - len(kb))
    if ka != kb:
        return 1 if kb > ka else -1
    pa = bool(a.group(2) and a.group(2).startswith("-"))
    pb = bool(b.group(2) and b.group(2).startswith("-"))
    if pa == pb:
        return 0 if (a.group(2) or "") == (b.group(2) or "") or not (pa or pb) else None
    return 1 if pa else -1


def _check_downgrade(name: str, old: str, new: str, allow: bool) -> None:
    order = compare_versions(old, new)
    if allow or (order is not None and order >= 0):
        return
    if order is None:
        raise TrustError(
            f"driver {name!r}: cannot tell whether version {new!r} is newer than the installed {old!r}; pass "
            "--allow-downgrade to install it anyway; nothing was changed"
        )
    raise TrustError(
        f"driver {name!r}: version {new} is older than the installed {old}; a downgrade needs --allow-downgrade "
        "(or `vz driver rollback` to the previous version); nothing was changed"
    )


def _record_from(raw: dict[str, Any], name: str) -> ExternalRecord:
    from vz_core.drivers import ExternalRecord
    from vz_core.trust import parse_manifest

    manifest = parse_manifest(raw["manifest"], source=f"previous manifest of {name!r}")
    return ExternalRecord(
        manifest=manifest,
        driver_dir=Path(raw["driver_dir"]),
        manifest_path=str(raw["manifest_path"]),
        added_at=str(raw["added_at"]),
    )


# -- URL installs --------------------------------------------------------------------------------------------
def _safe_version(version: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", version)[:64]


def _capability_summary(info: DriverInfo) -> list[str]:
    """What a negotiated Info offers, as short sorted words (for what an upgrade changes)."""
    words = [f"api {info.api_major}.{info.api_minor}"]
    caps = info.capabilities
    if caps is not None:
        words += [f"mount {m.name.lower()}" for m in caps.mount_types]
        words.append(f"recreate {caps.recreate_mode.name.lower()}")
        flags = ("requires_mount_streaming", "requires_workspace_chown", "provisioning_preflight", "reprovision")
        words += [flag for flag in (*flags, "logs", "reuse_preflight") if getattr(caps, flag)]
    return sorted(words)


def _recorded_capabilities(record: ExternalRecord | None) -> list[str] | None:
    """The capabilities negotiated when ``record``'s version was installed from a URL (None: not known)."""
    if record is None:
        return None
    try:
        with open(record.driver_dir / _CAPABILITIES, "rb") as f:
            raw = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    return [str(word) for word in raw] if isinstance(raw, list) else None


async def _probe(name: str, record: ExternalRecord) -> DriverInfo:
    from vz_core.drivers import ResolvedDriver
    from vz_core.negotiate import negotiate
    from vz_core.rpc import RemoteDriver
    from vz_core.transport import PluginLauncher

    launcher = PluginLauncher(ResolvedDriver(name, external=record).launch_spec(), name=name)
    driver = RemoteDriver(launcher, mode="warm", idle_timeout=None, name=name)
    try:
        return await negotiate(driver)
    finally:
        await driver.close()


def _run_probe(name: str, record: ExternalRecord) -> DriverInfo:
    """``_probe`` on its own event loop in a thread (a caller may be running a loop of its own)."""
    failure: list[BaseException] = []
    answer: list[DriverInfo] = []

    def run() -> None:
        try:
            answer.append(asyncio.run(_probe(name, record)))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"vz-probe-{name}")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return answer[0]


def _fetch_manifest(url: str) -> tuple[bytes, dict[str, Any], Manifest, str]:
    from vz_core.trust import MAX_MANIFEST_BYTES, parse_manifest

    data, final = fetch_bytes(url, what="manifest", max_bytes=MAX_MANIFEST_BYTES)
    manifest = parse_manifest(data, source=f"manifest {redact_url(url)}")
    raw = json.loads(data)
    return data, raw, manifest, final


def _changes(
    old: ExternalRecord | None, old_provenance: dict[str, Any], new: Manifest, signer: SignerCheck
) -> dict[str, Any]:
    from vz_core.trust import host_platform

    plat = host_platform()

    def facts(m: Manifest | None, key: str) -> dict[str, Any]:
        if m is None:
            return {}
        return {
            "version": m.version,
            "api_version": m.api_version,
            "platforms": sorted(m.binaries),
            "sha256": m.binaries[plat].sha256 if plat in m.binaries else "",
            "signing_key": key,
        }

    before = facts(old.manifest if old else None, str(old_provenance.get("key_id", "unsigned")))
    after = facts(new, signer.key_id or "unsigned")
    return {k: {"from": before.get(k), "to": v} for k, v in after.items() if before.get(k) != v}


def add_url(
    url: str,
    *,
    allow_downgrade: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    timeout: float = DEFAULT_TIMEOUT,
    probe: bool = True,
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    roots: TrustRoots | None = None,
) -> dict[str, Any]:
    """Install (or replace) an external driver from the manifest at ``url`` (see the module docstring)."""
    from vz_core import drivers
    from vz_core.registry import DriverRegistry

    check_url(url, what="manifest URL")
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else drivers.ManifestStore()
    roots = roots if roots is not None else TrustRoots()
    data, raw, manifest, final = _fetch_manifest(url)
    name = manifest.name
    if name in registry.names():
        raise UserError(f"driver name {name!r} belongs to a built-in driver; the manifest at {redact_url(url)} may not")
    signer = roots.check(raw, origin="url", source=f"manifest {redact_url(url)}")
    entry = manifest.entry_for()
    if entry.url is None or entry.file is None:
        raise TrustError(
            f"manifest {redact_url(url)} gives this platform's binary as a 'path' (a file on the provider's "
            "machine); a manifest installed from a URL names it with 'url' and 'file'; nothing was installed"
        )
    previous = store.get(name)
    if previous is not None:
        _check_downgrade(name, previous.manifest.version, manifest.version, allow_downgrade)
    changes = _changes(previous, provenance_of(name).get("provenance", {}), manifest, signer)
    binary_url = urllib.parse.urljoin(final, entry.url)
    check_url(binary_url, what="binary URL")

    installs_root().mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(installs_root(), 0o700)
    base = installs_root() / name
    staging = base / ".staging"
    staging.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(base, 0o700)
    downloaded = staging / entry.sha256
    fetch_file(
        binary_url, downloaded, sha256=entry.sha256, what=f"binary of {name!r}", max_bytes=max_bytes, timeout=timeout
    )
    version_dir = base / f"v{_safe_version(manifest.version)}-{entry.sha256[:12]}"
    tmp = base / f".new-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    try:
        (tmp / "manifest.json").write_bytes(data)
        binary = tmp / entry.file
        os.replace(downloaded, binary)
        os.chmod(binary, 0o755)
        old_dir = None
        if version_dir.exists():
            old_dir = base / f".old-{os.getpid()}"
            os.replace(version_dir, old_dir)
        os.replace(tmp, version_dir)
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    manifest_path = version_dir / "manifest.json"
    if probe:
        from vz_core.drivers import ExternalRecord

        trial = ExternalRecord(manifest=manifest, driver_dir=version_dir, manifest_path=str(manifest_path), added_at="")
        try:
            info = _run_probe(name, trial)
        except Exception as exc:
            if previous is None or previous.driver_dir != version_dir:
                shutil.rmtree(version_dir, ignore_errors=True)
            kept = f"; version {previous.manifest.version} stays installed" if previous is not None else ""
            raise TrustError(
                f"driver {name!r} version {manifest.version} was downloaded and verified but did not start and "
                f"negotiate{kept}: {exc}"
            ) from None
        summary = _capability_summary(info)
        (version_dir / _CAPABILITIES).write_text(json.dumps(summary) + "\n")
        before = _recorded_capabilities(previous)
        if previous is not None and before != summary:
            changes["capabilities"] = {"from": before, "to": summary}
    row = drivers.add_manifest(manifest_path, registry=registry, store=store, origin="url", source=url)
    row["changes"] = changes
    return row


def upgrade(
    name: str,
    *,
    url: str | None = None,
    allow_downgrade: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    timeout: float = DEFAULT_TIMEOUT,
    store: ManifestStore | None = None,
    roots: TrustRoots | None = None,
) -> dict[str, Any]:
    """Fetch driver ``name``'s manifest again (from where it was installed, or ``url``) and install it when it
    is newer; the row says what changed (``status``: ``upgraded`` or ``up to date``)."""
    from vz_core import drivers

    store = store if store is not None else drivers.ManifestStore()
    record = store.get(check_driver_name(name))
    if record is None:
        raise NotFoundError(f"no external driver {name!r} is installed (`vz driver list`)")
    provenance = provenance_of(name).get("provenance", {})
    source = url or (provenance.get("source") if provenance.get("origin") == "url" else None)
    if not source:
        raise UserError(
            f"driver {name!r} was added from a file ({record.manifest_path}); add its new manifest with `vz driver "
            "add`, or give the URL to upgrade from: `vz driver upgrade NAME --url URL`"
        )
    _, _, manifest, _ = _fetch_manifest(source)
    if manifest.name != name:
        raise TrustError(f"the manifest at {redact_url(source)} describes driver {manifest.name!r}, not {name!r}")
    from vz_core.trust import host_platform

    plat = host_platform()
    same_binary = record.manifest.binaries.get(plat) == manifest.binaries.get(plat)
    if compare_versions(record.manifest.version, manifest.version) == 0 and same_binary:
        return {"name": name, "status": "up to date", "version": record.manifest.version, "changes": {}}
    row = add_url(
        source, allow_downgrade=allow_downgrade, max_bytes=max_bytes, timeout=timeout, store=store, roots=roots
    )
    row["status"] = "upgraded"
    return row


def rollback(name: str, *, store: ManifestStore | None = None) -> dict[str, Any]:
    """Make the previous version of ``name`` current again (its binary verified first); the current one becomes
    the previous, so a second rollback undoes the first."""
    from vz_core import drivers
    from vz_core.trust import sha256_of

    store = store if store is not None else drivers.ManifestStore()
    current = store.get(check_driver_name(name))
    if current is None:
        raise NotFoundError(f"no external driver {name!r} is installed (`vz driver list`)")
    state = load_state(name)
    previous = state.get("previous")
    if not isinstance(previous, dict):
        raise UserError(f"driver {name!r} has no previous version to roll back to")
    record = _record_from(previous["record"], name)
    entry = record.manifest.entry_for()
    binary = record.manifest.binary_path(record.driver_dir)
    actual = sha256_of(binary, driver_dir=record.manifest.binary_home(record.driver_dir))
    if actual != entry.sha256:
        raise TrustError(
            f"driver {name!r}: the previous version's binary {binary} changed (SHA-256 {actual}, recorded "
            f"{entry.sha256}); nothing was rolled back"
        )
    store.put(record)
    state["previous"] = {"record": record_json(current), "provenance": state.get("current") or {}}
    state["current"] = previous.get("provenance") or {}
    save_state(name, state)
    return {
        "name": name,
        "status": "rolled back",
        "version": record.manifest.version,
        "from_version": current.manifest.version,
    }


def remove(name: str, *, store: ManifestStore | None = None) -> dict[str, Any]:
    """Forget external driver ``name``: its record and everything installed for it (a running plugin keeps its
    sealed copy until the daemon stops it; the next launch finds no such driver)."""
    from vz_core import drivers

    store = store if store is not None else drivers.ManifestStore()
    record = store.get(check_driver_name(name))
    if record is None:
        raise NotFoundError(f"no external driver {name!r} is installed (`vz driver list`)")
    (store.root / f"{name}.json").unlink()
    base = installs_root() / name
    if base.is_dir() and not base.is_symlink():
        shutil.rmtree(base)
    return {"name": name, "status": "removed", "version": record.manifest.version}
