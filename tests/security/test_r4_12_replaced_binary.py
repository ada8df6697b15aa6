"""#31 refusal: a binary replaced (or changed in place) after it was installed is refused at the next launch
(SHA-256 verified before every launch, of the bytes that are then executed) and by `vz driver verify`;
`vz driver rollback` refuses a previous version whose binary changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from driverhub import Provider, plugin_binary, publish

from vz_core import _install
from vz_core.drivers import remote_driver, verify
from vz_core.errors import TrustError


async def test_a_replaced_binary_is_refused_before_launch(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), p.key)
    row = _install.add_url(url, store=p.store, roots=p.roots)
    binary = Path(row["binary"])
    replacement = binary.with_name("other")
    replacement.write_bytes(plugin_binary("replaced"))
    replacement.chmod(0o755)
    replacement.replace(binary)
    assert verify("acme", store=p.store)[0]["ok"] is False
    driver = remote_driver("acme", store=p.store)
    try:
        with pytest.raises(TrustError, match="SHA-256 mismatch"):
            await driver.info()
    finally:
        await driver.close()


def test_rollback_refuses_a_previous_version_that_changed(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary("1"), p.key, version="1.0.0")
    first = Path(_install.add_url(url, store=p.store, roots=p.roots)["binary"])
    publish(p.hub, plugin_binary("2"), p.key, version="2.0.0")
    _install.upgrade("acme", store=p.store, roots=p.roots)
    first.chmod(0o755)
    with open(first, "ab") as f:
        f.write(b"# changed\n")
    with pytest.raises(TrustError, match=r"the previous version's binary .* changed .*nothing was rolled back"):
        _install.rollback("acme", store=p.store)
    assert p.store.get("acme").manifest.version == "2.0.0"
