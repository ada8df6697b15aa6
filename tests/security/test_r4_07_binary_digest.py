"""#31 refusal: a downloaded binary whose SHA-256 differs from the signed manifest's is removed and nothing is
installed; an upgrade whose binary fails verification (or that does not start and negotiate) leaves the old
version installed and working."""

from __future__ import annotations

import hashlib
import os

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, publish

from vz_core import _install
from vz_core.drivers import remote_driver
from vz_core.errors import TrustError


def test_a_tampered_binary_is_refused_and_removed(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), p.key)
    p.hub.files["/acme/acme-bin"] = plugin_binary("tampered")
    actual = hashlib.sha256(p.hub.files["/acme/acme-bin"]).hexdigest()
    with pytest.raises(
        TrustError,
        match=rf"SHA-256 mismatch for binary of 'acme' .*the download has {actual}; it "
        r"was removed and nothing was installed",
    ):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert nothing_installed(p)
    assert not [f for _, _, files in os.walk(p.home / "driver-installs") for f in files]


async def _works(p: Provider) -> str:
    driver = remote_driver("acme", store=p.store)
    try:
        return (await driver.info()).driver_name
    finally:
        await driver.close()


async def test_an_upgrade_that_fails_verification_keeps_the_old_version(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary("1"), p.key, version="1.0.0")
    _install.add_url(url, store=p.store, roots=p.roots)
    publish(p.hub, plugin_binary("2"), p.key, version="2.0.0")
    p.hub.files["/acme/acme-bin"] = plugin_binary("2 tampered")
    with pytest.raises(TrustError, match="SHA-256 mismatch"):
        _install.upgrade("acme", store=p.store, roots=p.roots)
    assert p.store.get("acme").manifest.version == "1.0.0"
    assert await _works(p) == "mini"

    # verified, but not a plugin: it does not negotiate, so it is not recorded
    broken = b"#!/bin/sh\necho not a plugin >&2\nexit 3\n"
    publish(p.hub, broken, p.key, version="3.0.0")
    with pytest.raises(
        TrustError,
        match=r"version 3.0.0 was downloaded and verified but did not start and "
        r"negotiate; version 1.0.0 stays installed: .*exit code 3",
    ):
        _install.upgrade("acme", store=p.store, roots=p.roots)
    assert p.store.get("acme").manifest.version == "1.0.0"
    assert await _works(p) == "mini"
    assert sorted(d.name for d in (p.home / "driver-installs" / "acme").iterdir() if d.name.startswith("v")) == [
        f"v1.0.0-{hashlib.sha256(plugin_binary('1')).hexdigest()[:12]}"
    ]
