"""#31 refusal: a manifest that ships no binary for this os/arch is refused before any binary is fetched,
naming this platform and the ones it has; a URL manifest whose entry is a 'path' (a file on the provider's
machine) is refused too."""

from __future__ import annotations

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, publish

from vz_core import _install, _signing
from vz_core.errors import TrustError
from vz_core.trust import host_platform


def test_a_manifest_for_another_platform_is_refused(provider: Provider) -> None:
    p = provider
    other = "darwin/arm64" if host_platform() != "darwin/arm64" else "linux/amd64"
    url = publish(p.hub, plugin_binary(), p.key, platform=other)
    with pytest.raises(TrustError, match=rf"ships no binary for {host_platform()} \(it has: {other}\)"):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert p.hub.fetched("/acme/acme-bin") == 0 and nothing_installed(p)


def test_a_url_manifest_naming_a_local_path_is_refused(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), None)
    import json

    manifest = json.loads(p.hub.files["/acme/manifest.json"])
    (entry,) = manifest["binaries"].values()
    entry.pop("url")
    entry.pop("file")
    entry["path"] = "/bin/sh"
    p.hub.files["/acme/manifest.json"] = json.dumps(_signing.sign_manifest(manifest, p.key)).encode()
    with pytest.raises(TrustError, match="gives this platform's binary as a 'path'"):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert nothing_installed(p)
