"""Docker contexts for Machines' engines, written into the docker CLI's own context store.

The CLI keeps one directory per context under ``<config>/contexts/meta/<sha256 of the name>/`` holding
``meta.json``: ``{"Name": ..., "Metadata": {...}, "Endpoints": {"docker": {"Host": ..., "SkipTLSVerify":
false}}}``; TLS material, if any, lives under ``<config>/contexts/tls/<same id>/``. ``<config>`` is
``$DOCKER_CONFIG``, else ``~/.docker``. This module writes and removes entries the way the CLI's store does
(docker/cli ``cli/context/store/metadatastore.go``: directories 0755, ``meta.json`` 0644, the id is the hex
SHA-256 of the name) and never touches ``config.json`` (so not the current context) nor ``DOCKER_HOST``.

An entry vz writes carries ``"vz": true`` in its metadata; vz refuses to replace or remove a context of the
same name that it did not write.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vz_core.errors import FailedPreconditionError, InvalidArgumentError

__all__ = [
    "VzContext",
    "context_id",
    "context_name",
    "docker_config_dir",
    "read_context",
    "remove_context",
    "write_context",
]

_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.+-]+")
"""The CLI's rule for context names (docker/cli ``cli/command/context/create.go``)."""


@dataclass(frozen=True)
class VzContext:
    """A context vz wrote: its name, the engine socket it points at and its description."""

    name: str
    socket: Path
    description: str


def context_name(environment: str, machine: str) -> str:
    """``vz-<environment>-<machine>``, checked against the CLI's naming rule."""
    name = f"vz-{environment}-{machine}"
    if not _NAME_RE.fullmatch(name):
        raise InvalidArgumentError(
            f"{name!r} cannot be a Docker context name (letters, digits, '_', '.', '+', '-'); rename the "
            "Environment or the Machine"
        )
    return name


def docker_config_dir(environ: Mapping[str, str]) -> Path:
    """Where the docker CLI keeps its configuration: ``$DOCKER_CONFIG``, else ``~/.docker``."""
    configured = environ.get("DOCKER_CONFIG", "")
    if configured:
        return Path(configured)
    home = environ.get("HOME", "") or str(Path.home())
    return Path(home) / ".docker"


def context_id(name: str) -> str:
    """The directory name the CLI gives a context: the hex SHA-256 of its name."""
    return hashlib.sha256(name.encode()).hexdigest()


def _meta_dir(environ: Mapping[str, str], name: str) -> Path:
    return docker_config_dir(environ) / "contexts" / "meta" / context_id(name)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FailedPreconditionError(
            f"the Docker context file {path} cannot be read ({exc}); fix or remove it"
        ) from exc
    return doc if isinstance(doc, dict) else {}


def _ours(doc: Mapping[str, Any]) -> bool:
    meta = doc.get("Metadata")
    return isinstance(meta, dict) and meta.get("vz") is True


def read_context(name: str, environ: Mapping[str, str]) -> VzContext | None:
    """The context ``name`` if vz wrote it, else None (absent, or someone else's)."""
    doc = _load(_meta_dir(environ, name) / "meta.json")
    if doc is None or not _ours(doc):
        return None
    endpoint = doc.get("Endpoints", {}).get("docker", {})
    host = str(endpoint.get("Host", "")) if isinstance(endpoint, dict) else ""
    return VzContext(name, Path(host.removeprefix("unix://")), str(doc["Metadata"].get("Description", "")))


def write_context(name: str, socket: Path, description: str, environ: Mapping[str, str]) -> VzContext:
    """Create or update the context ``name`` pointing at the Unix socket ``socket``.

    Refuses (FailedPreconditionError, before writing anything) when a context of that name exists that vz did
    not write.
    """
    if not _NAME_RE.fullmatch(name):
        raise InvalidArgumentError(f"{name!r} is not a Docker context name (letters, digits, '_', '.', '+', '-')")
    if not socket.is_absolute():
        raise InvalidArgumentError(f"the engine socket {socket} must be an absolute path")
    directory = _meta_dir(environ, name)
    existing = _load(directory / "meta.json")
    if existing is not None and not _ours(existing):
        raise FailedPreconditionError(
            f"a Docker context named {name!r} exists and was not created by vz; remove it with "
            f"`docker context rm {name}` or rename the Environment"
        )
    doc = {
        "Name": name,
        "Metadata": {"Description": description, "vz": True},
        "Endpoints": {"docker": {"Host": f"unix://{socket}", "SkipTLSVerify": False}},
    }
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".meta.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, separators=(",", ":"))
        os.chmod(tmp, 0o644)
        os.replace(tmp, directory / "meta.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return VzContext(name, socket, description)


def remove_context(name: str, environ: Mapping[str, str]) -> bool:
    """Remove the context ``name`` (metadata and TLS directories) if vz wrote it; True when it removed one."""
    directory = _meta_dir(environ, name)
    doc = _load(directory / "meta.json")
    if doc is None or not _ours(doc):
        return False
    shutil.rmtree(directory)
    shutil.rmtree(docker_config_dir(environ) / "contexts" / "tls" / context_id(name), ignore_errors=True)
    return True
