"""#31 refusal: a download larger than the limit is refused: an announced Content-Length before the body is
read, a body without one as soon as it passes the limit (what arrived is removed); a manifest larger than the
manifest limit likewise."""

from __future__ import annotations

import os

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, publish

from vz_core import _install
from vz_core.errors import TrustError
from vz_core.trust import MAX_MANIFEST_BYTES


@pytest.mark.parametrize("announced", [True, False])
def test_an_oversize_binary_is_refused(provider: Provider, announced: bool) -> None:
    p = provider
    big = plugin_binary() + b"#" * 200_000
    url = publish(p.hub, big, p.key)
    if not announced:
        p.hub.no_length.add("/acme/acme-bin")
    with pytest.raises(
        TrustError,
        match=r"binary of 'acme' .* is \d+ bytes, more than the limit of 100000 bytes; "
        r"nothing was installed \(--max-size raises the limit\)",
    ):
        _install.add_url(url, store=p.store, roots=p.roots, max_bytes=100_000)
    assert nothing_installed(p)
    assert not [f for _, _, files in os.walk(p.home / "driver-installs") for f in files]
    assert _install.add_url(url, store=p.store, roots=p.roots, max_bytes=1 << 20)["status"] == "added"


def test_an_oversize_manifest_is_refused(provider: Provider) -> None:
    p = provider
    p.hub.files["/huge.json"] = b"{" + b" " * MAX_MANIFEST_BYTES + b"}"
    with pytest.raises(TrustError, match=rf"manifest .* is {MAX_MANIFEST_BYTES + 2} bytes, more than the limit"):
        _install.add_url(p.hub.url("/huge.json"), store=p.store, roots=p.roots)
    assert nothing_installed(p)
