"""Downloads of driver manifests and binaries: HTTPS (plain http to loopback hosts only), limits, resume.

* **Schemes.** ``https`` anywhere; ``http`` only to a loopback host (``localhost``, ``127.0.0.0/8``, ``::1``:
  a server on this machine, e.g. a provider testing their release). Every hop of a redirect is checked the same
  way before it is connected to, so a redirect from https to plain http elsewhere is refused. A URL with
  credentials in it (``user:pass@``) is refused: vz stores the URL as provenance.
* **TLS and proxies** are read the way the image store reads them: the system CA store through
  ``ssl.create_default_context()`` (which honours ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), and ``HTTPS_PROXY`` /
  ``HTTP_PROXY`` / ``NO_PROXY`` (either case; https goes through ``CONNECT``, TLS end to end). Loopback hosts
  never go through a proxy.
* **Limits.** ``max_bytes`` (a ``Content-Length`` above it is refused before the body is read; a body growing
  past it is cut off and removed), ``timeout`` (seconds without progress: a stalled server is an error) and
  ``deadline`` (seconds for the whole transfer).
* **Resume.** A binary is downloaded to ``<dest>.part``; an interrupted download (a truncated body, a stall)
  keeps what arrived, and the next attempt asks for the rest with ``Range: bytes=N-`` (a server that answers
  ``200`` instead of ``206`` starts it over). The SHA-256 of the complete file is checked before it is renamed
  into place; a mismatch removes the partial file.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import os
import re
import ssl
import time
import urllib.parse
import urllib.request
from pathlib import Path

from vz_core.errors import TrustError, UnavailableError, UserError

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TIMEOUT",
    "check_url",
    "fetch_bytes",
    "fetch_file",
    "is_loopback_host",
    "redact_url",
]

DEFAULT_MAX_BYTES = 512 << 20
DEFAULT_TIMEOUT = 30.0
DEFAULT_DEADLINE = 900.0
_MAX_REDIRECTS = 5
_CHUNK = 1 << 16
_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def is_loopback_host(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def redact_url(url: str) -> str:
    """A URL without its query and fragment (signed download URLs carry tokens there)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def check_url(url: str, *, what: str = "URL") -> urllib.parse.SplitResult:
    """``url`` if vz may fetch it (see the module docstring); ``UserError`` / ``TrustError`` otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as exc:
        raise UserError(f"{what} {url[:200]!r} is not a URL: {exc}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise UserError(f"{what} {redact_url(url)[:200]!r} must be an https:// URL")
    if parts.username is not None or parts.password is not None:
        raise UserError(f"{what} must not carry credentials (user:password@); vz records the URL it installed from")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise TrustError(
            f"refusing plain http to {parts.hostname} ({what} {redact_url(url)}): drivers are downloaded over "
            "https; plain http is allowed only to a loopback host (a server on this machine)"
        )
    return parts


def _proxy_for(scheme: str, host: str) -> tuple[str, int] | None:
    if is_loopback_host(host):
        return None
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme)
    if not url or urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]
        return None
    parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or 80


def _connect(parts: urllib.parse.SplitResult, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    host = parts.hostname or ""
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    proxy = _proxy_for(parts.scheme, host)
    if parts.scheme == "https":
        context = ssl.create_default_context()
        if proxy is None:
            return http.client.HTTPSConnection(host, parts.port, timeout=timeout, context=context), target
        conn = http.client.HTTPSConnection(proxy[0], proxy[1], timeout=timeout, context=context)
        conn.set_tunnel(host, parts.port or 443)
        return conn, target
    if proxy is None:
        return http.client.HTTPConnection(host, parts.port, timeout=timeout), target
    return http.client.HTTPConnection(proxy[0], proxy[1], timeout=timeout), urllib.parse.urlunsplit(parts)


def _open(
    url: str, *, what: str, timeout: float, headers: dict[str, str]
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
    """GET ``url`` following redirects (each hop checked by ``check_url``); the final URL."""
    current = url
    for _ in range(_MAX_REDIRECTS + 1):
        parts = check_url(current, what=what)
        conn, target = _connect(parts, timeout)
        try:
            conn.request("GET", target, headers={"User-Agent": "vz-driver-install", **headers})
            resp = conn.getresponse()
        except ssl.SSLCertVerificationError as exc:
            conn.close()
            raise TrustError(
                f"TLS verification failed for {redact_url(current)} ({what}): {exc.verify_message}; vz trusts "
                "the system CA store (SSL_CERT_FILE names another bundle)"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise UnavailableError(f"cannot fetch {what} {redact_url(current)}: {exc}") from None
        if resp.status in (301, 302, 303, 307, 308):
            location = resp.getheader("Location") or ""
            resp.close()
            conn.close()
            if not location:
                raise UnavailableError(f"{redact_url(current)} redirected without a Location ({what})")
            current = urllib.parse.urljoin(current, location)
            continue
        return conn, resp, current
    raise UnavailableError(f"more than {_MAX_REDIRECTS} redirects fetching {what} {redact_url(url)}")


def _too_large(what: str, url: str, size: int, limit: int) -> TrustError:
    return TrustError(
        f"{what} {redact_url(url)} is {size} bytes, more than the limit of {limit} bytes; nothing was installed "
        "(--max-size raises the limit)"
    )


def fetch_bytes(url: str, *, what: str, max_bytes: int, timeout: float = DEFAULT_TIMEOUT) -> tuple[bytes, str]:
    """The body of ``url`` (at most ``max_bytes``) and the final URL after redirects."""
    conn, resp, final = _open(url, what=what, timeout=timeout, headers={})
    try:
        if resp.status != 200:
            raise UnavailableError(f"{redact_url(final)} answered HTTP {resp.status} {resp.reason} ({what})")
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise _too_large(what, final, int(length), max_bytes)
        try:
            data = resp.read(max_bytes + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise UnavailableError(f"{what} {redact_url(final)}: the transfer failed ({exc}); try again") from None
        if len(data) > max_bytes:
            raise _too_large(what, final, len(data), max_bytes)
        return data, final
    finally:
        conn.close()


def _hash_existing(part: Path) -> tuple[hashlib._Hash, int]:
    digest = hashlib.sha256()
    size = 0
    try:
        with open(part, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        pass
    return digest, size


def fetch_file(
    url: str,
    dest: Path,
    *,
    sha256: str,
    what: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    timeout: float = DEFAULT_TIMEOUT,
    deadline: float = DEFAULT_DEADLINE,
) -> str:
    """Download ``url`` to ``dest`` (resuming ``<dest>.part``), check its SHA-256, rename it into place (mode
    0600: the caller makes it executable after verifying the manifest). The final URL."""
    part = dest.with_name(dest.name + ".part")
    digest, have = _hash_existing(part)
    if have > max_bytes:
        part.unlink()
        digest, have = hashlib.sha256(), 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    conn, resp, final = _open(url, what=what, timeout=timeout, headers=headers)
    started = time.monotonic()
    try:
        if resp.status == 416 and have:  # what we have is not a prefix the server knows: start over
            resp.close()
            conn.close()
            part.unlink()
            return fetch_file(
                url, dest, sha256=sha256, what=what, max_bytes=max_bytes, timeout=timeout, deadline=deadline
            )
        if resp.status == 206 and have:
            match = _RANGE.fullmatch(resp.getheader("Content-Range") or "")
            if match is None or int(match.group(1)) != have:
                raise UnavailableError(f"{redact_url(final)} answered a range request with another range ({what})")
            mode = "ab"
        elif resp.status == 200:
            digest, have, mode = hashlib.sha256(), 0, "wb"
        else:
            raise UnavailableError(f"{redact_url(final)} answered HTTP {resp.status} {resp.reason} ({what})")
        length = resp.getheader("Content-Length")
        expected = have + int(length) if length is not None and length.isdigit() else None
        if expected is not None and expected > max_bytes:
            raise _too_large(what, final, expected, max_bytes)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, mode) as out:
            if mode == "wb":
                out.truncate(0)
            while True:
                if time.monotonic() - started > deadline:
                    raise UnavailableError(
                        f"{what} {redact_url(final)} took longer than {deadline:.0f}s; {have} bytes arrived and "
                        "were kept: run the command again to resume"
                    )
                try:
                    chunk = resp.read1(_CHUNK) if hasattr(resp, "read1") else resp.read(_CHUNK)
                except TimeoutError:
                    raise UnavailableError(
                        f"{what} {redact_url(final)} stalled: nothing arrived for {timeout:.0f}s after {have} "
                        "bytes; they were kept: run the command again to resume"
                    ) from None
                except (OSError, http.client.HTTPException) as exc:
                    raise UnavailableError(
                        f"{what} {redact_url(final)} was cut off after {have} bytes ({type(exc).__name__}); they "
                        "were kept: run the command again to resume"
                    ) from None
                if not chunk:
                    break
                have += len(chunk)
                if have > max_bytes:
                    out.close()
                    part.unlink()
                    raise _too_large(what, final, have, max_bytes)
                out.write(chunk)
                digest.update(chunk)
        if expected is not None and have != expected:
            raise UnavailableError(
                f"{what} {redact_url(final)} ended after {have} of {expected} bytes; they were kept: run the "
                "command again to resume"
            )
    finally:
        conn.close()
    actual = digest.hexdigest()
    if actual != sha256:
        part.unlink()
        raise TrustError(
            f"SHA-256 mismatch for {what} {redact_url(final)}: the manifest says {sha256}, the download has {actual}; "
            "it was removed and nothing was installed"
        )
    os.replace(part, dest)
    return final
