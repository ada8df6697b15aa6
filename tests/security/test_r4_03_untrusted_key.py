"""#31 refusal: a manifest signed by a key the user does not trust is refused, naming the key and what to do;
trusting the key (`vz driver trust add`) then lets the same manifest in."""

from __future__ import annotations

from pathlib import Path

import pytest
from driverhub import Provider, new_key, nothing_installed, plugin_binary, public_pem, publish

from vz_core import _install, _signing
from vz_core.errors import TrustError


def test_a_manifest_signed_by_an_unknown_key_is_refused(provider: Provider, tmp_path: Path) -> None:
    p = provider
    stranger = new_key()
    kid = _signing.key_id(stranger.public_key())
    url = publish(p.hub, plugin_binary(), stranger)
    with pytest.raises(
        TrustError,
        match=rf"signed by key {kid}, which is not among your trusted keys .*vz driver "
        r"trust add KEYFILE --name NAME`; nothing was installed",
    ):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert p.hub.fetched("/acme/acme-bin") == 0 and nothing_installed(p)

    p.roots.add(public_pem(stranger, tmp_path / "stranger.pub"), "stranger")
    row = _install.add_url(url, store=p.store, roots=p.roots)
    assert row["provenance"]["key_id"] == kid and row["provenance"]["key_name"] == "stranger"


def test_removing_a_key_stops_trusting_it(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), p.key)
    p.roots.remove("acme")
    with pytest.raises(TrustError, match="which is not among your trusted keys"):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert nothing_installed(p)
