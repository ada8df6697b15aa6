"""#31 refusal: a signature over other bytes. A manifest changed after it was signed (a checksum, a version, an
added argument) is refused as a whole; the same manifest re-serialized (re-indented, keys reordered) has the
same canonical form and still verifies."""

from __future__ import annotations

import hashlib
import json

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, publish

from vz_core import _install, _signing
from vz_core.errors import TrustError


@pytest.mark.parametrize(
    "change",
    ["sha256 of another binary", "version", "an added argument", "garbled signature"],
)
def test_a_manifest_changed_after_signing_is_refused(provider: Provider, change: str) -> None:
    p = provider
    evil = plugin_binary("evil")
    url = publish(p.hub, plugin_binary(), p.key)
    manifest = json.loads(p.hub.files["/acme/manifest.json"])
    if change == "sha256 of another binary":
        (entry,) = manifest["binaries"].values()
        entry["sha256"] = hashlib.sha256(evil).hexdigest()
        p.hub.files["/acme/acme-bin"] = evil
    elif change == "version":
        manifest["version"] = "9.9.9"
    elif change == "an added argument":
        manifest["args"].append("--evil")
    else:
        manifest["signature"]["value"] = manifest["signature"]["value"][::-1]
    p.hub.files["/acme/manifest.json"] = json.dumps(manifest).encode()
    kid = _signing.key_id(p.key.public_key())
    expected = (
        "is not a base64 Ed25519 signature|does not match the manifest's contents"
        if change == "garbled signature"
        else rf"the signature of manifest .* by key {kid} does not match the manifest's contents"
    )
    with pytest.raises(TrustError, match=expected):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert p.hub.fetched("/acme/acme-bin") == 0 and nothing_installed(p)


def test_a_reserialized_manifest_still_verifies(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), p.key)
    manifest = json.loads(p.hub.files["/acme/manifest.json"])
    reordered = dict(reversed(list(manifest.items())))
    p.hub.files["/acme/manifest.json"] = json.dumps(reordered, separators=(",", ":"), ensure_ascii=True).encode()
    assert _signing.canonical_bytes(reordered) == _signing.canonical_bytes(manifest)
    assert _install.add_url(url, store=p.store, roots=p.roots)["provenance"]["signed"] is True
