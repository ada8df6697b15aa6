"""#31: downloads honour HTTPS_PROXY the way the image store does: https goes through the proxy with CONNECT and
TLS is end to end (the certificate checked for the release host, not the proxy); NO_PROXY bypasses it. The
release host is a name only the proxy here knows (it tunnels to the loopback server), so a download that did not
use the proxy could not reach it at all."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
from driverhub import PROXIED_HOST, Provider, plugin_binary, publish

from vz_core import _install
from vz_core.errors import UnavailableError

LOOKED_UP: list[object] = []


class _Tunnel(socketserver.BaseRequestHandler):
    target_port = 0
    asked: list[str] = []

    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            data += chunk
        line = data.split(b"\r\n", 1)[0].decode()
        self.asked.append(line)
        method, authority, _ = line.split(" ", 2)
        if method != "CONNECT" or authority.rsplit(":", 1)[0] != PROXIED_HOST:
            self.request.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while chunk := src.recv(65536):
                    dst.sendall(chunk)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        back = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
        back.start()
        pump(self.request, upstream)
        back.join(10)
        upstream.close()


@pytest.fixture
def proxy(provider: Provider, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    asked: list[str] = []
    handler = type("Tunnel", (_Tunnel,), {"target_port": int(provider.hub.base.rsplit(":", 1)[1]), "asked": asked})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in ("NO_PROXY", "no_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{server.server_address[1]}")
    # Resolving the release host is answered here (no query leaves this process) and refused: only the proxy
    # knows it.
    LOOKED_UP.clear()
    resolve = socket.getaddrinfo

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        if host == PROXIED_HOST:
            LOOKED_UP.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "not known")
        return resolve(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        yield asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_download_goes_through_the_https_proxy(provider: Provider, proxy: list[str]) -> None:
    p = provider
    port = p.hub.base.rsplit(":", 1)[1]
    publish(p.hub, plugin_binary(), p.key)
    url = f"https://{PROXIED_HOST}:{port}/acme/manifest.json"
    row = _install.add_url(url, store=p.store, roots=p.roots)
    assert row["status"] == "added" and row["provenance"]["source"] == url
    assert len(proxy) == 2 and LOOKED_UP == []  # the manifest, then the binary; the name never resolved here
    assert all(line.startswith(f"CONNECT {PROXIED_HOST}:{port} HTTP/1.") for line in proxy)
    assert p.hub.fetched("/acme/acme-bin") == 1


def test_no_proxy_bypasses_it(provider: Provider, proxy: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    p = provider
    port = p.hub.base.rsplit(":", 1)[1]
    publish(p.hub, plugin_binary(), p.key)
    monkeypatch.setenv("NO_PROXY", PROXIED_HOST)
    with pytest.raises(UnavailableError, match=f"cannot fetch manifest https://{PROXIED_HOST}"):
        _install.add_url(f"https://{PROXIED_HOST}:{port}/acme/manifest.json", store=p.store, roots=p.roots)
    assert proxy == [] and LOOKED_UP == [PROXIED_HOST]  # it went direct (and the name is known nowhere)
