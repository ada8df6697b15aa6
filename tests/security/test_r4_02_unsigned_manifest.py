"""#31 refusal: an unsigned manifest under a policy that requires a signature is refused before anything is
downloaded or recorded (the default for URLs; for local files when the user asks for it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, publish

from vz_core import _install
from vz_core.drivers import add_manifest
from vz_core.errors import TrustError


def test_an_unsigned_manifest_from_a_url_is_refused_before_the_binary_is_fetched(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), None)
    with pytest.raises(
        TrustError,
        match=r"is not signed, and the trust policy requires a signature for drivers "
        r"downloaded from a URL .*ask its provider for a signed manifest; nothing was installed",
    ):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert p.hub.fetched("/acme/manifest.json") == 1 and p.hub.fetched("/acme/acme-bin") == 0
    assert nothing_installed(p)


def test_an_unsigned_local_manifest_is_refused_when_the_user_requires_signatures(
    provider: Provider, tmp_path: Path
) -> None:
    p = provider
    binary = tmp_path / "drv" / "acme"
    binary.parent.mkdir()
    binary.write_bytes(plugin_binary())
    binary.chmod(0o755)
    import hashlib

    from vz_core.trust import host_platform

    manifest = binary.parent / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "name": "acme",
                "version": "1.0.0",
                "api_version": "1.3",
                "args": ["mini"],
                "binaries": {
                    host_platform(): {"path": "acme", "sha256": hashlib.sha256(binary.read_bytes()).hexdigest()}
                },
            }
        )
    )
    # optional by default for local files: recorded, provenance says unsigned
    row = add_manifest(manifest, store=p.store)
    assert row["provenance"]["signed"] is False and row["provenance"]["origin"] == "file"
    p.store.root.joinpath("acme.json").unlink()
    p.roots.set_policy(file="require-signature")
    with pytest.raises(TrustError, match=r"is not signed.*manifests added from a local file.*vz driver sign"):
        add_manifest(manifest, store=p.store)
    assert p.store.get("acme") is None
