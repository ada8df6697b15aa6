"""#31: a provider's path end to end. A signed manifest and a real plugin binary on a real HTTPS server on
loopback (a CA generated here), installed with one command, listed with its provenance, run, upgraded (the
changes shown), rolled back and removed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from driverhub import Provider, plugin_binary, publish

from vz_core import _install
from vz_core.drivers import list_drivers, remote_driver
from vz_core.trust import host_platform


async def _driver_name(p: Provider) -> str:
    driver = remote_driver("acme", store=p.store)
    try:
        return (await driver.info()).driver_name
    finally:
        await driver.close()


async def test_install_list_run_upgrade_rollback_remove(provider: Provider) -> None:
    p = provider
    url = publish(p.hub, plugin_binary("1.0.0"), p.key, version="1.0.0")
    row = _install.add_url(url, store=p.store, roots=p.roots)
    assert row["status"] == "added" and row["version"] == "1.0.0"
    prov = row["provenance"]
    assert prov["signed"] is True and prov["key_name"] == "acme" and prov["source"] == url and prov["origin"] == "url"
    listed = next(r for r in list_drivers(store=p.store) if r["name"] == "acme")
    assert listed["provenance"]["key_id"] == prov["key_id"] and listed["binary"].startswith(str(p.home))
    assert await _driver_name(p) == "mini"

    url2 = publish(p.hub, plugin_binary("1.1.0"), p.key, version="1.1.0")
    assert url2 == url
    up = _install.upgrade("acme", store=p.store, roots=p.roots)
    assert up["status"] == "upgraded" and up["version"] == "1.1.0"
    assert up["changes"]["version"] == {"from": "1.0.0", "to": "1.1.0"} and "sha256" in up["changes"]
    assert _install.upgrade("acme", store=p.store, roots=p.roots)["status"] == "up to date"
    assert await _driver_name(p) == "mini"

    back = _install.rollback("acme", store=p.store)
    assert back == {"name": "acme", "status": "rolled back", "version": "1.0.0", "from_version": "1.1.0"}
    assert p.store.get("acme").manifest.version == "1.0.0"
    assert next(r for r in list_drivers(store=p.store) if r["name"] == "acme")["provenance"]["version"] == "1.0.0"
    assert await _driver_name(p) == "mini"
    # a second rollback undoes the first
    assert _install.rollback("acme", store=p.store)["version"] == "1.1.0"

    assert _install.remove("acme", store=p.store)["status"] == "removed"
    assert p.store.get("acme") is None and not (p.home / "driver-installs" / "acme").exists()


def test_the_documented_commands(provider: Provider, tmp_path: Path) -> None:
    """What docs/driver-authors.md "Publishing your driver" tells a provider and a user to run."""
    p = provider
    vz = [str(Path(sys.executable).parent / "vz")]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*vz, *args], capture_output=True, text=True, timeout=120, check=False)

    made = run("driver", "keygen", str(tmp_path / "release.key"), "--json")
    assert made.returncode == 0, made.stderr
    kid = json.loads(made.stdout)["key_id"]
    manifest = tmp_path / "manifest.json"
    binary = plugin_binary("cli")
    import hashlib

    manifest.write_text(
        json.dumps(
            {
                "name": "acme",
                "version": "2.0.0",
                "api_version": "1.3",
                "binaries": {
                    host_platform(): {"url": "acme-bin", "file": "acme", "sha256": hashlib.sha256(binary).hexdigest()}
                },
                "args": ["mini"],
            }
        )
    )
    signed = run("driver", "sign", str(manifest), "--key", str(tmp_path / "release.key"))
    assert signed.returncode == 0, signed.stderr
    p.hub.files["/r/manifest.json"] = manifest.read_bytes()
    p.hub.files["/r/acme-bin"] = binary
    url = p.hub.url("/r/manifest.json")

    refused = run("driver", "add", url)
    assert refused.returncode != 0 and f"signed by key {kid}, which is not among your trusted keys" in refused.stderr
    trusted = run("driver", "trust", "add", str(tmp_path / "release.key.pub"), "--name", "Acme Inc")
    assert trusted.returncode == 0, trusted.stderr
    added = run("driver", "add", url)
    assert added.returncode == 0, added.stderr
    assert f"signed by Acme Inc ({kid}), from {url}" in added.stdout
    listing = run("driver", "list", "--json")
    row = next(r for r in json.loads(listing.stdout)["drivers"] if r["name"] == "acme")
    assert row["provenance"]["key_id"] == kid and row["version"] == "2.0.0"
    assert f"signed by Acme Inc ({kid})" in run("driver", "list").stdout
    assert run("driver", "remove", "acme").returncode == 0
    assert "acme" not in run("driver", "list").stdout


def test_the_guides_signing_script_signs_what_vz_verifies(
    provider: Provider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python snippet of docs/driver-authors.md "Publishing your driver", run as written."""
    import re

    guide = (Path(__file__).resolve().parents[2] / "docs" / "driver-authors.md").read_text()
    section = guide.split("## Publishing your driver", 1)[1].split("\n## ", 1)[0]
    (script,) = re.findall(r"```python\n(.*?)```", section, re.S)
    p = provider
    publish(p.hub, plugin_binary(), None)
    (tmp_path / "manifest.json").write_bytes(p.hub.files["/acme/manifest.json"])
    from cryptography.hazmat.primitives import serialization

    (tmp_path / "release.key").write_bytes(
        p.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    monkeypatch.chdir(tmp_path)
    exec(compile(script, "driver-authors.md", "exec"), {})
    p.hub.files["/acme/manifest.json"] = (tmp_path / "manifest.json").read_bytes()
    row = _install.add_url(p.hub.url("/acme/manifest.json"), store=p.store, roots=p.roots)
    assert row["provenance"]["signed"] is True and row["provenance"]["key_name"] == "acme"


def test_an_upgrade_shows_the_capabilities_that_change(provider: Provider) -> None:
    """What the new version's plugin negotiated, against what the installed one did (both from their Info)."""
    p = provider
    url = publish(p.hub, plugin_binary("1"), p.key, version="1.0.0")
    _install.add_url(url, store=p.store, roots=p.roots)
    publish(p.hub, plugin_binary("2"), p.key, version="1.1.0", args=("logs",))
    up = _install.upgrade("acme", store=p.store, roots=p.roots)
    change = up["changes"]["capabilities"]
    assert "logs" not in change["from"] and "logs" in change["to"] and "api 1.3" in change["to"]
