"""``vz guest fetch <release>/SHA256SUMS --arch A --format F``: a release's bundle, as the release workflow
publishes it (flat assets ``vz-guest-<arch>-<format>.<file>`` and ``SHA256SUMS``), served by an HTTPS server this
test starts on 127.0.0.1 with a certificate it makes (trusted through ``SSL_CERT_FILE``, as a user's system
store would be): the manifest is pinned by the list, every file by the manifest, the copy is cached by digest
and a second fetch reads only the list."""

from __future__ import annotations

import hashlib
import http.server
import re
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vz_core.errors import FailedPreconditionError, InvalidArgumentError
from vz_drivers import guest as guest_cli
from vz_drivers._guest import MANIFEST, fetch_release, open_bundle, release_asset, write_bundle

FILES = {"Image": b"kernel bytes", "initramfs.cpio": b"initramfs bytes"}
ROLES = {"kernel": "Image", "initrd": "initramfs.cpio"}


def _release(assets: Path) -> str:
    """Two bundles laid out as release.yml does; returns the arm64 vfkit manifest's SHA-256."""
    assets.mkdir()
    digest = ""
    for arch, fmt in (("arm64", "vfkit"), ("amd64", "hyperv")):
        built = write_bundle(assets.parent / f"{arch}-{fmt}", FILES, arch=arch, fmt=fmt, roles=ROLES)
        for path in built.root.iterdir():
            shutil.copyfile(path, assets / release_asset(arch, fmt, path.name))
        digest = digest or built.digest
    lines = [
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in sorted(assets.iterdir())
    ]  # sha256sum's format
    (assets / "SHA256SUMS").write_text("".join(lines))
    return digest


class _Server:
    def __init__(self, root: Path, cert: Path, key: Path) -> None:
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_Server, Path, str]]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is missing (apt-get install openssl)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    argv += ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(argv, check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    assets = tmp_path / "assets"
    digest = _release(assets)
    server = _Server(assets, cert, key)
    try:
        yield server, assets, digest
    finally:
        server.close()


def test_fetch_from_a_releases_sha256sums_verifies_and_caches_by_digest(
    release: tuple[_Server, Path, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server, _, digest = release
    sums = f"{server.url}/SHA256SUMS"
    assert guest_cli.main(["fetch", sums, "--arch", "arm64", "--format", "vfkit"]) == 0
    cached = tmp_path / "home" / "cache" / "guest" / "bundles" / digest
    out = capsys.readouterr().out.splitlines()
    assert out == [
        str(cached),
        f"sha256 {digest}  arm64 vfkit",
        f"vz driver configure vfkit guest={cached} guest_sha256={digest}",
    ]
    assert sorted(p.name for p in cached.iterdir()) == ["Image", "initramfs.cpio", MANIFEST]
    assert (cached / "Image").read_bytes() == FILES["Image"]
    assert server.requests == [
        "/SHA256SUMS",
        "/vz-guest-arm64-vfkit.manifest.json",
        "/vz-guest-arm64-vfkit.Image",
        "/vz-guest-arm64-vfkit.initramfs.cpio",
    ]
    # cached by digest: the second fetch reads the list only; the driver's guest=<that directory> reads nothing
    server.requests.clear()
    assert guest_cli.main(["fetch", sums, "--arch", "arm64", "--format", "vfkit"]) == 0
    assert server.requests == ["/SHA256SUMS"]
    assert open_bundle(str(cached), cached.parent, digest=digest).root == cached
    assert server.requests == ["/SHA256SUMS"]


def test_a_changed_asset_is_refused_naming_it_and_nothing_is_cached(
    release: tuple[_Server, Path, str], tmp_path: Path
) -> None:
    server, assets, _ = release
    (assets / "vz-guest-arm64-vfkit.initramfs.cpio").write_bytes(b"initramfs bytez")
    cache = tmp_path / "cache"
    with pytest.raises(FailedPreconditionError, match=r"initramfs\.cpio does not match its manifest"):
        fetch_release(f"{server.url}/SHA256SUMS", "arm64", "vfkit", cache)
    assert list(cache.iterdir()) == []


def test_a_manifest_the_list_does_not_pin_is_refused(release: tuple[_Server, Path, str], tmp_path: Path) -> None:
    server, assets, digest = release
    manifest = assets / "vz-guest-arm64-vfkit.manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"arm64"', b'"arm64" '))
    with pytest.raises(FailedPreconditionError, match=f"not the pinned {digest}"):
        fetch_release(f"{server.url}/SHA256SUMS", "arm64", "vfkit", tmp_path / "cache")


def test_a_bundle_the_release_lacks_is_named_with_what_it_has(
    release: tuple[_Server, Path, str], tmp_path: Path
) -> None:
    server, _, _ = release
    with pytest.raises(
        FailedPreconditionError,
        match=re.escape(
            "no vz-guest-amd64-vfkit.manifest.json; its bundles: vz-guest-amd64-hyperv, vz-guest-arm64-vfkit"
        ),
    ):
        fetch_release(f"{server.url}/SHA256SUMS", "amd64", "vfkit", tmp_path / "cache")


def test_a_downloaded_release_directory_works_the_same(release: tuple[_Server, Path, str], tmp_path: Path) -> None:
    _, assets, digest = release
    bundle = fetch_release(str(assets / "SHA256SUMS"), "amd64", "hyperv", tmp_path / "cache")
    assert bundle.format == "hyperv" and bundle.digest != digest


def test_bad_fetch_arguments_are_refused_before_anything_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert guest_cli.main(["fetch", "https://127.0.0.1:9/SHA256SUMS"]) == 1
    assert "give --arch and --format" in capsys.readouterr().err
    assert guest_cli.main(["fetch", "https://127.0.0.1:9/x.manifest.json", "--arch", "arm64"]) == 1
    assert "--arch and --format choose a bundle of a release's SHA256SUMS" in capsys.readouterr().err
    with pytest.raises(InvalidArgumentError, match="must be an https:// URL or an absolute path"):
        fetch_release("http://127.0.0.1:9/SHA256SUMS", "arm64", "vfkit", tmp_path / "cache")
