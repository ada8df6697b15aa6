"""The user's trust roots for driver manifests: trusted Ed25519 keys, revocations, rotations and the policy.

One JSON file owned by the user, ``<state dir>/config/driver-trust.json`` (``VZ_HOME`` moves it); host scope
only, never read from a project directory or a vz.json::

    {"policy": {"url": "require-signature", "file": "optional"},
     "keys": {"3f2a...": {"name": "acme", "public_key": "<base64 raw>", "added_at": "...",
                          "revoked_at": "", "endorsed_by": ""}}}

**Policy**, per source: ``url`` (``vz driver add URL`` / ``upgrade``; default ``require-signature``) and
``file`` (``vz driver add MANIFEST`` from disk; default ``optional``). ``require-signature`` refuses an
unsigned manifest. Under either policy a manifest that *is* signed must verify: a bad signature, an unknown or
revoked key, or an unsupported format is refused, never recorded as half-trusted.

**Rotation**: a manifest signed by a key not in the roots is accepted when its signature carries the new public
key and an endorsement of it by a trusted, unrevoked key; the new key is then added (``endorsed_by`` names the
old one) once the driver is recorded. **Revocation** marks a key: manifests it signs, and endorsements it makes,
are refused from then on. Keys it endorsed before it was revoked stay trusted (revoke them too if the old key
was compromised before the rotation).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vz_core._signing import (
    FORMAT,
    key_id,
    load_public_key,
    public_from_raw,
    raw_public,
    verify_endorsement,
    verify_manifest_signature,
)
from vz_core.errors import TrustError, UserError
from vz_core.paths import state_dir

__all__ = ["DEFAULT_POLICY", "POLICIES", "Origin", "SignerCheck", "TrustRoots", "trust_roots_path"]

Origin = Literal["url", "file"]
POLICIES = ("require-signature", "optional")
DEFAULT_POLICY: dict[str, str] = {"url": "require-signature", "file": "optional"}
_MAX_FILE = 1 << 20
_ORIGIN_TEXT = {"url": "drivers downloaded from a URL", "file": "manifests added from a local file"}


def trust_roots_path() -> Path:
    return state_dir() / "config" / "driver-trust.json"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class SignerCheck:
    """What a manifest's signature check found (``signed`` False: accepted unsigned under an optional policy)."""

    signed: bool
    key_id: str = ""
    key_name: str = ""
    endorsed_by: str = ""
    new_public_key: str = ""
    """A rotated-to key to add to the roots once the driver is recorded (``TrustRoots.accept``)."""

    def describe(self) -> dict[str, Any]:
        row: dict[str, Any] = {"signed": self.signed}
        if self.signed:
            row.update(key_id=self.key_id, key_name=self.key_name)
            if self.endorsed_by:
                row["endorsed_by"] = self.endorsed_by
        return row


