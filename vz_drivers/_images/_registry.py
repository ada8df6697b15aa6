"""A minimal client of the OCI distribution API (pull only), on the standard library's ``http.client``.

Blocking calls; the store runs them in worker threads. Scheme: https, except for loopback hosts
(``localhost``, 127.0.0.0/8, ``::1``) and hosts named in ``insecure_registries``, which are probed with plain
http first and use it unless the host answers as a TLS server. Auth: anonymous first; on a 401 challenge,
``Bearer realm=,service=,scope=`` fetches a token (with basic credentials when configured for that host) and
``Basic`` uses the configured credentials. Credentials and tokens never appear in logs or errors, and an
``Authorization`` header is never forwarded to another host on a redirect.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import re
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from vz_core.errors import (
    DriverError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RuntimeFailureError,
    UnavailableError,
)
from vz_drivers._images._reference import DOCKER_HUB, RegistryRef, is_loopback_host

__all__ = ["MANIFEST_ACCEPT", "BlobSink", "Credentials", "RegistryClient", "RegistryManifest"]

_log = logging.getLogger("vz.images")
_T = TypeVar("_T")

MANIFEST_ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
MAX_MANIFEST = 4 << 20
_MAX_TOKEN = 1 << 20
_MAX_REDIRECTS = 5
_CHUNK = 1 << 20
_USER_AGENT = "vz-image-store/1"
_PARAM_RE = re.compile(r'([A-Za-z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))')

Credentials = Callable[[str], tuple[str, str] | None]
"""Looks up ``(username, password)`` for a registry host (``host[:port]``)."""


class BlobSink(Protocol):
    """Where a blob download writes (a hashing file wrapper in the store)."""

    def write(self, data: bytes, /) -> int: ...


@dataclass(frozen=True)
class RegistryManifest:
    """A manifest as served: raw bytes, media type (``Content-Type`` or the document's ``mediaType``)."""

    data: bytes
    media_type: str
    served_digest: str | None


def _proxy_for(scheme: str, host: str) -> tuple[str, int, dict[str, str]] | None:
    """The proxy (host, port, headers) the standard environment names for ``scheme`` to ``host``, if any.

    ``HTTPS_PROXY``/``HTTP_PROXY`` (either case) name it; ``NO_PROXY`` and loopback hosts go direct. Proxy
    credentials in the URL become a ``Proxy-Authorization`` header (never logged).
    """
    if is_loopback_host(host):
        return None
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme)
    if not url or urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]
        return None
    parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    if not parts.hostname:
        return None
    headers = {}
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), headers


class _ProxiedHTTPConnection(http.client.HTTPConnection):
    """Plain http through a forward proxy: absolute-URI requests, plus the proxy's own headers."""

    proxy_headers: dict[str, str] = {}

    def putrequest(self, method: str, url: str, skip_host: bool = False, skip_accept_encoding: bool = False) -> None:
        super().putrequest(method, url, skip_host=True, skip_accept_encoding=skip_accept_encoding)
        self.putheader("Host", urllib.parse.urlsplit(url).netloc)
        for name, value in self.proxy_headers.items():
            self.putheader(name, value)


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    params = {
        m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _PARAM_RE.finditer(rest)
    }
    return scheme.lower(), params


