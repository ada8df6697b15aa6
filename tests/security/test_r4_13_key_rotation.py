"""#31: key rotation. A manifest signed by a new key that a trusted key endorsed is accepted and the new key
becomes trusted (endorsed_by recorded); an endorsement by an untrusted or revoked key, a forged endorsement, or
a signature naming one key while carrying another is refused."""

from __future__ import annotations

import json

import pytest
from driverhub import Provider, new_key, nothing_installed, plugin_binary, publish

from vz_core import _install, _signing
from vz_core.errors import TrustError


def test_a_rotated_key_endorsed_by_a_trusted_key_is_accepted(provider: Provider) -> None:
    p = provider
    old_id = _signing.key_id(p.key.public_key())
    new = new_key()
    new_id = _signing.key_id(new.public_key())
    url = publish(p.hub, plugin_binary("1"), new, endorsed_by=p.key, version="1.0.0")
    row = _install.add_url(url, store=p.store, roots=p.roots)
    assert row["provenance"]["key_id"] == new_id and row["provenance"]["endorsed_by"] == old_id
    keys = {k["key_id"]: k for k in p.roots.listing()["keys"]}
    assert keys[new_id]["endorsed_by"] == old_id and not keys[new_id]["revoked_at"]
    # the old key is retired; the new one keeps working without the endorsement
    p.roots.revoke(old_id)
    publish(p.hub, plugin_binary("2"), new, version="2.0.0")
    assert _install.upgrade("acme", store=p.store, roots=p.roots)["version"] == "2.0.0"


def test_an_endorsement_by_a_revoked_key_is_refused(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), new_key(), endorsed_by=p.key)
    p.roots.revoke("acme")
    with pytest.raises(
        TrustError,
        match=r"endorsed by key \w+ \(acme\), which was revoked at .* a revoked key "
        r"endorses nothing",
    ):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert nothing_installed(p) and len(p.roots.listing()["keys"]) == 1


def test_an_endorsement_by_an_untrusted_key_is_refused(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), new_key(), endorsed_by=new_key())
    with pytest.raises(TrustError, match=r"endorsed by key .*; neither is among your trusted keys"):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert nothing_installed(p)


@pytest.mark.parametrize("forgery", ["endorsement of another key", "key id of another key"])
def test_forged_rotations_are_refused(provider: Provider, forgery: str) -> None:
    p = provider
    new, other = new_key(), new_key()
    url = publish(p.hub, plugin_binary(), new, endorsed_by=p.key)
    manifest = json.loads(p.hub.files["/acme/manifest.json"])
    if forgery == "endorsement of another key":
        manifest["signature"]["endorsement"] = _signing.endorse(p.key, other.public_key())
        match = "its endorsement by key .* does not verify"
    else:
        manifest["signature"]["key_id"] = _signing.key_id(other.public_key())
        match = "names key .* but carries key"
    p.hub.files["/acme/manifest.json"] = json.dumps(manifest).encode()
    with pytest.raises(TrustError, match=match):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert nothing_installed(p) and len(p.roots.listing()["keys"]) == 1
