"""#31 refusal: names that would leave the install directory. A manifest's ``file`` must be a plain file name
and its ``name`` a driver name (refused before anything is fetched); a ``version`` is free text, so it never
becomes a path as written: the version directory's name is built from a safe spelling of it and the SHA-256."""

from __future__ import annotations

import json

import pytest
from driverhub import Provider, nothing_installed, plugin_binary, publish

from vz_core import _install, _signing
from vz_core.errors import TrustError


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("file", "../../evil", "'file' must be a plain file name"),
        ("file", "..", "'file' must be a plain file name"),
        ("name", "../acme", "is invalid: name: String should match pattern"),
        ("name", "acme/../../x", "is invalid: name: String should match pattern"),
    ],
)
def test_traversing_names_are_refused(provider: Provider, field: str, value: str, message: str) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), None)
    manifest = json.loads(p.hub.files["/acme/manifest.json"])
    if field == "file":
        (entry,) = manifest["binaries"].values()
        entry["file"] = value
    else:
        manifest["name"] = value
    p.hub.files["/acme/manifest.json"] = json.dumps(_signing.sign_manifest(manifest, p.key)).encode()
    with pytest.raises(TrustError, match=message):
        _install.add_url(url, store=p.store, roots=p.roots)
    assert p.hub.fetched("/acme/acme-bin") == 0 and nothing_installed(p)
    assert not (p.home.parent / "evil").exists()


def test_a_version_never_becomes_a_path(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary(), p.key, version="../../../../escaped")
    row = _install.add_url(url, store=p.store, roots=p.roots, allow_downgrade=True)
    base = (p.home / "driver-installs" / "acme").resolve()
    binary = (p.home / "driver-installs" / "acme").joinpath(*row["binary"].split("/acme/", 1)[1:])
    assert binary.resolve().is_relative_to(base)
    (version_dir,) = [d for d in base.iterdir() if d.name.startswith("v")]
    assert version_dir.name.startswith("v.._.._.._.._escaped-")
    assert not any(p.home.parent.glob("escaped*")) and not any(p.home.glob("escaped*"))
