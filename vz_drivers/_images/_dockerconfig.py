"""The user's Docker configuration: registry credentials and Docker Hub mirrors, read the way Docker reads them.

* Credentials: ``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``): ``credHelpers`` (per
  registry) first, then ``credsStore`` (all registries), through ``docker-credential-<name> get`` (the server
  address on stdin, ``{"Username", "Secret"}`` on stdout), then ``auths`` (base64 ``user:password`` in
  ``auth``, or ``username``/``password``). Docker Hub's key is ``https://index.docker.io/v1/``; ``docker.io``,
  ``index.docker.io`` and ``registry-1.docker.io`` are accepted for it too.
* Mirrors of Docker Hub: ``registry-mirrors`` of the daemon configuration (``/etc/docker/daemon.json``;
  ``VZ_DOCKER_DAEMON_CONFIG`` names another file), tried in order before Docker Hub itself.

Nothing read here is logged or put in an error: messages name the file, the registry and the helper only.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vz_core.errors import PermissionDeniedError, UnavailableError
from vz_drivers._images._reference import DOCKER_HUB

__all__ = ["DockerConfig", "daemon_config_path", "docker_config_path"]

HUB_KEY = "https://index.docker.io/v1/"
_HUB_NAMES = {DOCKER_HUB, "index.docker.io", "registry-1.docker.io", HUB_KEY}
_HELPER_TIMEOUT = 30.0


def docker_config_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("DOCKER_CONFIG")
    return Path(base) / "config.json" if base else Path.home() / ".docker" / "config.json"


def daemon_config_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("VZ_DOCKER_DAEMON_CONFIG") or "/etc/docker/daemon.json")


def _registry_key(name: str) -> str:
    """``host[:port]`` of a config key (``https://host/v1/`` and bare hosts alike); Docker Hub -> docker.io."""
    text = name.strip()
    text = urllib.parse.urlsplit(text).netloc if "://" in text else text.split("/", 1)[0]
    text = text.lower()
    return DOCKER_HUB if text in _HUB_NAMES or text + "/" in _HUB_NAMES else text


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UnavailableError(
            f"the Docker configuration {path} cannot be read ({type(exc).__name__}); fix or remove it"
        ) from None
    return data if isinstance(data, dict) else {}


@dataclass
class DockerConfig:
    """Credentials and mirrors from the user's Docker configuration (read once, at construction)."""

    config_path: Path = field(default_factory=docker_config_path)
    daemon_path: Path = field(default_factory=daemon_config_path)

    def __post_init__(self) -> None:
        self._config = _read_json(self.config_path)
        daemon = _read_json(self.daemon_path)
        mirrors = daemon.get("registry-mirrors") or []
        self.mirrors: tuple[str, ...] = tuple(
            m for m in (_mirror_host(str(x)) for x in mirrors if isinstance(x, str)) if m
        )
        """Docker Hub mirrors as ``host[:port]``, in the daemon configuration's order."""

    def credentials(self, registry: str) -> tuple[str, str] | None:
        """``(username, secret)`` for ``registry`` (``host[:port]``; Docker Hub as any of its names), or None."""
        want = _registry_key(registry)
        helpers = self._config.get("credHelpers") or {}
        helper = None
        if isinstance(helpers, dict):
            helper = next((h for k, h in helpers.items() if _registry_key(str(k)) == want), None)
        helper = helper or self._config.get("credsStore")
        if isinstance(helper, str) and helper:
            found = self._from_helper(helper, want)
            if found is not None:
                return found
        auths = self._config.get("auths") or {}
        if not isinstance(auths, dict):
            return None
        for key, entry in auths.items():
            if _registry_key(str(key)) != want or not isinstance(entry, dict):
                continue
            if isinstance(entry.get("auth"), str) and entry["auth"]:
                try:
                    user, sep, secret = base64.b64decode(entry["auth"]).decode().partition(":")
                except ValueError:
                    raise UnavailableError(
                        f"the auths entry for {key} in {self.config_path} is not valid base64 'user:password'; "
                        "log in again (`docker login`)"
                    ) from None
                if sep:
                    return user, secret
            if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
                return entry["username"], entry["password"]
        return None

    def _from_helper(self, helper: str, registry: str) -> tuple[str, str] | None:
        program = f"docker-credential-{helper}"
        server = HUB_KEY if registry == DOCKER_HUB else registry
        try:
            proc = subprocess.run(
                [program, "get"], input=server.encode(), capture_output=True, timeout=_HELPER_TIMEOUT, check=False
            )
        except FileNotFoundError:
            raise UnavailableError(
                f"{self.config_path} names the credential helper {helper!r} for {registry}, but {program} is not "
                "on PATH; install it or remove it from the Docker configuration"
            ) from None
        except subprocess.TimeoutExpired:
            raise UnavailableError(f"the credential helper {program} did not answer for {registry} in time") from None
        if proc.returncode != 0:
            # Helpers answer "credentials not found in native keychain" (exit 1) for unknown servers.
            if b"not found" in proc.stdout.lower() or b"not found" in proc.stderr.lower():
                return None
            raise PermissionDeniedError(
                f"the credential helper {program} failed for {registry} (exit {proc.returncode}); check it with "
                f"`echo {server} | {program} get`"
            )
        try:
            data = json.loads(proc.stdout)
            return str(data["Username"]), str(data["Secret"])
        except (ValueError, KeyError, TypeError):
            raise UnavailableError(
                f"the credential helper {program} answered for {registry} with something that is not "
                '{"Username", "Secret"} JSON'
            ) from None


def _mirror_host(url: str) -> str:
    parts = urllib.parse.urlsplit(url if "://" in url else "https://" + url)
    return parts.netloc
