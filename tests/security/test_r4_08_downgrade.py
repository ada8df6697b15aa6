"""#31 refusal (version skew): installing an older version than the one installed needs --allow-downgrade
(or `vz driver rollback`); versions that cannot be ordered are refused the same way."""

from __future__ import annotations

import pytest
from driverhub import Provider, plugin_binary, publish

from vz_core import _install
from vz_core.errors import TrustError


def test_a_downgrade_needs_allow_downgrade(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary("2"), p.key, version="2.0.0")
    _install.add_url(url, store=p.store, roots=p.roots)
    publish(p.hub, plugin_binary("1"), p.key, version="1.9.9")
    with pytest.raises(
        TrustError,
        match=r"version 1.9.9 is older than the installed 2.0.0; a downgrade needs "
        r"--allow-downgrade .*nothing was changed",
    ):
        _install.add_url(url, store=p.store, roots=p.roots)
    with pytest.raises(TrustError, match="is older than the installed"):
        _install.upgrade("acme", store=p.store, roots=p.roots)
    assert p.hub.fetched("/acme/acme-bin") == 1
    assert p.store.get("acme").manifest.version == "2.0.0"
    row = _install.add_url(url, store=p.store, roots=p.roots, allow_downgrade=True)
    assert row["version"] == "1.9.9" and row["changes"]["version"] == {"from": "2.0.0", "to": "1.9.9"}


def test_unorderable_versions_are_refused(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary("a"), p.key, version="1.0.0")
    _install.add_url(url, store=p.store, roots=p.roots)
    publish(p.hub, plugin_binary("b"), p.key, version="nightly")
    with pytest.raises(TrustError, match=r"cannot tell whether version 'nightly' is newer than the installed '1.0.0'"):
        _install.add_url(url, store=p.store, roots=p.roots)


@pytest.mark.parametrize(
    ("old", "new", "order"),
    [("1.0.0", "1.0.1", 1), ("1.10", "1.9", -1), ("v2", "2.0.0", 0), ("1.0.0-rc1", "1.0.0", 1), ("1.0", "x", None)],
)
def test_version_order(old: str, new: str, order: int | None) -> None:
    assert _install.compare_versions(old, new) == order
