"""A provider's release server for the driver-install tests: real HTTPS on loopback with a CA made per test.

``Hub`` serves files (a manifest, binaries) from memory over TLS (a certificate for ``localhost`` and
``127.0.0.1`` signed by a CA generated in the test; ``SSL_CERT_FILE`` points vz at it), honours ``Range``, and
can misbehave on purpose: redirect, cut a body short, stall, omit ``Content-Length``. It logs every request.
``provider_release`` writes what a provider publishes: a plugin binary (a real Runtime Protocol plugin), its
manifest, signed with ``vz driver sign``'s library.
"""

from __future__ import annotations

import datetime
import hashlib
import http.server
import ipaddress
import json
import ssl
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from vz_core import _signing
from vz_core.trust import host_platform

TESTDRIVERS = Path(__file__).resolve().parents[1] / "vz_plugins" / "testdrivers.py"
PROXIED_HOST = "releases.example.test"
"""A name the server's certificate also carries, reached only through a test proxy (never resolved)."""


def make_ca(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) PEM files for localhost/127.0.0.1."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vz test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName(PROXIED_HOST),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_path, cert_path, key_path


@dataclass
class Hub:
    """The server's behaviour (mutable while it runs) and its request log."""

    files: dict[str, bytes] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    truncate: set[str] = field(default_factory=set)
    """Paths whose body is cut off after half of it (with the full ``Content-Length`` announced)."""
    stall: set[str] = field(default_factory=set)
    """Paths whose body stops after half of it until the test ends (the connection stays open)."""
    no_length: set[str] = field(default_factory=set)
    ignore_range: set[str] = field(default_factory=set)
    """Paths served whole (200) whatever ``Range`` asks for."""
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(path, Range header or "")."""
    base: str = ""
    release: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str) -> str:
        return self.base + path

    def fetched(self, path: str) -> int:
        return sum(1 for p, _ in self.requests if p == path)


def _handler(hub: Hub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            rng = self.headers.get("Range", "")
            hub.requests.append((path, rng))
            if path in hub.redirects:
                self.send_response(302)
                self.send_header("Location", hub.redirects[path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = hub.files.get(path)
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = 0
            if path not in hub.ignore_range and rng.startswith("bytes=") and rng.endswith("-") and rng[6:-1].isdigit():
                start = int(rng[6:-1])
                if start >= len(body):
                    self.send_response(416)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            part = body[start:]
            if path in hub.no_length:
                self.send_header("Connection", "close")
            else:
                self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            if path in hub.truncate or path in hub.stall:
                self.wfile.write(part[: len(part) // 2])
                self.wfile.flush()
                if path in hub.stall:
                    hub.release.wait(120)
                self.close_connection = True
                return
            self.wfile.write(part)
            if path in hub.no_length:
                self.close_connection = True

    return Handler


@contextmanager
def serve(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    """A ``Hub`` on ``https://localhost:<port>``, with ``SSL_CERT_FILE`` naming its CA for this test."""
    ca, cert, key = make_ca(directory)
    hub = Hub()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    hub.base = f"https://localhost:{server.server_address[1]}"
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def plugin_binary(tag: str = "") -> bytes:
    """A real Runtime Protocol plugin (the test drivers' ``mini``) as a script; ``tag`` makes versions differ."""
    return (
        f"#!{sys.executable}\n"
        f"# {tag}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(TESTDRIVERS.parent)!r})\n"
        "import testdrivers\n"
        "testdrivers.main()\n"
    ).encode()


def new_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_pem(key: Ed25519PrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return path


def manifest_for(
    binary: bytes,
    *,
    name: str = "acme",
    version: str = "1.0.0",
    file: str = "acme",
    url: str = "acme-bin",
    platform: str | None = None,
    sha256: str | None = None,
    args: tuple[str, ...] = ("mini",),
) -> dict[str, Any]:
    return {
        "manifest_version": 1,
        "name": name,
        "version": version,
        "api_version": "1.3",
        "binaries": {
            platform or host_platform(): {
                "url": url,
                "file": file,
                "sha256": sha256 or hashlib.sha256(binary).hexdigest(),
            }
        },
        "args": list(args),
    }


def publish(
    hub: Hub,
    binary: bytes,
    key: Ed25519PrivateKey | None,
    *,
    path: str = "/acme/manifest.json",
    binary_path: str = "/acme/acme-bin",
    endorsed_by: Ed25519PrivateKey | None = None,
    **fields: Any,
) -> str:
    """Put a (signed, unless ``key`` is None) manifest and its binary on the hub; the manifest URL."""
    manifest = manifest_for(binary, url=binary_path.rsplit("/", 1)[1], **fields)
    if key is not None:
        manifest = _signing.sign_manifest(manifest, key, endorsed_by=endorsed_by)
    hub.files[path] = json.dumps(manifest, indent=2).encode()
    hub.files[binary_path] = binary
    return hub.url(path)


@dataclass
class Provider:
    """A user's VZ_HOME trusting key ``acme`` (``roots``), and the provider's HTTPS server."""

    hub: Hub
    key: Ed25519PrivateKey
    roots: Any
    store: Any
    home: Path


def nothing_installed(p: Provider, name: str = "acme") -> bool:
    """No record and no executable file for ``name`` under the user's VZ_HOME."""
    import os
    import stat

    if p.store.get(name) is not None:
        return False
    for root, _, files in os.walk(p.home / "driver-installs"):
        for f in files:
            if os.stat(os.path.join(root, f)).st_mode & stat.S_IXUSR:
                return False
    return True