def _redact(url: str) -> str:
    """A URL without query or userinfo (redirect targets often carry signatures in the query)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _error_codes(body: bytes) -> str:
    try:
        errors = json.loads(body).get("errors") or []
        codes = [str(e.get("code")) for e in errors if isinstance(e, dict) and e.get("code")]
    except (ValueError, AttributeError):
        return ""
    return f" ({', '.join(codes)})" if codes else ""


class RegistryClient:
    """Pulls manifests and blobs from registries. Thread-safe; one instance per store."""

    def __init__(
        self,
        *,
        insecure_registries: frozenset[str],
        credentials: Credentials,
        timeout: float,
        mirrors: Callable[[], tuple[str, ...]] = tuple,
    ) -> None:
        self._mirrors = mirrors
        self._insecure = insecure_registries
        self._credentials = credentials
        self._timeout = timeout
        self._lock = threading.Lock()
        self._schemes: dict[str, str] = {}
        self._auth: dict[tuple[str, str], str] = {}

    # -- policy -------------------------------------------------------------------------------------------
    def _insecure_listed(self, host: str) -> bool:
        hostname = urllib.parse.urlsplit(f"//{host}").hostname or host
        return host in self._insecure or hostname in self._insecure

    def plain_http_allowed(self, host: str) -> bool:
        """Whether plain http may be used for ``host[:port]`` (loopback, or listed as insecure)."""
        hostname = urllib.parse.urlsplit(f"//{host}").hostname or host
        return is_loopback_host(hostname) or self._insecure_listed(host)

    # -- transport ----------------------------------------------------------------------------------------
    def _connect(self, url: str) -> tuple[http.client.HTTPConnection, str]:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            context = ssl.create_default_context()
            if self._insecure_listed(parts.netloc):
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            proxy = _proxy_for("https", host)
            if proxy is None:
                conn = http.client.HTTPSConnection(host, parts.port, timeout=self._timeout, context=context)
            else:
                # CONNECT through the proxy; TLS (and its checks) end to end with the registry.
                conn = http.client.HTTPSConnection(proxy[0], proxy[1], timeout=self._timeout, context=context)
                conn.set_tunnel(host, parts.port or 443, headers=proxy[2])
        elif parts.scheme == "http":
            if not self.plain_http_allowed(parts.netloc):
                raise PermissionDeniedError(
                    f"refusing plain http to {parts.netloc}: only loopback hosts and hosts listed in "
                    "insecure_registries may be reached without TLS"
                )
            proxy = _proxy_for("http", host)
            if proxy is None:
                conn = http.client.HTTPConnection(host, parts.port, timeout=self._timeout)
            else:
                conn = _ProxiedHTTPConnection(proxy[0], proxy[1], timeout=self._timeout)
                conn.proxy_headers = proxy[2]
                target = f"http://{parts.netloc}{target or '/'}"
        else:
            raise RuntimeFailureError(f"the registry sent an unusable URL scheme {parts.scheme!r}")
        return conn, target or "/"

    def _send(
        self, url: str, headers: Mapping[str, str], *, what: str
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
        """GET ``url`` following redirects; ``Authorization`` only goes to the original host."""
        origin = urllib.parse.urlsplit(url).netloc
        current = url
        for _ in range(_MAX_REDIRECTS + 1):
            conn, target = self._connect(current)
            send_headers = dict(headers)
            if urllib.parse.urlsplit(current).netloc != origin:
                send_headers.pop("Authorization", None)
            try:
                conn.request("GET", target, headers=send_headers)
                resp = conn.getresponse()
            except ssl.SSLCertVerificationError as exc:
                conn.close()
                raise UnavailableError(
                    f"TLS verification failed for {_redact(current)} while fetching {what}: {exc.verify_message}; "
                    "fix the certificate or list the host in insecure_registries"
                ) from None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise UnavailableError(
                    f"registry {origin} is unreachable ({_redact(current)}: {exc}) while fetching {what}; "
                    "check that it is running and reachable"
                ) from None
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location")
                resp.read()
                conn.close()
                if not location:
                    raise RuntimeFailureError(f"registry {origin} sent a redirect without Location for {what}")
                nxt = urllib.parse.urljoin(current, location)
                if urllib.parse.urlsplit(current).scheme == "https" and not nxt.startswith("https:"):
                    nxt_host = urllib.parse.urlsplit(nxt).netloc
                    if not self.plain_http_allowed(nxt_host):
                        raise PermissionDeniedError(f"registry {origin} redirected {what} from https to plain http")
                current = nxt
                continue
            return conn, resp, current
        raise RuntimeFailureError(f"registry {origin} redirected {what} more than {_MAX_REDIRECTS} times")

    def _base(self, host: str) -> str:
        with self._lock:
            scheme = self._schemes.get(host)
        if scheme is None:
            scheme = self._probe(host)
            with self._lock:
                self._schemes[host] = scheme
        return f"{scheme}://{host}"

    def _probe(self, host: str) -> str:
        if not self.plain_http_allowed(host):
            return "https"
        conn, target = self._connect(f"http://{host}/v2/")
        try:
            conn.request("GET", target, headers={"User-Agent": _USER_AGENT})
            resp = conn.getresponse()
            body = resp.read(4096)
        except ConnectionRefusedError as exc:
            raise UnavailableError(
                f"registry {host} is unreachable ({exc}); check that it is running and listening"
            ) from None
        except (OSError, http.client.HTTPException):
            return "https"  # a TLS server hangs up on plain http
        finally:
            conn.close()
        if resp.status == 400 and b"HTTPS" in body:
            return "https"
        return "http"

    # -- auth ---------------------------------------------------------------------------------------------
    def _authenticate(self, ref: RegistryRef, challenge: str, scope: str) -> None:
        scheme, params = _parse_challenge(challenge)
        creds = self._credentials(ref.host)
        if scheme == "basic":
            if creds is None:
                raise PermissionDeniedError(
                    f"registry {ref.host} requires credentials for {ref.repository}; pass credentials for {ref.host} "
                    f"(`docker login {ref.host}`, or a credential helper in the Docker configuration)"
                )
            value = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        elif scheme == "bearer":
            value = "Bearer " + self._fetch_token(ref, params, scope, creds)
        else:
            raise PermissionDeniedError(
                f"registry {ref.host} asked for unsupported authentication {scheme or '(none)'!r} for {ref.repository}"
            )
        with self._lock:
            self._auth[(ref.host, scope)] = value

    def _fetch_token(
        self, ref: RegistryRef, params: Mapping[str, str], scope: str, creds: tuple[str, str] | None
    ) -> str:
        realm = params.get("realm", "")
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PermissionDeniedError(f"registry {ref.host} sent a bearer challenge without a usable realm URL")
        if parts.scheme == "http" and not self.plain_http_allowed(parts.netloc):
            raise PermissionDeniedError(
                f"registry {ref.host} points at a token service over plain http ({_redact(realm)}); refusing"
            )
        query = [("service", params["service"])] if params.get("service") else []
        query.append(("scope", params.get("scope") or scope))
        sep = "&" if parts.query else "?"
        url = realm + sep + urllib.parse.urlencode(query)
        headers = {"User-Agent": _USER_AGENT}
        if creds is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        conn, resp, _ = self._send(url, headers, what=f"a token for {ref.repository}")
        try:
            body = resp.read(_MAX_TOKEN + 1)
        finally:
            conn.close()
        if resp.status in (401, 403):
            raise PermissionDeniedError(
                f"the token service of {ref.host} refused access to {ref.repository} (HTTP {resp.status}); "
                f"check the credentials for {ref.host}"
            )
        if resp.status != 200 or len(body) > _MAX_TOKEN:
            raise UnavailableError(f"the token service of {ref.host} answered HTTP {resp.status}; retry later")
        try:
            doc = json.loads(body)
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise RuntimeFailureError(f"the token service of {ref.host} returned no token")
        return token

    # -- requests -----------------------------------------------------------------------------------------
    def _get(
        self, ref: RegistryRef, path: str, *, accept: str, what: str
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        scope = f"repository:{ref.repository}:pull"
        url = self._base(ref.host) + path
        for attempt in range(2):
            headers = {"User-Agent": _USER_AGENT, "Accept": accept}
            with self._lock:
                auth = self._auth.get((ref.host, scope))
            if auth:
                headers["Authorization"] = auth
            conn, resp, _ = self._send(url, headers, what=what)
            if resp.status == 401 and attempt == 0:
                challenge = resp.getheader("WWW-Authenticate") or ""
                resp.read()
                conn.close()
                self._authenticate(ref, challenge, scope)
                continue
            if resp.status == 200:
                return conn, resp
            body = resp.read(65536)
            conn.close()
            raise self._status_error(ref, resp.status, body, what)
        raise AssertionError("unreachable")

    def _status_error(self, ref: RegistryRef, status: int, body: bytes, what: str) -> DriverError:
        codes = _error_codes(body)
        if status == 404:
            return NotFoundError(
                f"{what} was not found in registry {ref.host} (HTTP 404{codes}); check the repository and tag",
                details={"image": str(ref)},
            )
        if status in (401, 403):
            return PermissionDeniedError(
                f"registry {ref.host} refused access to {ref.repository} (HTTP {status}{codes}); "
                f"pass valid credentials for {ref.host} (`docker login {ref.host}`, or a credential helper in the "
                "Docker configuration)",
                details={"image": str(ref)},
            )
        if status == 429 or status >= 500:
            return UnavailableError(f"registry {ref.host} answered HTTP {status}{codes} for {what}; retry later")
        if status == 400 and "manifest" in what:
            return InvalidArgumentError(f"registry {ref.host} rejected the request for {what} (HTTP 400{codes})")
        return RuntimeFailureError(f"registry {ref.host} answered HTTP {status}{codes} for {what}")

    def _endpoints(self, ref: RegistryRef) -> list[RegistryRef]:
        """Where ``ref`` is served, in order: Docker Hub's mirrors, then its endpoint; else the named host."""
        if ref.host != DOCKER_HUB:
            return [ref]
        return [replace(ref, host=h) for h in (*self._mirrors(), ref.endpoint)]

    def _first(self, ref: RegistryRef, fetch: Callable[[RegistryRef], _T]) -> _T:
        """``fetch`` from the first endpoint that answers (a mirror that fails passes on to the next one)."""
        endpoints = self._endpoints(ref)
        for endpoint in endpoints[:-1]:
            try:
                return fetch(endpoint)
            except (UnavailableError, NotFoundError, PermissionDeniedError, RuntimeFailureError) as exc:
                _log.info("mirror %s of %s failed (%s); trying the next", endpoint.host, ref.host, type(exc).__name__)
        try:
            return fetch(endpoints[-1])
        except DriverError as exc:
            if ref.host == DOCKER_HUB:
                mirrors = ", ".join(e.host for e in endpoints[:-1]) or "none configured"
                exc.message = (
                    f"{exc.message} (image {str(ref)!r}, Docker Hub at {ref.endpoint}; mirrors: {mirrors}; mirrors "
                    "come from registry-mirrors in /etc/docker/daemon.json, credentials from ~/.docker/config.json)"
                )
            raise

    def get_manifest(self, ref: RegistryRef, reference: str) -> RegistryManifest:
        """Fetch the manifest (or index) ``reference`` (tag or digest) of ``ref.repository``."""
        return self._first(ref, lambda r: self._get_manifest(r, reference))

    def fetch_blob(self, ref: RegistryRef, digest: str, size: int, out: BlobSink) -> None:
        """Stream blob ``digest`` into ``out``; refuses more than ``size`` bytes. The caller verifies the digest."""
        self._first(ref, lambda r: self._fetch_blob(r, digest, size, out))

    def _get_manifest(self, ref: RegistryRef, reference: str) -> RegistryManifest:
        what = f"manifest {ref.host}/{ref.repository}{'@' if reference.startswith('sha256:') else ':'}{reference}"
        conn, resp = self._get(ref, f"/v2/{ref.repository}/manifests/{reference}", accept=MANIFEST_ACCEPT, what=what)
        try:
            data = resp.read(MAX_MANIFEST + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise UnavailableError(f"reading {what} from {ref.host} failed: {exc}; retry") from None
        finally:
            conn.close()
        if len(data) > MAX_MANIFEST:
            raise RuntimeFailureError(f"{what} is larger than {MAX_MANIFEST} bytes; refusing it")
        media_type = (resp.getheader("Content-Type") or "").split(";", 1)[0].strip()
        return RegistryManifest(data, media_type, resp.getheader("Docker-Content-Digest"))

    def _fetch_blob(self, ref: RegistryRef, digest: str, size: int, out: BlobSink) -> None:
        what = f"blob {digest} of {ref.host}/{ref.repository}"
        conn, resp = self._get(ref, f"/v2/{ref.repository}/blobs/{digest}", accept="*/*", what=what)
        total = 0
        try:
            while chunk := resp.read(_CHUNK):
                total += len(chunk)
                if total > size:
                    raise RuntimeFailureError(
                        f"registry {ref.host} served more than the {size} bytes announced for {what}; discarded it",
                        details={"digest": digest},
                    )
                out.write(chunk)
        except (OSError, http.client.HTTPException) as exc:
            raise UnavailableError(f"downloading {what} failed after {total} bytes: {exc}; retry") from None
        finally:
            conn.close()
        _log.debug("fetched %s (%d bytes)", what, total)
