"""Base images: IPSW restore images pinned by SHA-256 and build, channels, and the unpinned policy.

A **base** is one macOS restore image (an ``.ipsw``), named by an immutable id (``macos-15.1-24B83``) and
identified by its SHA-256 and build. vz ships a descriptor (``bases.json`` in this package, checked against
``BasesFile`` when it is read; ``bases.schema.json`` is the same schema as JSON Schema) that maps the
**channels** ``stable`` and ``previous`` to base ids. A channel that is ``null`` has no base pinned in this
release. The host may point the driver at its own descriptor of the same schema (option ``bases_file``).

Image references a macos_vm Machine accepts (the RunImage ``image``):

* ``macos:stable`` / ``macos:previous``: the channel's base;
* ``macos:<base id>``: that base (a retired or unknown id fails, naming its replacement or the known ids);
* ``ipsw:<absolute path>@sha256:<64 hex>``: a local restore image pinned by its digest;
* ``ipsw:<absolute path>`` and ``macos:latest`` (the newest image Apple offers this host) are **unpinned**:
  refused unless the host option ``allow_unpinned`` is on, and, when ``CI=true``, unless
  ``allow_unpinned_in_ci`` is on as well.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from vz_core.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, UnavailableError

__all__ = [
    "CHANNELS",
    "BaseEntry",
    "BasesFile",
    "PinPolicy",
    "ResolvedBase",
    "load_bases",
    "resolve_base",
    "schema_text",
    "sha256_file",
    "shipped_bases_path",
]

CHANNELS = ("stable", "previous")
_BASE_ID = r"^macos-[0-9]+(\.[0-9]+){0,2}-[0-9]{2}[A-Z][0-9]{1,4}[a-z]?$"  # Rust regex: $ is the very end
_IPSW = re.compile(r"^ipsw:(?P<path>/[^@]*)(@sha256:(?P<digest>[0-9a-fA-F]{64}))?\Z")

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
BaseId = Annotated[str, StringConstraints(pattern=_BASE_ID)]
Build = Annotated[str, StringConstraints(pattern=r"^[0-9]{2}[A-Z][0-9]{1,4}[a-z]?$")]


class BaseEntry(BaseModel):
    """One pinned restore image."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+){0,2}$")]
    build: Build
    sha256: Sha256
    size: int = Field(gt=0, description="bytes of the .ipsw")
    url: Annotated[str, StringConstraints(pattern=r"^https://[^\s]+\.ipsw$")]
    status: Literal["active", "retired"] = "active"
    replacement: BaseId | None = Field(default=None, description="the base to use instead (retired bases)")
    retired_because: str = ""


class BasesFile(BaseModel):
    """The descriptor: every known base by id and the channels that point at them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1]
    bases: dict[BaseId, BaseEntry]
    channels: dict[Literal["stable", "previous"], BaseId | None]

    @model_validator(mode="after")
    def _consistent(self) -> BasesFile:
        for channel in CHANNELS:
            if channel not in self.channels:
                raise ValueError(f"channels.{channel}: missing (use null when no base is pinned)")
        for channel, base_id in self.channels.items():
            if base_id is None:
                continue
            entry = self.bases.get(base_id)
            if entry is None:
                raise ValueError(f"channels.{channel}: {base_id!r} is not among the bases")
            if entry.status != "active":
                raise ValueError(f"channels.{channel}: {base_id!r} is retired")
        for base_id, entry in self.bases.items():
            if not base_id.endswith("-" + entry.build) or not base_id.startswith(f"macos-{entry.version}-"):
                raise ValueError(f"bases.{base_id}: the id must be macos-<version>-<build> of the entry")
            if entry.status == "retired" and entry.replacement is None:
                raise ValueError(f"bases.{base_id}: a retired base names its replacement")
            if entry.replacement is not None and entry.replacement not in self.bases:
                raise ValueError(f"bases.{base_id}.replacement: {entry.replacement!r} is not among the bases")
        return self


def shipped_bases_path() -> Path:
    """The descriptor this vz release ships."""
    return Path(str(resources.files(__package__ or "vz_drivers.macos_vm").joinpath("bases.json")))


def schema_text() -> str:
    """The descriptor's JSON Schema as shipped in ``bases.schema.json``."""
    return json.dumps(BasesFile.model_json_schema(), indent=2, sort_keys=True) + "\n"


def load_bases(path: Path | None = None) -> BasesFile:
    """Read and validate a descriptor (default: the shipped one); ``UnavailableError`` naming the problem."""
    path = path or shipped_bases_path()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UnavailableError(f"the macOS base descriptor {path} cannot be read: {exc.strerror or exc}") from None
    try:
        return BasesFile.model_validate_json(raw, strict=False)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UnavailableError(
            f"the macOS base descriptor {path} is invalid at {where}: {first['msg']} ({exc.error_count()} problem(s))",
            details={"file": str(path), "field": where},
        ) from None


