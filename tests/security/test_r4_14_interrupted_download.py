"""#31: a truncated download and a stalled server are errors that say what arrived; what arrived is kept and
the next attempt resumes it with a Range request (the SHA-256 of the whole file is still checked)."""

from __future__ import annotations

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, publish

from vz_core import _install
from vz_core.errors import UnavailableError


@pytest.mark.parametrize("failure", ["truncate", "stall"])
def test_an_interrupted_download_fails_then_resumes(provider: Provider, failure: str) -> None:
    p = provider
    binary = plugin_binary() + b"#" * 50_000
    url = publish(p.hub, binary, p.key)
    getattr(p.hub, failure).add("/acme/acme-bin")
    expected = "was cut off after|ended after" if failure == "truncate" else "stalled: nothing arrived for 1s"
    with pytest.raises(UnavailableError, match=rf"({expected}).*run the command again to resume"):
        _install.add_url(url, store=p.store, roots=p.roots, timeout=1)
    assert nothing_installed(p)
    getattr(p.hub, failure).discard("/acme/acme-bin")
    row = _install.add_url(url, store=p.store, roots=p.roots)
    assert row["status"] == "added"
    ranges = [r for path, r in p.hub.requests if path == "/acme/acme-bin"]
    assert ranges[0] == "" and ranges[1] == f"bytes={len(binary) // 2}-"


def test_a_server_that_ignores_range_is_downloaded_again_from_the_start(provider: Provider) -> None:
    p = provider
    binary = plugin_binary() + b"#" * 50_000
    url = publish(p.hub, binary, p.key)
    p.hub.truncate.add("/acme/acme-bin")
    with pytest.raises(UnavailableError):
        _install.add_url(url, store=p.store, roots=p.roots)
    p.hub.truncate.clear()
    p.hub.ignore_range.add("/acme/acme-bin")
    row = _install.add_url(url, store=p.store, roots=p.roots)
    assert row["status"] == "added"
    assert [r for path, r in p.hub.requests if path == "/acme/acme-bin"][1] == f"bytes={len(binary) // 2}-"
