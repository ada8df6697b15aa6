"""#14 item 8: names as users write them resolve through the user's Docker configuration, on loopback only.

The module's registry (Debian's docker-registry on loopback) is configured as the Docker Hub mirror in a
daemon.json the test writes, so `alpine`-style names resolve with no internet; credentials come from
config.json (`auths`) or from a credential helper script the test writes.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from images_testlib import Proxy

from vz_core.errors import PermissionDeniedError, UnavailableError
from vz_drivers._images import ImageConfig, ImageStore, build_oci_layout
from vz_drivers._images._dockerconfig import DockerConfig

Pusher = Callable[[Path, str, str], str]


def _push(tmp_path: Path, pusher: Pusher, repo: str, tag: str) -> str:
    layer = tmp_path / "layer"
    (layer / "etc").mkdir(parents=True)
    (layer / "etc" / "hello").write_text(repo + "\n")
    layout = tmp_path / "layout"
    build_oci_layout(layout, [layer], config=ImageConfig(cmd=("/bin/sh",)), tag=tag, architecture="amd64")
    return pusher(layout, repo, tag)


def _docker(tmp_path: Path, *, mirrors: list[str], config: dict[str, object] | None = None) -> DockerConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    daemon = tmp_path / "daemon.json"
    daemon.write_text(json.dumps({"registry-mirrors": mirrors}))
    cfg = tmp_path / "docker" / "config.json"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(json.dumps(config or {}))
    return DockerConfig(config_path=cfg, daemon_path=daemon)


async def test_hub_names_resolve_through_the_configured_mirror(tmp_path: Path, registry: str, pusher: Pusher) -> None:
    name = "vzmirror" + os.urandom(4).hex()
    digest = _push(tmp_path, pusher, f"library/{name}", "3")
    store = ImageStore(tmp_path / "store", docker_config=_docker(tmp_path, mirrors=[f"http://{registry}"]))
    for ref in (f"{name}:3", f"library/{name}:3", f"docker.io/{name}:3", f"docker.io/library/{name}@{digest}"):
        image = await store.resolve(ref)
        assert image.digest == digest, ref
    root = await store.rootfs(image)
    assert (root / "etc" / "hello").read_text() == f"library/{name}\n"


async def test_a_failing_mirror_passes_on_to_the_next(tmp_path: Path, registry: str, pusher: Pusher) -> None:
    name = "vzmirror" + os.urandom(4).hex()
    digest = _push(tmp_path, pusher, f"library/{name}", "1")
    docker = _docker(tmp_path, mirrors=["http://127.0.0.1:9", f"http://{registry}"])
    image = await ImageStore(tmp_path / "store", docker_config=docker).resolve(name + ":1")
    assert image.digest == digest


async def test_credentials_from_a_credential_helper_never_show(
    tmp_path: Path, proxy: Proxy, pusher: Pusher, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "vzhelper" + os.urandom(4).hex()
    digest = _push(tmp_path, pusher, f"library/{name}", "v1")
    secret = "helper-" + os.urandom(8).hex()
    proxy.token_required = True
    proxy.basic_credentials = ("alice", secret)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked"
    helper = bin_dir / "docker-credential-vztest"
    helper.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = get ] || exit 2\nread server\nprintf %s "$server" > {asked}\n'
        f'[ "$server" = "{proxy.host}" ] || {{ echo "credentials not found in native keychain"; exit 1; }}\n'
        f'printf \'{{"ServerURL":"%s","Username":"alice","Secret":"{secret}"}}\' "$server"\n'
    )
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    docker = _docker(tmp_path, mirrors=[f"http://{proxy.host}"], config={"credHelpers": {proxy.host: "vztest"}})
    image = await ImageStore(tmp_path / "store", docker_config=docker).resolve(f"{name}:v1")
    assert image.digest == digest
    assert asked.read_text() == proxy.host  # the server address went to the helper on stdin
    assert proxy.token_requests and all(r["authorization"].startswith("Basic ") for r in proxy.token_requests)


async def test_auths_in_config_json_and_errors_that_name_what_to_do(
    tmp_path: Path, proxy: Proxy, pusher: Pusher, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = "team/auths" + os.urandom(4).hex()
    digest = _push(tmp_path, pusher, repo, "v1")
    proxy.basic_credentials = ("bob", "auths-pass")
    proxy.token_required = True
    good = base64.b64encode(b"bob:auths-pass").decode()
    docker = _docker(tmp_path / "good", mirrors=[], config={"auths": {f"http://{proxy.host}/v1/": {"auth": good}}})
    assert (await ImageStore(tmp_path / "s1", docker_config=docker).resolve(f"{proxy.host}/{repo}:v1")).digest == digest

    bad = base64.b64encode(b"bob:wrong-pass").decode()
    docker = _docker(tmp_path / "bad", mirrors=[], config={"auths": {proxy.host: {"auth": bad}}})
    with pytest.raises(PermissionDeniedError) as info:
        await ImageStore(tmp_path / "s2", docker_config=docker).resolve(f"{proxy.host}/{repo}:v1")
    text = str(info.value)
    assert proxy.host in text and "credentials" in text and "wrong-pass" not in text

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    docker = _docker(tmp_path / "nohelper", mirrors=[], config={"credsStore": "vz-missing"})
    with pytest.raises(UnavailableError) as err:
        await ImageStore(tmp_path / "s3", docker_config=docker).resolve(f"{proxy.host}/{repo}:v1")
    assert "docker-credential-vz-missing" in str(err.value) and proxy.host in str(err.value)


def test_docker_hub_keys_of_config_json_are_read_for_every_hub_name(tmp_path: Path) -> None:
    auth = base64.b64encode(b"hub-user:hub-pass").decode()
    docker = _docker(tmp_path, mirrors=[], config={"auths": {"https://index.docker.io/v1/": {"auth": auth}}})
    for host in ("docker.io", "registry-1.docker.io", "index.docker.io"):
        assert docker.credentials(host) == ("hub-user", "hub-pass")
    assert docker.credentials("ghcr.io") is None
    assert "hub-pass" not in repr(docker)


async def test_http_proxy_from_the_environment_carries_requests_and_no_proxy_bypasses_it(
    tmp_path: Path, registry: str, pusher: Pusher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward proxy on loopback is the only way to reach `registry.vz-test` (a name no resolver knows)."""
    import http.server
    import threading
    import urllib.request

    repo = "team/proxied" + os.urandom(4).hex()
    digest = _push(tmp_path, pusher, repo, "v1")
    seen: list[tuple[str, str]] = []
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the forwarder itself goes direct

    class Forward(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Proxy-Authorization", "")))
            url = self.path.replace("http://registry.vz-test:5000", f"http://{registry}")
            req = urllib.request.Request(url, headers={k: v for k, v in self.headers.items() if k.lower() == "accept"})
            try:
                with direct.open(req, timeout=10) as resp:
                    body, status, headers = resp.read(), resp.status, dict(resp.headers)
            except urllib.error.HTTPError as exc:
                body, status, headers = exc.read(), exc.code, dict(exc.headers)
            self.send_response(status)
            for name in ("Content-Type", "Docker-Content-Digest"):
                if name in headers:
                    self.send_header(name, headers[name])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://puser:ppass@127.0.0.1:{server.server_address[1]}")
        docker = _docker(tmp_path, mirrors=[])
        store = ImageStore(tmp_path / "s", insecure_registries=["registry.vz-test:5000"], docker_config=docker)
        assert (await store.resolve(f"registry.vz-test:5000/{repo}:v1")).digest == digest
        assert seen and all(p.startswith("http://registry.vz-test:5000/v2/") for p, _ in seen)
        assert {a for _, a in seen} == {"Basic " + base64.b64encode(b"puser:ppass").decode()}
        monkeypatch.setenv("NO_PROXY", "registry.vz-test")
        with pytest.raises(UnavailableError):
            await ImageStore(
                tmp_path / "s2", insecure_registries=["registry.vz-test:5000"], docker_config=docker
            ).resolve(f"registry.vz-test:5000/{repo}:v1")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