@dataclass(frozen=True)
class PinPolicy:
    """Whether unpinned restore images may be used (host options only: a project file cannot loosen it)."""

    allow_unpinned: bool = False
    allow_unpinned_in_ci: bool = False

    def check_unpinned(self, image: str, env: Mapping[str, str]) -> None:
        if not self.allow_unpinned:
            raise FailedPreconditionError(
                f"image {image!r} is not pinned to a SHA-256; use a channel (macos:stable, macos:previous), a base "
                "id, or ipsw:<path>@sha256:<digest>; to allow unpinned images on this host run "
                "`vz driver configure macos_vm allow_unpinned=true`",
                details={"field": "image"},
            )
        if env.get("CI", "").lower() == "true" and not self.allow_unpinned_in_ci:
            raise FailedPreconditionError(
                f"image {image!r} is not pinned and CI=true: CI runs use pinned bases only; pin it "
                "(ipsw:<path>@sha256:<digest> or a channel), or set allow_unpinned_in_ci=true on the CI host",
                details={"field": "image"},
            )


@dataclass(frozen=True)
class ResolvedBase:
    """What a Machine is made from: ``base_id`` names the installed base directory (pinned or not)."""

    base_id: str
    pinned: bool
    sha256: str = ""
    """Expected SHA-256 of the restore image ("" when unpinned: it is recorded after the download/hash)."""
    build: str = ""
    source: str = ""
    """``https://...`` (download), an absolute local path, or "latest" (ask the framework)."""
    size: int = 0


def _known(bases: BasesFile) -> str:
    active = sorted(i for i, e in bases.bases.items() if e.status == "active")
    return ", ".join(active) or "none in this descriptor"


def resolve_base(image: str, bases: BasesFile, policy: PinPolicy, env: Mapping[str, str] | None = None) -> ResolvedBase:
    """The base an image reference names, or an error saying what to use instead (nothing is touched)."""
    env = os.environ if env is None else env
    match = _IPSW.fullmatch(image)
    if match is not None:
        path = os.path.normpath(match["path"])
        if not path.endswith(".ipsw"):
            raise InvalidArgumentError(
                f"image {image!r}: a restore image path ends in .ipsw", details={"field": "image"}
            )
        digest = (match["digest"] or "").lower()
        if not digest:
            policy.check_unpinned(image, env)
            return ResolvedBase(
                base_id="local-" + hashlib.sha256(path.encode()).hexdigest()[:16], pinned=False, source=path
            )
        return ResolvedBase(base_id="sha256-" + digest[:32], pinned=True, sha256=digest, source=path)
    if not image.startswith("macos:"):
        raise InvalidArgumentError(
            f"image {image!r} is not a macOS base: use macos:stable, macos:previous, macos:<base id> or "
            "ipsw:<absolute path>@sha256:<digest>",
            details={"field": "image"},
        )
    name = image.removeprefix("macos:")
    if name == "latest":
        policy.check_unpinned(image, env)
        return ResolvedBase(base_id="latest", pinned=False, source="latest")
    if name in CHANNELS:
        base_id = bases.channels.get(name)  # type: ignore[call-overload]
        if base_id is None:
            raise FailedPreconditionError(
                f"channel {name!r} has no base pinned in this descriptor (known bases: {_known(bases)}); pin a "
                "restore image with ipsw:<path>@sha256:<digest> or point the host option bases_file at a "
                "descriptor that pins one",
                details={"field": "image", "channel": name},
            )
    else:
        base_id = name
    entry = bases.bases.get(base_id)
    if entry is None:
        raise NotFoundError(
            f"base {base_id!r} is unknown; known bases: {_known(bases)} (or use macos:stable / macos:previous)",
            details={"field": "image"},
        )
    if entry.status == "retired":
        why = f" ({entry.retired_because})" if entry.retired_because else ""
        raise FailedPreconditionError(
            f"base {base_id!r} is retired{why}; use macos:{entry.replacement} instead (recreate the Machine with "
            "`vz up --recreate` after changing the image)",
            details={"field": "image", "replacement": entry.replacement or ""},
        )
    return ResolvedBase(
        base_id=base_id, pinned=True, sha256=entry.sha256, build=entry.build, source=entry.url, size=entry.size
    )


def sha256_file(path: Path) -> str:
    """SHA-256 (lowercase hex) of a file, read once without following a final symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