class TrustRoots:
    """The trust-roots file (see the module docstring). Written atomically."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else trust_roots_path()

    # -- the file ------------------------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {"policy": dict(DEFAULT_POLICY), "keys": {}}
        except OSError as exc:
            raise UserError(f"cannot read the driver trust roots {self.path}: {exc.strerror}") from None
        try:
            if len(data) > _MAX_FILE:
                raise ValueError(f"larger than {_MAX_FILE} bytes")
            raw = json.loads(data)
            policy = {**DEFAULT_POLICY, **raw.get("policy", {})}
            keys = raw.get("keys", {})
            if not isinstance(keys, dict) or any(v not in POLICIES for v in policy.values()):
                raise ValueError("unexpected structure")
            for kid, entry in keys.items():
                public_from_raw(str(entry["public_key"]), f"key {kid}")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, TrustError) as exc:
            raise UserError(
                f"the driver trust roots {self.path} are unreadable ({exc}); fix the file or remove it and add "
                "your keys again"
            ) from None
        return {"policy": policy, "keys": keys}

    def save(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)

    def _find(self, data: dict[str, Any], ref: str) -> str:
        keys: dict[str, Any] = data["keys"]
        if ref in keys:
            return ref
        named = [kid for kid, entry in keys.items() if entry.get("name") == ref]
        if len(named) == 1:
            return named[0]
        have = ", ".join(f"{kid} ({e.get('name', '')})" for kid, e in sorted(keys.items())) or "none"
        if named:
            raise UserError(f"{len(named)} trusted keys are named {ref!r}; give the key id ({have})")
        raise UserError(f"no trusted key has id or name {ref!r}; trusted keys: {have}")

    # -- the verbs -----------------------------------------------------------------------------------------
    def add(self, keyfile: str | os.PathLike[str], name: str) -> dict[str, Any]:
        if not name or len(name) > 100 or any(not c.isprintable() for c in name):
            raise UserError("--name must be 1 to 100 printable characters (who the key belongs to)")
        key = load_public_key(keyfile)
        data = self.load()
        kid = key_id(key)
        existing = data["keys"].get(kid)
        if existing is not None and existing.get("revoked_at"):
            raise UserError(
                f"key {kid} ({existing.get('name')}) was revoked at {existing['revoked_at']}; a revoked key is not "
                "trusted again (`vz driver trust remove` forgets it, revocation included)"
            )
        data["keys"][kid] = {
            "name": name,
            "public_key": base64.b64encode(raw_public(key)).decode(),
            "added_at": _now(),
            "revoked_at": "",
            "endorsed_by": "",
        }
        self.save(data)
        return {"key_id": kid, "name": name, "status": "updated" if existing else "added"}

    def remove(self, ref: str) -> dict[str, Any]:
        data = self.load()
        kid = self._find(data, ref)
        entry = data["keys"].pop(kid)
        self.save(data)
        return {"key_id": kid, "name": entry.get("name", ""), "status": "removed"}

    def revoke(self, ref: str) -> dict[str, Any]:
        data = self.load()
        kid = self._find(data, ref)
        entry = data["keys"][kid]
        if not entry.get("revoked_at"):
            entry["revoked_at"] = _now()
            self.save(data)
        return {"key_id": kid, "name": entry.get("name", ""), "status": "revoked", "revoked_at": entry["revoked_at"]}

    def set_policy(self, *, url: str | None = None, file: str | None = None) -> dict[str, str]:
        data = self.load()
        for origin, value in (("url", url), ("file", file)):
            if value is None:
                continue
            if value not in POLICIES:
                raise UserError(f"policy for {origin} must be one of {', '.join(POLICIES)}, not {value!r}")
            data["policy"][origin] = value
        if url is not None or file is not None:
            self.save(data)
        return dict(data["policy"])

    def listing(self) -> dict[str, Any]:
        data = self.load()
        keys = [
            {"key_id": kid, **{k: v for k, v in entry.items() if k != "public_key"}}
            for kid, entry in sorted(data["keys"].items())
        ]
        return {"path": str(self.path), "policy": data["policy"], "keys": keys}

    # -- verification --------------------------------------------------------------------------------------
    def check(self, manifest: dict[str, Any], *, origin: Origin, source: str) -> SignerCheck:
        """Check ``manifest``'s signature against the roots and the policy for ``origin``; ``TrustError``
        naming the key and the reason when it is refused. Nothing is written."""
        data = self.load()
        policy = data["policy"][origin]
        signature = manifest.get("signature")
        if signature is None:
            if policy == "require-signature":
                hint = (
                    "ask its provider for a signed manifest"
                    if origin == "url"
                    else "sign it (`vz driver sign`) or, for a driver you built yourself, "
                    "`vz driver trust policy --file optional`"
                )
                raise TrustError(
                    f"{source} is not signed, and the trust policy requires a signature for {_ORIGIN_TEXT[origin]} "
                    f"({self.path}); {hint}; nothing was installed"
                )
            return SignerCheck(signed=False)
        if not isinstance(signature, dict) or signature.get("format") != FORMAT:
            got = signature.get("format") if isinstance(signature, dict) else type(signature).__name__
            raise TrustError(
                f"{source} has a signature of format {got!r}; vz verifies {FORMAT!r}; nothing was installed"
            )
        kid = str(signature.get("key_id", ""))
        keys: dict[str, Any] = data["keys"]
        entry = keys.get(kid)
        if entry is not None:
            if entry.get("revoked_at"):
                raise TrustError(
                    f"{source} is signed by key {kid} ({entry.get('name')}), which was revoked at "
                    f"{entry['revoked_at']}; nothing was installed"
                )
            verify_manifest_signature(manifest, public_from_raw(entry["public_key"], f"key {kid}"), source=source)
            return SignerCheck(signed=True, key_id=kid, key_name=str(entry.get("name", "")))
        endorsement = signature.get("endorsement")
        if isinstance(endorsement, dict) and signature.get("public_key"):
            return self._check_rotation(manifest, signature, endorsement, keys, source)
        raise TrustError(
            f"{source} is signed by key {kid or '(no key id)'}, which is not among your trusted keys "
            "(`vz driver trust list`); if you trust its provider, get their public key and `vz driver trust add "
            "KEYFILE --name NAME`; nothing was installed"
        )

    def _check_rotation(
        self,
        manifest: dict[str, Any],
        signature: dict[str, Any],
        endorsement: dict[str, Any],
        keys: dict[str, Any],
        source: str,
    ) -> SignerCheck:
        kid = str(signature.get("key_id", ""))
        new = public_from_raw(str(signature["public_key"]), f"the public key in the signature of {source}")
        if key_id(new) != kid:
            raise TrustError(
                f"the signature of {source} names key {kid} but carries key {key_id(new)}; nothing was installed"
            )
        old_id = str(endorsement.get("key_id", ""))
        old = keys.get(old_id)
        if old is None:
            raise TrustError(
                f"{source} is signed by key {kid}, endorsed by key {old_id or '(none)'}; neither is among your "
                "trusted keys (`vz driver trust list`); nothing was installed"
            )
        if old.get("revoked_at"):
            raise TrustError(
                f"{source} is signed by key {kid}, endorsed by key {old_id} ({old.get('name')}), which was revoked "
                f"at {old['revoked_at']}: a revoked key endorses nothing; nothing was installed"
            )
        if not verify_endorsement(endorsement, public_from_raw(old["public_key"], f"key {old_id}"), new):
            raise TrustError(
                f"{source} is signed by key {kid}, but its endorsement by key {old_id} ({old.get('name')}) does not "
                "verify; nothing was installed"
            )
        verify_manifest_signature(manifest, new, source=source)
        return SignerCheck(
            signed=True,
            key_id=kid,
            key_name=f"{old.get('name', '')} (rotated from {old_id})",
            endorsed_by=old_id,
            new_public_key=str(signature["public_key"]),
        )

    def accept(self, check: SignerCheck) -> None:
        """Add a rotated-to key (after the driver it signed was recorded)."""
        if not check.new_public_key:
            return
        data = self.load()
        if check.key_id in data["keys"]:
            return
        data["keys"][check.key_id] = {
            "name": check.key_name,
            "public_key": check.new_public_key,
            "added_at": _now(),
            "revoked_at": "",
            "endorsed_by": check.endorsed_by,
        }
        self.save(data)
