"""#31 refusal: a manifest signed by a revoked key is refused (under either policy: a signature present must
verify), naming the key and when it was revoked; a revoked key cannot be trusted again by `trust add`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, public_pem, publish

from vz_core import _install, _signing
from vz_core.errors import TrustError, UserError


def test_a_manifest_signed_by_a_revoked_key_is_refused(provider: Provider, tmp_path: Path) -> None:
    p = provider
    kid = _signing.key_id(p.key.public_key())
    url = publish(p.hub, plugin_binary(), p.key)
    revoked = p.roots.revoke(kid)
    for policy in ("require-signature", "optional"):
        p.roots.set_policy(url=policy)
        with pytest.raises(
            TrustError,
            match=rf"signed by key {kid} \(acme\), which was revoked at "
            f"{re.escape(revoked['revoked_at'])}; nothing was installed",
        ):
            _install.add_url(url, store=p.store, roots=p.roots)
    assert p.hub.fetched("/acme/acme-bin") == 0 and nothing_installed(p)
    with pytest.raises(UserError, match=r"was revoked at .* a revoked key is not trusted again"):
        p.roots.add(public_pem(p.key, tmp_path / "again.pub"), "acme again")


def test_revoking_after_install_refuses_the_upgrade_it_signs(provider: Provider) -> None:
    p = provider
    publish(p.hub, plugin_binary("1"), p.key, version="1.0.0")
    _install.add_url(provider.hub.url("/acme/manifest.json"), store=p.store, roots=p.roots)
    publish(p.hub, plugin_binary("2"), p.key, version="2.0.0")
    p.roots.revoke("acme")
    with pytest.raises(TrustError, match="which was revoked at"):
        _install.upgrade("acme", store=p.store, roots=p.roots)
    assert p.store.get("acme").manifest.version == "1.0.0"
