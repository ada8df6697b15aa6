"""Ed25519 signatures over driver manifests: keys, the canonical form, signing and checking one signature.

**Canonical form.** What is signed is ``MANIFEST_CONTEXT`` followed by the manifest's JSON object *without* its
``signature`` member, serialized with keys sorted, no insignificant whitespace (``","`` and ``":"``), UTF-8,
non-ASCII characters as themselves (``json.dumps(..., sort_keys=True, separators=(",", ":"),
ensure_ascii=False)``). The canonical bytes are computed from the parsed JSON value, so a manifest re-indented
or with its keys reordered still verifies; one whose values changed (a number written ``1.0`` instead of ``1``,
an added member, a different checksum) does not, and is refused as a whole, never half-trusted.

**Signature member.** ``{"format": "ed25519", "key_id": KEYID, "value": BASE64}`` where ``KEYID`` is the first
16 hex digits of the SHA-256 of the raw 32-byte public key and ``value`` the 64-byte signature, base64. A key
rotation adds ``"public_key": BASE64`` (the new raw public key) and ``"endorsement": {"key_id": OLDID,
"value": BASE64}``: the old key's signature over ``ENDORSEMENT_CONTEXT`` + the new raw public key.

**Key files.** A private key is PKCS#8 PEM (unencrypted; written mode 0600); a public key is
SubjectPublicKeyInfo PEM. ``vz driver keygen`` writes both.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from vz_core.errors import TrustError, UserError

__all__ = [
    "ENDORSEMENT_CONTEXT",
    "FORMAT",
    "MANIFEST_CONTEXT",
    "canonical_bytes",
    "endorse",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "public_from_raw",
    "raw_public",
    "sign_manifest",
    "verify_endorsement",
    "verify_manifest_signature",
]

FORMAT = "ed25519"
MANIFEST_CONTEXT = b"vz-driver-manifest-v1\n"
ENDORSEMENT_CONTEXT = b"vz-driver-key-endorsement-v1\n"
_MAX_KEY_FILE = 16 << 10


def canonical_bytes(manifest: dict[str, Any]) -> bytes:
    """The bytes a manifest's signature covers (see the module docstring)."""
    body = {k: v for k, v in manifest.items() if k != "signature"}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise TrustError(f"the manifest has no canonical form: {exc}") from None
    return MANIFEST_CONTEXT + text.encode("utf-8")


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey) -> str:
    """A key's id: the first 16 hex digits of the SHA-256 of its raw public key."""
    return hashlib.sha256(raw_public(key)).hexdigest()[:16]


def public_from_raw(data: str, what: str) -> Ed25519PublicKey:
    """A public key from base64 raw bytes (``TrustError`` naming ``what`` otherwise)."""
    try:
        raw = base64.b64decode(data, validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise TrustError(f"{what} is not a base64 Ed25519 public key (32 bytes)") from None


def _read_key_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_KEY_FILE + 1)
    except OSError as exc:
        raise UserError(f"cannot read key file {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_KEY_FILE:
        raise UserError(f"key file {path} is larger than {_MAX_KEY_FILE} bytes; it is not a key")
    return data


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file; ``UserError`` for anything else (a private key included)."""
    p = Path(path)
    data = _read_key_file(p)
    if b"PRIVATE KEY" in data:
        raise UserError(f"{p} holds a private key; give the public key file (the .pub that `vz driver keygen` wrote)")
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise UserError(f"{p} is not a PEM public key (`vz driver keygen` writes one)") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UserError(f"{p} is a {type(key).__name__.removeprefix('_')}, not an Ed25519 public key")
    return key


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """An Ed25519 private key from an unencrypted PKCS#8 PEM file; ``UserError`` otherwise (never its bytes)."""
    p = Path(path)
    data = _read_key_file(p)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise UserError(f"{p} is not an unencrypted PEM private key (`vz driver keygen` writes one)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UserError(f"{p} is not an Ed25519 private key")
    return key


def generate_keypair(private_path: str | os.PathLike[str]) -> tuple[Path, Path, str]:
    """Write a new key pair: ``private_path`` (mode 0600, never overwritten) and ``<private_path>.pub``.
    Returns (private, public, key id)."""
    priv = Path(private_path)
    pub = priv.with_name(priv.name + ".pub")
    for existing in (priv, pub):
        if os.path.lexists(existing):
            raise UserError(f"{existing} exists; choose another path (a key is never overwritten)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = key.public_key()
    pub.write_bytes(public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub, key_id(public)


def endorse(old: Ed25519PrivateKey, new: Ed25519PublicKey) -> dict[str, str]:
    """The old key's endorsement of a new public key (for a signature's ``endorsement`` member)."""
    value = old.sign(ENDORSEMENT_CONTEXT + raw_public(new))
    return {"key_id": key_id(old.public_key()), "value": base64.b64encode(value).decode()}


def sign_manifest(
    manifest: dict[str, Any], key: Ed25519PrivateKey, *, endorsed_by: Ed25519PrivateKey | None = None
) -> dict[str, Any]:
    """``manifest`` with a ``signature`` member by ``key`` (replacing any). With ``endorsed_by`` (the key being
    rotated away from), the signature carries the new public key and the old key's endorsement of it."""
    body = {k: v for k, v in manifest.items() if k != "signature"}
    public = key.public_key()
    signature: dict[str, Any] = {
        "format": FORMAT,
        "key_id": key_id(public),
        "value": base64.b64encode(key.sign(canonical_bytes(body))).decode(),
    }
    if endorsed_by is not None:
        signature["public_key"] = base64.b64encode(raw_public(public)).decode()
        signature["endorsement"] = endorse(endorsed_by, public)
    return {**body, "signature": signature}


def _decode_signature(value: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 64:
        raise TrustError(f"{what} is not a base64 Ed25519 signature (64 bytes)")
    return raw


def verify_manifest_signature(manifest: dict[str, Any], key: Ed25519PublicKey, *, source: str) -> None:
    """Check ``manifest``'s signature value against ``key``; ``TrustError`` naming the key otherwise."""
    signature = manifest.get("signature")
    assert isinstance(signature, dict)
    raw = _decode_signature(str(signature.get("value", "")), f"the signature of {source}")
    try:
        key.verify(raw, canonical_bytes(manifest))
    except InvalidSignature:
        raise TrustError(
            f"the signature of {source} by key {key_id(key)} does not match the manifest's contents: the "
            "manifest was changed after it was signed (or signed by another key with the same id); nothing was "
            "installed"
        ) from None


def verify_endorsement(endorsement: dict[str, Any], old: Ed25519PublicKey, new: Ed25519PublicKey) -> bool:
    raw = _decode_signature(str(endorsement.get("value", "")), "the key endorsement")
    try:
        old.verify(raw, ENDORSEMENT_CONTEXT + raw_public(new))
    except InvalidSignature:
        return False
    return True
