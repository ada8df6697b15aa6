"""#31: redirects. A redirect to another host over https is followed (release files often live on a separate
download host; the signed manifest's SHA-256, not the host, vouches for the bytes) and the URL the user asked for
is what provenance records; a redirect to plain http elsewhere is refused (test_r4_09); redirect loops end."""

from __future__ import annotations

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, publish

from vz_core import _install
from vz_core.errors import UnavailableError


def test_a_redirect_to_another_https_host_is_followed(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), p.key, binary_path="/acme/acme-bin")
    port = p.hub.base.rsplit(":", 1)[1]
    p.hub.files["/cdn/acme-bin"] = p.hub.files["/acme/acme-bin"]
    p.hub.redirects["/acme/acme-bin"] = f"https://127.0.0.1:{port}/cdn/acme-bin"
    row = _install.add_url(url, store=p.store, roots=p.roots)
    assert row["provenance"]["source"] == url and p.hub.fetched("/cdn/acme-bin") == 1


def test_a_redirect_loop_ends(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), p.key)
    p.hub.redirects["/acme/acme-bin"] = "/acme/acme-bin"
    with pytest.raises(UnavailableError, match="more than 5 redirects"):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert nothing_installed(p)
