"""#31 refusal: a manifest or binary over plain http from a host that is not loopback is refused before any
connection (the addresses used here are TEST-NET-1, never contacted: the refusal comes first), whether it is the
URL given or a redirect hop or the binary's URL in a signed manifest."""

from __future__ import annotations

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, publish

from vz_core import _download, _install
from vz_core.errors import TrustError, UserError


def test_plain_http_to_another_host_is_refused(provider: Provider) -> None:
    p = provider
    with pytest.raises(
        TrustError,
        match=r"refusing plain http to 192.0.2.7 .*plain http is allowed only to a "
        r"loopback host",
    ):
        _install.add_url("http://192.0.2.7/acme/manifest.json", store=p.store, roots=p.roots)
    assert nothing_installed(p)


def test_a_redirect_to_plain_http_elsewhere_is_refused(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), p.key)
    p.hub.redirects["/acme/manifest.json"] = "http://192.0.2.7/manifest.json"
    with pytest.raises(TrustError, match=r"refusing plain http to 192.0.2.7"):
        _install.add_url(url, store=p.store, roots=p.roots)
    del p.hub.redirects["/acme/manifest.json"]
    p.hub.redirects["/acme/acme-bin"] = "http://192.0.2.7/acme-bin"
    with pytest.raises(TrustError, match=r"refusing plain http to 192.0.2.7"):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert nothing_installed(p)


def test_a_signed_manifest_naming_a_plain_http_binary_is_refused(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), p.key)
    import json

    from vz_core import _signing

    manifest = json.loads(p.hub.files["/acme/manifest.json"])
    (entry,) = manifest["binaries"].values()
    entry["url"] = "http://192.0.2.7/acme-bin"
    p.hub.files["/acme/manifest.json"] = json.dumps(_signing.sign_manifest(manifest, p.key)).encode()
    with pytest.raises(TrustError, match=r"refusing plain http to 192.0.2.7 \(binary URL"):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert nothing_installed(p)


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:8080/m.json", True),
        ("http://localhost/m.json", True),
        ("http://[::1]/m.json", True),
        ("https://example.invalid/m.json", True),
        ("http://10.0.0.1/m.json", False),
        ("http://127.0.0.1.example.invalid/m.json", False),
    ],
)
def test_which_urls_may_be_fetched(url: str, allowed: bool) -> None:
    if allowed:
        _download.check_url(url)
    else:
        with pytest.raises(TrustError, match="refusing plain http"):
            _download.check_url(url)


@pytest.mark.parametrize("url", ["ftp://h/m.json", "file:///etc/passwd", "https://user:pw@h/m.json", "https:///x"])
def test_other_schemes_and_credentials_are_usage_errors(url: str) -> None:
    with pytest.raises(UserError):
        _download.check_url(url)
