"""Fixtures of the driver-install tests (test_r4_*): see driverhub.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from driverhub import Provider, new_key, public_pem, serve


@pytest.fixture
def provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Provider]:
    """A user's VZ_HOME that trusts key ``acme``, and the provider's HTTPS server."""
    from vz_core._trustroots import TrustRoots
    from vz_core.drivers import ManifestStore

    home = tmp_path / "home"
    monkeypatch.setenv("VZ_HOME", str(home))
    with serve(tmp_path, monkeypatch) as hub:
        key = new_key()
        roots = TrustRoots()
        roots.add(public_pem(key, tmp_path / "acme.pub"), "acme")
        yield Provider(hub=hub, key=key, roots=roots, store=ManifestStore(), home=home)
