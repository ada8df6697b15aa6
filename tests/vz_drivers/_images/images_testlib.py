"""Helpers for the image store tests: hand-made tar layers, store snapshots, a distribution-API pusher and a
loopback proxy that counts requests, demands bearer tokens, or corrupts blobs."""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import http.client
import io
import json
import os
import secrets
import socket
import tarfile
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# -- tar building --------------------------------------------------------------------------------------------


@dataclass
class Entry:
    """One tar member for hand-made layers."""

    name: str
    kind: bytes = tarfile.REGTYPE
    data: bytes = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    linkname: str = ""
    mtime: int = 1_600_000_000
    devmajor: int = 0
    devminor: int = 0


def make_tar(entries: list[Entry]) -> bytes:
    """An uncompressed tar of ``entries`` in the given order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type = e.kind
            info.mode = e.mode
            info.uid, info.gid = e.uid, e.gid
            info.linkname = e.linkname
            info.mtime = e.mtime
            info.devmajor, info.devminor = e.devmajor, e.devminor
            info.size = len(e.data) if e.kind == tarfile.REGTYPE else 0
            tf.addfile(info, io.BytesIO(e.data) if e.kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def store_snapshot(root: Path) -> dict[str, int]:
    """Every file and directory under ``root`` (relative path -> size), lock files excluded."""
    out: dict[str, int] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if rel.startswith("locks"):
                continue
            out[rel] = path.lstat().st_size if name in filenames else -1
    return out


# -- pushing with the distribution API ------------------------------------------------------------------------


def _request(
    host: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection(host, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def push_blob(host: str, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    resp = _request(host, "POST", f"/v2/{repo}/blobs/uploads/")
    assert resp.status == 202, resp.status
    location = resp.getheader("Location") or ""
    parsed = location.split(host, 1)[-1] if "://" in location else location
    sep = "&" if "?" in parsed else "?"
    resp = _request(
        host,
        "PUT",
        f"{parsed}{sep}digest={digest}",
        data,
        {"Content-Type": "application/octet-stream", "Content-Length": str(len(data))},
    )
    assert resp.status == 201, resp.status
    return digest


def push_manifest(host: str, repo: str, reference: str, data: bytes, media_type: str) -> None:
    resp = _request(host, "PUT", f"/v2/{repo}/manifests/{reference}", data, {"Content-Type": media_type})
    assert resp.status == 201, resp.status


def push_layout(host: str, layout: Path, repo: str, tag: str) -> str:
    """Push the image tagged ``tag`` in an OCI layout (single image or index) to ``host``; return its digest."""
    index = json.loads((layout / "index.json").read_bytes())
    desc = next(
        m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag
    )

    def blob(digest: str) -> bytes:
        return (layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()

    def push_image(manifest_digest: str, reference: str) -> None:
        data = blob(manifest_digest)
        doc = json.loads(data)
        if "manifests" in doc:
            for child in doc["manifests"]:
                push_image(child["digest"], child["digest"])
        else:
            for d in [doc["config"], *doc["layers"]]:
                push_blob(host, repo, blob(d["digest"]))
        push_manifest(host, repo, reference, data, doc["mediaType"])

    push_image(desc["digest"], tag)
    return str(desc["digest"])


# -- a proxy that counts, requires tokens, or corrupts ---------------------------------------------------------


@dataclass
class Proxy:
    """A loopback HTTP proxy in front of a registry. Configure it per test through its attributes."""

    upstream: str
    host: str = ""
    token_required: bool = False
    basic_credentials: tuple[str, str] | None = None
    corrupt_digests: set[str] = field(default_factory=set)
    manifest_override: bytes | None = None
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    token_requests: list[dict[str, str]] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    redirect_blobs_to: str | None = None
    authorization_seen: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def blob_gets(self) -> dict[str, int]:
        with self.lock:
            return {k.split("/blobs/", 1)[1]: v for k, v in self.counts.items() if "/blobs/" in k}

    def manifest_gets(self) -> int:
        with self.lock:
            return sum(v for k, v in self.counts.items() if "/manifests/" in k)


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/token":
                self._token()
                return
            with proxy.lock:
                proxy.counts[f"GET {path}"] += 1
                proxy.authorization_seen.append((path, self.headers.get("Authorization", "")))
            if proxy.redirect_blobs_to and "/blobs/" in path:
                self._send(307, b"", {"Location": f"http://{proxy.redirect_blobs_to}{self.path}"})
                return
            if proxy.token_required:
                auth = self.headers.get("Authorization", "")
                if not (auth.startswith("Bearer ") and auth[7:] in proxy.tokens):
                    repo = path.removeprefix("/v2/").split("/manifests/")[0].split("/blobs/")[0]
                    challenge = f'Bearer realm="http://{proxy.host}/token",service="vz-test"' + (
                        f',scope="repository:{repo}:pull"' if repo else ""
                    )
                    self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": challenge})
                    return
            conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept",)}
                conn.request("GET", self.path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                out_headers = {
                    k: v
                    for k, v in resp.getheaders()
                    if k.lower() in ("content-type", "docker-content-digest", "location")
                }
            finally:
                conn.close()
            if "/manifests/" in path and proxy.manifest_override is not None and resp.status == 200:
                body = proxy.manifest_override
            for digest in proxy.corrupt_digests:
                if path.endswith(f"/blobs/{digest}") and body:
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
            self._send(resp.status, body, out_headers)

        def _token(self) -> None:
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            auth = self.headers.get("Authorization", "")
            with proxy.lock:
                proxy.token_requests.append({"scope": query.get("scope", ""), "authorization": auth})
            if proxy.basic_credentials is not None:
                expected = "Basic " + base64.b64encode(":".join(proxy.basic_credentials).encode()).decode()
                if auth != expected:
                    self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
                    return
            token = secrets.token_hex(8)
            with proxy.lock:
                proxy.tokens.add(token)
            self._send(200, json.dumps({"token": token}).encode(), {"Content-Type": "application/json"})

    return Handler


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port with nothing listening on it (bound, not listening, for the block)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@contextlib.contextmanager
def serve_proxy(upstream: str) -> Iterator[Proxy]:
    """Run a Proxy in front of ``upstream`` on 127.0.0.1 for the block."""
    state = Proxy(upstream=upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.host = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="registry-proxy", daemon=True
    )
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
