"""The ProjectDefinition: the versioned model of ``vz.json``.

``load_definition(path)`` reads and validates a file and raises ``DefinitionError`` with one line per problem,
each prefixed by its JSON path (``$.machines[0].profile: ...``). ``definition_json_schema()`` is the exported
JSON Schema (``schemas/vz.schema.json`` is generated from it and a test keeps the two equal).

This module imports pydantic, which is slow to import: the hot CLI paths (``vz exec``, ``vz --help``) never
import it (see ``vz_core.env._discover.read_header``).
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from vz_core.env._errors import DefinitionError
from vz_core.env._ids import NAME_RE, PROJECT_ID_RE
from vz_core.env._workload_def import (
    Command,
    DependsOn,
    Duration,
    HealthDef,
    RestartValue,
    SetupStep,
    workload_problems,
)
from vz_core.registry import DRIVER_NAME_PATTERN
from vz_core.rules import (
    DEFAULT_PIDS,
    DIGEST_RE,
    HOST_RE,
    MAX_PIDS,
    MIN_PIDS,
    PATH_COMPONENT_RE,
    TAG_RE,
    names_registry_host,
    reserved_target,
)

__all__ = [
    "DEFINITION_FILE",
    "DEFINITION_VERSION",
    "SUPPORTED_VERSIONS",
    "EgressAllowlist",
    "EgressPolicy",
    "Export",
    "Import",
    "Machine",
    "Mount",
    "Network",
    "NetworkPath",
    "ProjectDefinition",
    "Resources",
    "SecretRef",
    "Service",
    "Target",
    "Volume",
    "Workspace",
    "definition_json_schema",
    "load_definition",
    "migrate_definition",
    "parse_definition",
]

DEFINITION_FILE = "vz.json"
DEFINITION_VERSION = 2
"""The newest vz.json format: version 2 adds the network declarations (docs/network.md)."""
SUPPORTED_VERSIONS = (1, 2)
"""Every format this vz reads. A version 1 file keeps exactly its version 1 meaning (see ``migrate_definition``)."""
SCHEMA_ID = "urn:vz:schema:project-definition:2"
NETWORK_FIELDS = ("networks", "paths", "exports", "imports")
"""Top-level fields that exist from version 2 on (a version 1 file naming one is refused, never ignored)."""

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV = frozenset({"VZ_PROJECT_ID", "VZ_ENVIRONMENT_ID", "VZ_MACHINE_ID"})
"""Environment variables vz sets in every Machine; a definition may not set them."""
INT64_MAX = 2**63 - 1

_CONTROL_RE = re.compile(r"[\x00-\x20\x7f]")
_IMAGE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_IMAGE_FORMS = (
    "use vz:NAME, oci:/abs/layout[:tag|@sha256:...], docker-archive:/abs/file.tar[:repo:tag] or "
    "[host[:port]/]repo[:tag|@sha256:...] (no host: Docker Hub, as Docker reads it; docs/images.md)"
)


def _check_abs_path(text: str) -> None:
    if not text.startswith("/"):
        raise ValueError(f"the path {text!r} is not absolute; {_IMAGE_FORMS}")
    if ".." in text.split("/"):
        raise ValueError(f"the path {text!r} contains '..'; {_IMAGE_FORMS}")


def check_image_reference(ref: str) -> str:
    """The syntax of a vz image reference (docs/images.md), which every built-in driver reads; raises ValueError.

    The definition itself only refuses what no driver could read (whitespace, control characters, length): an
    external driver may name its images its own way. ``vz up`` applies this grammar to Machines of built-in
    drivers before anything is created. Only the syntax: whether an image exists is the driver's answer.
    """
    if len(ref) > 1024:
        raise ValueError("an image reference is at most 1024 characters")
    if _CONTROL_RE.search(ref):
        raise ValueError(f"an image reference contains no whitespace or control characters; {_IMAGE_FORMS}")
    if ref.startswith("vz:"):
        if not _IMAGE_NAME_RE.fullmatch(ref[3:]):
            raise ValueError(f"{ref!r}: the name after 'vz:' is lowercase letters, digits, '.', '_' or '-'")
        return ref
    if ref.startswith("oci:"):
        rest = ref[4:]
        if "@" in rest:
            rest, _, digest = rest.rpartition("@")
            if not DIGEST_RE.fullmatch(digest):
                raise ValueError(f"{ref!r}: the digest is not sha256:<64 hex digits>")
        else:
            head, _, last = rest.rpartition("/")
            if ":" in last:
                name, _, tag = last.partition(":")
                if not TAG_RE.fullmatch(tag):
                    raise ValueError(f"{ref!r}: the tag {tag!r} is not valid (letters, digits, '_', '.', '-')")
                rest = f"{head}/{name}"
        _check_abs_path(rest)
        return ref
    if ref.startswith("docker-archive:"):
        path, sep, image = ref[len("docker-archive:") :].partition(":")
        if sep and not image:
            raise ValueError(f"{ref!r}: the image name after the archive path is empty")
        _check_abs_path(path)
        return ref
    text = ref[len("docker://") :] if ref.startswith("docker://") else ref
    name, at, digest = text.partition("@")
    if at and not DIGEST_RE.fullmatch(digest):
        raise ValueError(f"{ref!r}: the digest is not sha256:<64 hex digits>")
    host, slash, path = name.partition("/")
    if not slash or not names_registry_host(host):
        host, path = "", name  # no registry host: Docker Hub, as Docker reads it (`alpine`, `library/debian:12`)
    elif not HOST_RE.fullmatch(host):
        raise ValueError(f"{ref!r}: the registry host {host!r} is not a valid host[:port]")
    if not path:
        raise ValueError(f"{ref!r} names no repository; {_IMAGE_FORMS}")
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not TAG_RE.fullmatch(tag):
            raise ValueError(f"{ref!r}: the tag {tag!r} is not valid (letters, digits, '_', '.', '-')")
    for component in path.split("/"):
        if not PATH_COMPONENT_RE.fullmatch(component):
            raise ValueError(
                f"{ref!r}: the repository component {component!r} is not valid (lowercase letters, digits, '._-')"
            )
    return ref


def normalize_target(target: str) -> str:
    """A Machine path as Linux resolves it (``//proc`` is ``/proc``); refuse '..', NUL, '/' and reserved paths."""
    if "\x00" in target:
        raise ValueError("a target must not contain NUL characters")
    if ".." in target.split("/"):
        raise ValueError(f"target {target!r} must not contain '..' components")
    # posixpath.normpath keeps a leading "//" (POSIX leaves it implementation-defined); Linux does not.
    norm = "/" + posixpath.normpath(target).lstrip("/")
    if norm == "/":
        raise ValueError("a target must not be the root directory '/'")
    reserved = reserved_target(norm)
    if reserved is not None:
        raise ValueError(f"target {target!r} is reserved ({reserved} belongs to the Machine runtime)")
    return norm


_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "M": 1000**2,
    "MB": 1000**2,
    "G": 1000**3,
    "GB": 1000**3,
    "T": 1000**4,
    "TB": 1000**4,
    "KI": 1024,
    "KIB": 1024,
    "MI": 1024**2,
    "MIB": 1024**2,
    "GI": 1024**3,
    "GIB": 1024**3,
    "TI": 1024**4,
    "TIB": 1024**4,
}


def _parse_size(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("expected a size such as 2GiB, 512MiB or a number of bytes")
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a size; use e.g. 2GiB, 512MiB, 10GB or a number of bytes")
        return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").upper()]
    return value


Size = Annotated[
    int,
    BeforeValidator(_parse_size),
    Field(gt=0, le=INT64_MAX),
    WithJsonSchema(
        {
            "description": "bytes, or a string with a unit: 512MiB, 2GiB, 10GB",
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
                {"type": "string", "pattern": r"^\s*\d+\s*([KMGTkmgt][iI]?[bB]?|[bB])?\s*$"},
            ],
        }
    ),
]
Name = Annotated[
    str,
    Field(pattern=NAME_RE.pattern, description="lowercase letters, digits and inner dashes, 1..40 characters"),
]


def _target(value: object) -> object:
    if isinstance(value, str) and value.startswith("/"):
        normalize_target(value)
    return value


AbsolutePath = Annotated[
    str,
    Field(pattern=r"^/", max_length=4096, description="an absolute POSIX path inside the Machine"),
    BeforeValidator(_target),
]
UserName = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$",
        description="a user name or uid, optionally ':' and a group name or gid, as the Machine's image knows them",
    ),
]
DriverName = Annotated[
    str,
    Field(
        pattern=DRIVER_NAME_PATTERN,
        description="driver name (see `vz driver list`): lowercase letters, digits, '_' or '-', never a path",
    ),
]


def _image_text(value: object) -> object:
    if isinstance(value, str):
        if len(value) > 1024:
            raise ValueError("an image reference is at most 1024 characters")
        if _CONTROL_RE.search(value):
            raise ValueError("an image reference contains no whitespace or control characters")
    return value


ImageReference = Annotated[
    str,
    Field(min_length=1, max_length=1024, description="image reference, e.g. vz:default (docs/images.md)"),
    BeforeValidator(_image_text),
]
OptionValue = (
    str
    | Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
    | Annotated[float, Field(allow_inf_nan=False, strict=True)]
    | bool
)
"""A driver option's value in vz.json; its type and bounds are the driver's declaration's to check (at `vz up`,
before anything launches: ``vz_core.drivers.validate_project_options``)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Target(_Model):
    """What the Machine runs: an operating system and a CPU architecture."""

    os: Literal["linux", "darwin", "windows"] = Field(default="linux", description="guest operating system")
    arch: Literal["amd64", "arm64"] | None = Field(
        default=None, description="guest architecture; omitted = the architecture the driver runs natively here"
    )


class Resources(_Model):
    """Requested resources; omitted values are the driver's defaults (docs/security.md, "Resource limits")."""

    cpus: Annotated[int, Field(gt=0, le=1024)] | None = Field(default=None, description="number of CPUs")
    memory: Size | None = Field(
        default=None,
        description=(
            "memory size, swap included; default on linux_native: half of the host's memory; qemu: its VM size (512MiB)"
        ),
    )
    disk: Size | None = Field(default=None, description="root disk size")
    pids: Annotated[int, Field(ge=MIN_PIDS, le=MAX_PIDS)] | None = Field(
        default=None,
        description=(
            f"the most processes and threads the Machine may have at once ({MIN_PIDS} or more, at most half of "
            f"the host's kernel.pid_max); default {DEFAULT_PIDS}, or an eighth of the host's pid_max when that "
            "is smaller. Machines with their own kernel (qemu) do not take it: their processes never use the "
            "host's PIDs"
        ),
    )

    def requested(self) -> bool:
        """Whether any host requirement (CPUs, memory, disk) is declared; ``pids`` travels as a label."""
        return self.cpus is not None or self.memory is not None or self.disk is not None


class Workspace(_Model):
    """How the project directory (where vz.json lives) appears inside the Machine."""

    projection: Literal["read-write", "read-only", "snapshot", "none"] = Field(
        default="read-write",
        description=(
            "read-write: bind mount; read-only: read-only bind mount; snapshot: the driver copies the directory "
            "once at creation; none: not projected"
        ),
    )
    target: AbsolutePath = Field(default="/workspace", description="where the workspace appears in the Machine")
    sharing: Literal["exclusive", "shared"] = Field(
        default="exclusive",
        description=(
            "the consistency contract when several Machines project the worktree read-write: exclusive (the "
            "default) lets only one Machine do so and `vz up` refuses a second; shared declares that the Machines "
            "write the same files concurrently with no ordering or locking between them"
        ),
    )


class Mount(_Model):
    """An extra bind or tmpfs mount."""

    type: Literal["bind", "tmpfs"]
    source: str | None = Field(
        default=None, description="bind: a host path, relative paths are relative to the vz.json directory"
    )
    target: AbsolutePath
    read_only: bool = False

    @model_validator(mode="after")
    def _source_matches_type(self) -> Mount:
        if self.type == "bind" and not self.source:
            raise ValueError("a bind mount needs a 'source' host path")
        if self.type == "tmpfs" and self.source:
            raise ValueError("a tmpfs mount takes no 'source'")
        return self


class Volume(_Model):
    """A named volume owned by this Machine of this Environment; it survives recreation."""

    name: Name
    target: AbsolutePath
    read_only: bool = False


class SecretRef(_Model):
    """A secret resolved from the caller's environment at `vz up` time; its value is never stored or printed."""

    from_env: Annotated[str, Field(pattern=_ENV_NAME_RE.pattern, description="environment variable of the caller")]


def _env_value_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "literal"
    if isinstance(value, dict | SecretRef):
        return "secret"
    return None


EnvValue = Annotated[
    Annotated[str, Tag("literal")] | Annotated[SecretRef, Tag("secret")],
    Discriminator(
        _env_value_kind,
        custom_error_type="env_value",
        custom_error_message='expected a string or a secret reference {"from_env": "VARIABLE"}',
    ),
]


# --- network declarations (version 2; docs/network.md) -------------------------------------------------------

Port = Annotated[int, Field(ge=1, le=65535, description="a TCP or UDP port, 1..65535")]
Protocol = Literal["tcp", "udp"]
RESERVED_PORTS = frozenset({53})
"""Ports of the Environment's own address (its DNS resolver) that no import may take on the Machine side."""
MAX_ATTACHMENTS = 16
"""Networks one Machine may attach to: each is an interface in the Machine, a part of its ``vz.network`` label
and, on VM drivers, a kernel argument (all of them bounded)."""
AUTO_POOL = ipaddress.IPv4Network("10.89.0.0/16")
"""Where networks without a declared subnet get their /24 (``vz_core.env._topology.DEFAULT_POOL``)."""
AUTO_ROOM = 2**8 - 3
"""Machines an automatic /24 holds (network, gateway and broadcast addresses taken)."""

_DOMAIN_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_DOMAIN_RE = re.compile(rf"(?:\*\.)?(?:{_DOMAIN_LABEL}\.)+{_DOMAIN_LABEL}")
RESERVED_DOMAINS = ("vz.internal", "docker.internal", "localhost")
"""Names that belong to the Environment's resolver (or to no one): an allowlist cannot name them."""
_EGRESS_NEVER: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (ipaddress.ip_network("0.0.0.0/8"), "'this network' (0.0.0.0/8)"),
    (ipaddress.ip_network("127.0.0.0/8"), "host loopback (127.0.0.0/8)"),
    (ipaddress.ip_network("169.254.0.0/16"), "link-local and cloud metadata (169.254.0.0/16)"),
    (ipaddress.ip_network("224.0.0.0/4"), "multicast (224.0.0.0/4)"),
    (ipaddress.ip_network("240.0.0.0/4"), "reserved and broadcast (240.0.0.0/4)"),
    (ipaddress.ip_network("::/128"), "the unspecified address (::)"),
    (ipaddress.ip_network("::1/128"), "host loopback (::1)"),
    (ipaddress.ip_network("::ffff:0:0/96"), "IPv4-mapped addresses (::ffff:0:0/96)"),
    (ipaddress.ip_network("fe80::/10"), "link-local (fe80::/10)"),
    (ipaddress.ip_network("ff00::/8"), "multicast (ff00::/8)"),
)
_SUBNET_RANGES = tuple(
    ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
)


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text)
    except ValueError:
        return False
    return True


def _network_key(text: str) -> tuple[int, int, int]:
    net = ipaddress.ip_network(text)
    return (net.version, int(net.network_address), net.prefixlen)


def check_egress_destination(text: str) -> str:
    """One allowlist entry, normalized: an IPv4 address or CIDR (``10.0.0.0/8``) or a domain name
    (``example.com``, ``*.example.com`` for every name below it). Raises ValueError saying what is wrong."""
    if len(text) > 253 or _CONTROL_RE.search(text):
        raise ValueError(f"{text[:40]!r}: an allowlist entry is an address, a CIDR or a domain name")
    looks_numeric = ":" in text or "/" in text or re.fullmatch(r"[0-9.]+", text) is not None
    if looks_numeric:
        try:
            net = ipaddress.ip_network(text, strict=True)
        except ValueError:
            try:
                loose = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValueError(f"{text!r} is not an IP address, a CIDR (e.g. 10.0.0.0/8) or a domain name") from None
            raise ValueError(f"{text!r} has host bits set; the network is {loose}") from None
        if net.version == 6:
            # Route domains carry IPv4 only (IPv6 is off inside them): an IPv6 entry would be accepted and do
            # nothing, which is worse than saying so.
            raise ValueError(
                f"{text!r} is an IPv6 destination; Environments reach IPv4 destinations only (IPv6 is off in route "
                "domains): list its IPv4 CIDR or its domain name instead"
            )
        for never, what in _EGRESS_NEVER:
            if net.version == never.version and net.overlaps(never):
                hint = (
                    'write "egress": "allowed" for every public destination'
                    if net.prefixlen == 0
                    else 'a host service is offered to a Machine with "imports"'
                )
                raise ValueError(f"{text!r} covers {what}, which egress never reaches; {hint}")
        return str(net)
    name = text.lower()
    name = name[:-1] if name.endswith(".") else name
    if not _DOMAIN_RE.fullmatch(name) or name.rsplit(".", 1)[-1].isdigit():
        raise ValueError(
            f"{text!r} is not a domain name (labels of letters, digits and inner '-', at least two labels, "
            "optionally '*.' first), an IP address or a CIDR"
        )
    bare = name[2:] if name.startswith("*.") else name
    for reserved in RESERVED_DOMAINS:
        if bare == reserved or bare.endswith("." + reserved):
            raise ValueError(f"{text!r}: names under {reserved} belong to vz's Environment resolver, not to egress")
    return name


def _egress_destination(value: object) -> object:
    return check_egress_destination(value) if isinstance(value, str) else value


EgressDestination = Annotated[
    str,
    Field(
        min_length=1,
        max_length=253,
        description="an IP address, a CIDR (10.0.0.0/8) or a domain name (example.com, *.example.com)",
    ),
    BeforeValidator(_egress_destination),
]


class EgressAllowlist(_Model):
    """Egress only to these destinations (version 2): CIDRs, addresses and domain names."""

    allow: Annotated[list[EgressDestination], Field(min_length=1, max_length=256)] = Field(
        description="destinations the Machine may reach; domain names are enforced through the Environment's resolver"
    )

    @field_validator("allow")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        dupes = sorted({v for v in value if value.count(v) > 1})
        if dupes:
            raise ValueError(f"allowlist entries must be unique; repeated: {', '.join(dupes)}")
        return value


def _egress_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "policy"
    if isinstance(value, dict | EgressAllowlist):
        return "allowlist"
    return None


EgressValue = Annotated[
    Annotated[Literal["allow", "deny", "offline", "allowed"], Tag("policy")]
    | Annotated[EgressAllowlist, Tag("allowlist")],
    Discriminator(
        _egress_kind,
        custom_error_type="egress",
        custom_error_message=(
            'expected "offline", "allowed" or {"allow": [...]} (version 2), or "allow" / "deny" (version 1)'
        ),
    ),
]


@dataclass(frozen=True)
class EgressPolicy:
    """A Machine's declared outbound policy in one shape, whatever the file's version spelled.

    ``mode`` is ``offline`` (nothing outside the Environment), ``allowed`` (public destinations; never the host,
    its LAN, the control plane or another Environment) or ``allowlist`` (only ``cidrs`` and ``domains``)."""

    mode: Literal["offline", "allowed", "allowlist"]
    cidrs: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "cidrs": list(self.cidrs), "domains": list(self.domains)}


class Service(_Model):
    """A service a Machine offers; only Machines with a declared path to it reach it (version 2). With a
    ``command`` the Machine's agent runs and supervises it (docs/user-guide.md, "Services")."""

    name: Name
    port: Port
    protocol: Protocol = Field(default="tcp", description="tcp or udp")
    command: Command | None = Field(
        default=None, description="what runs the service; started after setup on every start of the Machine"
    )
    workdir: str | None = Field(default=None, description="absolute working directory (default: the Machine's)")
    environment: dict[str, str] = Field(
        default_factory=dict, description="variables added to the Machine's environment for this service"
    )
    user: UserName | None = Field(default=None, description="the user it runs as (default: the Machine's user)")
    restart: RestartValue = "no"
    health: HealthDef | None = Field(default=None, description="how vz tells the service works")
    depends_on: DependsOn | None = None
    stop_timeout: Duration = Field(default=10.0, description="SIGTERM, then SIGKILL after this long (default 10s)")

    @field_validator("workdir")
    @classmethod
    def _abs_workdir(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or ".." in value.split("/") or "\x00" in value):
            raise ValueError(f"workdir {value!r} must be an absolute path inside the Machine, without '..'")
        return value

    @field_validator("environment")
    @classmethod
    def _service_env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not _ENV_NAME_RE.fullmatch(key):
                raise ValueError(f"{key!r} is not an environment variable name (letters, digits, '_')")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by vz itself and cannot be defined")
            if "\x00" in item:
                raise ValueError(f"the value of {key} contains a NUL character, which no environment can hold")
        return value


def _subnet(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an IPv4 network in CIDR form (e.g. 10.89.0.0/24): {exc}") from None
    if not any(net.subnet_of(r) for r in _SUBNET_RANGES):
        raise ValueError(
            f"{value!r} is not inside a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10)"
        )
    if not 8 <= net.prefixlen <= 29:
        raise ValueError(f"{value!r}: a network's prefix is /8 to /29 (a gateway and at least one Machine)")
    return str(net)


class Network(_Model):
    """A named network of every Environment of the project, and the Machines attached to it (version 2)."""

    name: Name
    machines: Annotated[list[Name], Field(max_length=1024)] = Field(
        default_factory=list, description="names of the Machines attached to this network"
    )
    subnet: Annotated[str, BeforeValidator(_subnet)] | None = Field(
        default=None,
        description=(
            "IPv4 range inside the Environment's own route domain (Environments may use the same range); "
            "omitted: a /24 of 10.89.0.0/16 chosen from the network's name"
        ),
    )


class NetworkPath(_Model):
    """A declared path: Machine ``from`` may open connections to one service of Machine ``to`` (version 2)."""

    source: Name = Field(alias="from", description="the Machine that connects")
    to: Name = Field(description="the Machine that offers the service")
    service: Name | None = Field(default=None, description="the service's name (or give port and protocol)")
    port: Port | None = Field(default=None, description="the service's port, instead of its name")
    protocol: Protocol | None = Field(default=None, description="with port: tcp (default) or udp")


class Export(_Model):
    """A Machine's service offered to the host on 127.0.0.1 only (version 2)."""

    machine: Name
    service: Name
    host_port: Port | None = Field(
        default=None,
        description=(
            "preferred port on 127.0.0.1; omitted: the service's port when it is 1024 or above. Another is chosen, "
            "stably, when it is taken"
        ),
    )


def _loopback(value: object) -> object:
    if isinstance(value, str):
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address; an import reaches host loopback (127.0.0.1)") from None
        if not address.is_loopback:
            raise ValueError(
                f"{value!r} is not a loopback address: an import carries one host loopback port "
                "(127.0.0.0/8 or ::1) into a Machine, never a LAN or wildcard address"
            )
        return str(address)
    return value


class Import(_Model):
    """One host loopback port offered to one Machine, at host.vz.internal (version 2)."""

    machine: Name
    host_port: Port = Field(description="the port on the host's loopback")
    host_address: Annotated[str, BeforeValidator(_loopback)] = Field(
        default="127.0.0.1", description="a loopback address of the host: 127.0.0.0/8 or ::1"
    )
    protocol: Protocol = Field(default="tcp", description="tcp or udp")
    port: Port | None = Field(default=None, description="the port the Machine connects to (default: host_port)")

    @property
    def machine_port(self) -> int:
        return self.port if self.port is not None else self.host_port


class Machine(_Model):
    """One Machine of every Environment made from this project."""

    name: Name
    target: Target = Field(default_factory=Target)
    profile: Literal["developer", "hardened"] = Field(
        description="developer: a normal development Machine; hardened: the driver's locked-down profile"
    )
    driver: DriverName
    driver_options: dict[str, OptionValue] = Field(default_factory=dict, description="options for the driver")
    image: ImageReference
    resources: Resources = Field(default_factory=Resources)
    workspace: Workspace = Field(default_factory=Workspace)
    mounts: list[Mount] = Field(default_factory=list)
    volumes: list[Volume] = Field(default_factory=list)
    environment: dict[str, EnvValue] = Field(
        default_factory=dict, description="environment variables; secret references keep values out of vz.json"
    )
    services: list[Service] = Field(
        default_factory=list, description="services this Machine offers to declared paths and exports (version 2)"
    )
    setup: Annotated[list[SetupStep], Field(max_length=256)] = Field(
        default_factory=list,
        description=(
            "commands run once, in order, when the Machine is created (before its services); rerun when they or "
            "the image change"
        ),
    )
    egress_declared: EgressValue = Field(
        default="allow",
        alias="egress",
        description=(
            'outbound network policy. Version 2: "offline" (the default), "allowed", or {"allow": [CIDRs and '
            'domain names]}. Version 1: "allow" (the default) or "deny"'
        ),
    )
    remote_user: UserName | None = Field(
        default=None,
        description=(
            "the developer identity: who `vz exec` runs commands as and who owns the projected workspace "
            "(omitted: user, else root)"
        ),
    )
    user: UserName | None = Field(
        default=None, description="the user the Machine's main process runs as (omitted: the image's user)"
    )

    @field_validator("environment")
    @classmethod
    def _env_names(cls, value: dict[str, str | SecretRef]) -> dict[str, str | SecretRef]:
        for key, item in value.items():
            if not _ENV_NAME_RE.fullmatch(key):
                raise ValueError(f"{key!r} is not an environment variable name (letters, digits, '_')")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by vz itself and cannot be defined")
            if isinstance(item, str) and "\x00" in item:
                raise ValueError(f"the value of {key} contains a NUL character, which no environment can hold")
        return value

    @model_validator(mode="after")
    def _unique_targets(self) -> Machine:
        seen: dict[str, str] = {}
        places = [(self.workspace.target, "workspace")] if self.workspace.projection != "none" else []
        places += [(m.target, f"mounts[{i}]") for i, m in enumerate(self.mounts)]
        places += [(v.target, f"volumes[{i}]") for i, v in enumerate(self.volumes)]
        for target, where in places:
            key = normalize_target(target)
            if key in seen:
                raise ValueError(f"{where} uses target {target!r}, already used by {seen[key]}")
            seen[key] = where
        names = [v.name for v in self.volumes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"volume names must be unique; repeated: {', '.join(dupes)}")
        return self

    @property
    def egress(self) -> Literal["allow", "deny"]:
        """The driver-level policy a driver enforces today (``vz.egress`` label): ``allow`` or ``deny``.

        Version 1 spells it directly. A version 2 policy maps to ``deny`` until the route-domain attachment
        realizes it (docs/network.md): ``deny`` never grants more than the declaration, while the drivers'
        ``allow`` reaches the host and its LAN, which no version 2 policy grants."""
        value = self.egress_declared
        return "allow" if value == "allow" else "deny"

    @property
    def egress_policy(self) -> EgressPolicy:
        """The declared policy, normalized (version 1 ``allow`` is ``allowed``, ``deny`` is ``offline``)."""
        value = self.egress_declared
        if isinstance(value, EgressAllowlist):
            cidrs = sorted({v for v in value.allow if _is_network(v)}, key=_network_key)
            domains = sorted({v for v in value.allow if not _is_network(v)})
            return EgressPolicy("allowlist", tuple(cidrs), tuple(domains))
        return EgressPolicy("allowed" if value in ("allow", "allowed") else "offline")

    def service(self, name: str) -> Service:
        for item in self.services:
            if item.name == name:
                return item
        raise KeyError(name)

    def secret_refs(self) -> dict[str, str]:
        """Environment key → the caller's variable it is read from."""
        return {k: v.from_env for k, v in self.environment.items() if isinstance(v, SecretRef)}

    def developer_identity(self) -> str:
        """remote_user, else user, else "root" (PROTOCOL.md §2, ReusePreflight)."""
        return self.remote_user or self.user or "root"

    def recorded(self) -> dict[str, Any]:
        """The JSON form kept in the state store: secret references, never secret values.

        Fields added after Machines were first recorded appear only when set (a record made before them stays
        in sync); workspace.sharing is a host-side declaration, not a creation-time setting, and is left out."""
        data = self.model_dump(mode="json", by_alias=True)
        for key in ("remote_user", "user"):
            if data.get(key) is None:
                data.pop(key, None)
        # Services are Environment topology (docs/network.md), not a creation-time setting of the Machine; setup
        # steps are tracked inside the Machine by their hash (vz_core.env._workload).
        data.pop("services", None)
        data.pop("setup", None)
        workspace = data.get("workspace")
        if isinstance(workspace, dict):
            workspace.pop("sharing", None)
        resources = data.get("resources")
        if isinstance(resources, dict) and resources.get("pids") is None:
            resources.pop("pids", None)
        return data


class _LocatedProblems(ValueError):
    """Several problems, each at its own JSON path (cross-references that one field's validator cannot see)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{path}: {message}" for path, message in problems))
        self.problems = problems


class ProjectDefinition(_Model):
    """A project's vz.json (version 1 or 2; version 2 adds the network declarations of docs/network.md)."""

    schema_: str | None = Field(default=None, alias="$schema", description="optional path or URI of this schema")
    version: Literal[1, 2] = Field(
        description=(
            "definition format version: 2 (the network model of docs/network.md) or 1 (read with its version 1 meaning)"
        )
    )
    project_id: Annotated[
        str,
        Field(
            pattern=PROJECT_ID_RE.pattern,
            description="stable project id: never change it (it keys every Environment of the project)",
        ),
    ]
    description: str = ""
    machines: Annotated[list[Machine], Field(min_length=1)]
    default_machine: Name | None = Field(
        default=None, description="the Machine `vz exec` uses without --machine (required with several Machines)"
    )
    networks: Annotated[list[Network], Field(max_length=64)] = Field(
        default_factory=list,
        description=(
            "version 2: the Environment's named networks and the Machines attached to each; omitted: one network "
            "'default' with every Machine"
        ),
    )
    paths: Annotated[list[NetworkPath], Field(max_length=4096)] = Field(
        default_factory=list,
        description="version 2: which Machine may reach which service of which Machine; nothing else connects",
    )
    exports: Annotated[list[Export], Field(max_length=1024)] = Field(
        default_factory=list, description="version 2: Machine services offered to the host on 127.0.0.1"
    )
    imports: Annotated[list[Import], Field(max_length=1024)] = Field(
        default_factory=list,
        description="version 2: host loopback ports offered to one Machine each, at host.vz.internal",
    )

    @model_validator(mode="before")
    @classmethod
    def _version_defaults(cls, data: Any) -> Any:
        """Version 2 Machines are offline unless they say otherwise (version 1 keeps its default, allow)."""
        if isinstance(data, dict) and data.get("version") == 2 and isinstance(data.get("machines"), list):
            machines = [
                {**m, "egress": "offline"} if isinstance(m, dict) and "egress" not in m else m for m in data["machines"]
            ]
            data = {**data, "machines": machines}
        return data

    @field_validator("machines")
    @classmethod
    def _unique_names(cls, value: list[Machine]) -> list[Machine]:
        names = [m.name for m in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"machine names must be unique; repeated: {', '.join(dupes)}")
        return value

    @model_validator(mode="after")
    def _default_exists(self) -> ProjectDefinition:
        names = [m.name for m in self.machines]
        if self.default_machine is not None and self.default_machine not in names:
            raise ValueError(f"default_machine {self.default_machine!r} is not one of the machines: {', '.join(names)}")
        return self

    @model_validator(mode="after")
    def _network_declarations(self) -> ProjectDefinition:
        problems = network_problems(self)
        if not problems:
            problems = workload_problems(self)
        if problems:
            raise _LocatedProblems(problems)
        return self

    def effective_networks(self) -> list[Network]:
        """The declared networks, or (none declared) one network ``default`` holding every Machine."""
        if self.networks:
            return list(self.networks)
        return [Network(name="default", machines=[m.name for m in self.machines])]

    def machine(self, name: str) -> Machine:
        for m in self.machines:
            if m.name == name:
                return m
        raise KeyError(name)

    def effective_default_machine(self) -> str | None:
        """The declared default Machine, else the only Machine, else None."""
        if self.default_machine:
            return self.default_machine
        return self.machines[0].name if len(self.machines) == 1 else None


# --- cross-references of the network declarations ----------------------------------------------------------

_V2_HINT = 'set "version": 2 (docs/network.md says what changes from version 1)'


def _spelled(item: Service) -> str:
    return f"{item.name} {item.protocol}/{item.port}"


def _services_text(machine: Machine) -> str:
    return ", ".join(_spelled(s) for s in machine.services) or "none declared"


def network_problems(definition: ProjectDefinition) -> list[tuple[str, str]]:
    """Every problem of the network declarations as (JSON path, message); empty when they are consistent.

    Version 1: the version 2 fields are refused (never ignored) and egress is ``allow`` or ``deny``. Version 2:
    names unique, every reference resolves (Machines, services, networks), paths go to declared ports of
    Machines sharing a network, exports do not overlap, imports reach host loopback only."""
    out: list[tuple[str, str]] = []
    if definition.version == 1:
        for key in NETWORK_FIELDS:
            if key in definition.model_fields_set:
                out.append((f"$.{key}", f"{key} needs version 2 of vz.json; {_V2_HINT}"))
        for i, m in enumerate(definition.machines):
            if "services" in m.model_fields_set:
                out.append((f"$.machines[{i}].services", f"services need version 2 of vz.json; {_V2_HINT}"))
            if isinstance(m.egress_declared, EgressAllowlist) or m.egress_declared in ("offline", "allowed"):
                shown = "an allowlist" if isinstance(m.egress_declared, EgressAllowlist) else repr(m.egress_declared)
                out.append(
                    (
                        f"$.machines[{i}].egress",
                        f"{shown} is version 2 egress; version 1 reads 'allow' or 'deny' ({_V2_HINT})",
                    )
                )
        return out
    machines = {m.name: m for m in definition.machines}
    known = ", ".join(machines)

    def unknown(name: str) -> str:
        return f"unknown Machine {name!r} (machines: {known})"

    for i, m in enumerate(definition.machines):
        where = f"$.machines[{i}]"
        if m.name == "host":
            out.append(
                (
                    f"{where}.name",
                    "'host' is reserved in version 2: host.vz.internal is the Environment's relay of the host's "
                    "imports; give the Machine another name",
                )
            )
        if m.egress_declared in ("allow", "deny"):
            new = "allowed" if m.egress_declared == "allow" else "offline"
            out.append(
                (
                    f"{where}.egress",
                    f"{m.egress_declared!r} is the version 1 spelling; version 2 reads {new!r} "
                    '("offline", the default, "allowed" or {"allow": [CIDRs, domain names]})',
                )
            )
        names: dict[str, int] = {}
        ports: dict[tuple[str, int], int] = {}
        for j, svc in enumerate(m.services):
            if svc.name in names:
                out.append(
                    (f"{where}.services[{j}].name", f"service {svc.name!r} is already services[{names[svc.name]}]")
                )
            names.setdefault(svc.name, j)
            port_key = (svc.protocol, svc.port)
            if port_key in ports:
                out.append(
                    (f"{where}.services[{j}].port", f"{svc.protocol}/{svc.port} is already services[{ports[port_key]}]")
                )
            ports.setdefault(port_key, j)

    attached: dict[str, set[str]] = {name: set() for name in machines}
    seen_networks: dict[str, int] = {}
    subnets: list[tuple[ipaddress.IPv4Network, int]] = []
    for i, net in enumerate(definition.networks):
        where = f"$.networks[{i}]"
        if net.name in seen_networks:
            out.append((f"{where}.name", f"network {net.name!r} is already networks[{seen_networks[net.name]}]"))
        seen_networks.setdefault(net.name, i)
        members: dict[str, int] = {}
        for j, name in enumerate(net.machines):
            if name not in machines:
                out.append((f"{where}.machines[{j}]", unknown(name)))
            elif name in members:
                out.append((f"{where}.machines[{j}]", f"{name!r} is already machines[{members[name]}]"))
            else:
                attached[name].add(net.name)
            members.setdefault(name, j)
        if net.subnet is not None:
            subnet = ipaddress.IPv4Network(net.subnet)
            for other, k in subnets:
                if subnet.overlaps(other):
                    out.append((f"{where}.subnet", f"{subnet} overlaps networks[{k}].subnet {other}"))
            subnets.append((subnet, i))
            room = subnet.num_addresses - 3  # network, gateway, broadcast
            if len(members) > room:
                out.append((f"{where}.subnet", f"{subnet} has room for {room} Machines, {len(members)} attach"))
    if not definition.networks:
        for name in attached:
            attached[name].add("default")
        if len(machines) > AUTO_ROOM:
            out.append(
                (
                    "$.machines",
                    f"{len(machines)} Machines on the automatic network 'default' (a /24 of {AUTO_POOL}, room for "
                    f"{AUTO_ROOM}); declare $.networks with a larger 'subnet'",
                )
            )
    memberships: dict[str, int] = {}
    for i, net in enumerate(definition.networks):
        for j, name in enumerate(dict.fromkeys(net.machines)):
            if name not in machines:
                continue
            memberships[name] = memberships.get(name, 0) + 1
            if memberships[name] == MAX_ATTACHMENTS + 1:
                out.append(
                    (
                        f"$.networks[{i}].machines[{j}]",
                        f"{name!r} would attach to more than {MAX_ATTACHMENTS} networks (each is an interface of the "
                        "Machine); attach it to fewer",
                    )
                )
        if net.subnet is None and len(set(net.machines)) > AUTO_ROOM:
            out.append(
                (
                    f"$.networks[{i}].machines",
                    f"{len(set(net.machines))} Machines on network {net.name!r}, whose automatic subnet (a /24 of "
                    f"{AUTO_POOL}) has room for {AUTO_ROOM}; declare a larger 'subnet'",
                )
            )
    automatic = sorted((net.name, i) for i, net in enumerate(definition.networks) if net.subnet is None)
    if automatic:
        declared = [s for s, _ in subnets]
        free = sum(1 for block in AUTO_POOL.subnets(new_prefix=24) if not any(block.overlaps(d) for d in declared))
        for name, i in automatic[free:]:  # allocation goes by name: the last ones would find no /24 left
            out.append(
                (
                    f"$.networks[{i}].subnet",
                    f"network {name!r} has no 'subnet' and the declared subnets leave no free /24 of {AUTO_POOL} "
                    "for it; declare its 'subnet'",
                )
            )

    seen_paths: dict[tuple[str, str, str, int], int] = {}
    for i, path in enumerate(definition.paths):
        where = f"$.paths[{i}]"
        source, dest = machines.get(path.source), machines.get(path.to)
        if source is None:
            out.append((f"{where}.from", unknown(path.source)))
        if dest is None:
            out.append((f"{where}.to", unknown(path.to)))
        if path.source == path.to:
            out.append((f"{where}.to", f"{path.to!r} reaches its own services on loopback; a path joins two Machines"))
            continue
        if path.protocol is not None and path.port is None:
            out.append((f"{where}.protocol", "protocol goes with port (or name the service)"))
        if (path.service is None) == (path.port is None):
            out.append((where, "name the destination service with 'service' or with 'port' (and 'protocol'), not both"))
            continue
        if dest is None or source is None:
            continue
        target: Service | None = None
        if path.service is not None:
            try:
                target = dest.service(path.service)
            except KeyError:
                out.append(
                    (f"{where}.service", f"{path.to!r} declares no service {path.service!r} ({_services_text(dest)})")
                )
        else:
            protocol = path.protocol or "tcp"
            target = next((s for s in dest.services if (s.protocol, s.port) == (protocol, path.port)), None)
            if target is None:
                out.append(
                    (
                        f"{where}.port",
                        f"{path.to!r} declares no {protocol} service on port {path.port} ({_services_text(dest)}); "
                        f"declare it in machines[].services first",
                    )
                )
        if target is None:
            continue
        if not attached[path.source] & attached[path.to]:
            out.append(
                (
                    where,
                    f"{path.source!r} and {path.to!r} share no network; attach both to one network in $.networks",
                )
            )
        path_key = (path.source, path.to, target.protocol, target.port)
        if path_key in seen_paths:
            out.append((where, f"the same path as paths[{seen_paths[path_key]}]"))
        seen_paths.setdefault(path_key, i)

    exported: dict[tuple[str, str], int] = {}
    host_ports: dict[tuple[str, int], int] = {}
    implicit: list[tuple[int, str, int]] = []
    for i, export in enumerate(definition.exports):
        where = f"$.exports[{i}]"
        owner = machines.get(export.machine)
        if owner is None:
            out.append((f"{where}.machine", unknown(export.machine)))
            continue
        try:
            svc = owner.service(export.service)
        except KeyError:
            out.append(
                (
                    f"{where}.service",
                    f"{export.machine!r} declares no service {export.service!r} ({_services_text(owner)})",
                )
            )
            continue
        export_key = (export.machine, export.service)
        if export_key in exported:
            out.append(
                (where, f"{export.machine} {export.service} is already exported by exports[{exported[export_key]}]")
            )
        exported.setdefault(export_key, i)
        if export.host_port is not None:
            port_key = (svc.protocol, export.host_port)
            if port_key in host_ports:
                out.append(
                    (
                        f"{where}.host_port",
                        f"{svc.protocol}/{export.host_port} on the host is already exports[{host_ports[port_key]}]",
                    )
                )
            host_ports.setdefault(port_key, i)
        elif svc.port >= 1024:
            implicit.append((i, svc.protocol, svc.port))
    # An export without host_port prefers its service port: another export preferring the same port makes the
    # outcome depend on the order they start in, so it is refused like two declared host ports.
    for i, svc_protocol, svc_port in implicit:
        earlier = host_ports.get((svc_protocol, svc_port))
        if earlier is not None:
            out.append(
                (
                    f"$.exports[{i}]",
                    f"prefers {svc_protocol}/{svc_port} on the host (its service port, no host_port given), which "
                    f"exports[{earlier}] also prefers; give it a host_port of its own",
                )
            )
        host_ports.setdefault((svc_protocol, svc_port), i)

    for i, export in enumerate(definition.exports):
        if export.machine in attached and not attached[export.machine]:
            out.append(
                (
                    f"$.exports[{i}].machine",
                    f"{export.machine!r} is attached to no network; an export reaches it through the Environment's "
                    "route domain: attach it in $.networks",
                )
            )
    for i, item in enumerate(definition.imports):
        if item.machine in attached and not attached[item.machine]:
            out.append(
                (
                    f"$.imports[{i}].machine",
                    f"{item.machine!r} is attached to no network; an import's relay lives in the Environment's route "
                    "domain: attach it in $.networks",
                )
            )
    imported: dict[tuple[str, str, int], int] = {}
    relays: dict[tuple[str, int], tuple[str, int, int]] = {}
    for i, item in enumerate(definition.imports):
        where = f"$.imports[{i}]"
        if item.machine not in machines:
            out.append((f"{where}.machine", unknown(item.machine)))
            continue
        port = item.machine_port
        if port in RESERVED_PORTS:
            field = "port" if item.port is not None else "host_port"
            out.append(
                (f"{where}.{field}", f"port {port} of host.vz.internal is the Environment's DNS; set another 'port'")
            )
        import_key = (item.machine, item.protocol, port)
        if import_key in imported:
            out.append(
                (where, f"{item.machine} already imports {item.protocol}/{port} (imports[{imported[import_key]}])")
            )
        imported.setdefault(import_key, i)
        relay = (item.protocol, port)
        host = (item.host_address, item.host_port, i)
        if relay in relays and relays[relay][:2] != host[:2]:
            first = relays[relay]
            out.append(
                (
                    f"{where}.port",
                    f"{item.protocol}/{port} at host.vz.internal already carries {first[0]}:{first[1]} "
                    f"(imports[{first[2]}]); choose another 'port'",
                )
            )
        relays.setdefault(relay, host)
        looped = host_ports.get((item.protocol, item.host_port))
        if item.host_address == "127.0.0.1" and looped is not None:
            out.append(
                (
                    f"{where}.host_port",
                    f"127.0.0.1 {item.protocol}/{item.host_port} is where exports[{looped}] listens: the import would "
                    "lead back into this Environment; declare a path to that Machine's service instead",
                )
            )
    if not out:
        out.extend(_label_problems(definition))
    return out


_PLACEHOLDER_ID = "env_000000000000"


def unreachable_problems(definition: ProjectDefinition, attaching: set[str]) -> list[tuple[str, str]]:
    """Network declarations no driver could honour: a path, export or import naming a Machine whose driver does
    not join Machines to route domains (``attaching`` holds the names of the Machines whose driver advertises
    the Extensions fact ``topology``). Such a Machine runs isolated (its driver's ``deny``), so the declaration
    would silently never connect; ``vz up`` refuses it before anything is created."""
    if definition.version != 2:
        return []
    drivers = {m.name: m.driver for m in definition.machines}

    def why(name: str) -> str:
        return (
            f"{name!r} runs on driver {drivers[name]!r}, which does not join Machines to the Environment's route "
            "domain (no Extensions fact 'topology'): nothing could ever connect it; use a driver that does "
            "(linux_native, qemu) or remove the declaration"
        )

    out: list[tuple[str, str]] = []
    for i, path in enumerate(definition.paths):
        for key, name in (("from", path.source), ("to", path.to)):
            if name in drivers and name not in attaching:
                out.append((f"$.paths[{i}].{key}", why(name)))
    targets = [("exports", i, e.machine) for i, e in enumerate(definition.exports)]
    targets += [("imports", i, e.machine) for i, e in enumerate(definition.imports)]
    for key, i, name in targets:
        if name in drivers and name not in attaching:
            out.append((f"$.{key}[{i}].machine", why(name)))
    return out


def _label_problems(definition: ProjectDefinition) -> list[tuple[str, str]]:
    """Each Machine's share of the topology must fit its ``vz.network`` label. The label's length does not depend
    on the Environment (ids have one length; addresses and interface names come from the definition alone), so
    it is measured once here, with a placeholder id, instead of failing when that Machine is created."""
    from vz_core.env._topology import compile_topology
    from vz_core.network.label import MAX_LABEL, machine_slice

    plan = compile_topology(definition, _PLACEHOLDER_ID).to_json()
    out: list[tuple[str, str]] = []
    for i, m in enumerate(definition.machines):
        label = machine_slice(plan, m.name)
        if label is not None and len(label) > MAX_LABEL:
            out.append(
                (
                    f"$.machines[{i}]",
                    f"{m.name!r}'s share of the Environment's network (its networks and egress) is {len(label)} "
                    f"characters, more than the {MAX_LABEL} its driver accepts; shorten its egress allowlist or "
                    "attach it to fewer networks",
                )
            )
    return out


def migrate_definition(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version 1 vz.json rewritten as version 2 with the same meaning; a version 2 one is returned as is.

    The only difference in meaning between the versions is egress: version 1's ``allow`` (its default) becomes
    ``allowed``, ``deny`` becomes ``offline``, and every Machine says it explicitly because version 2's default
    is ``offline``. Version 1 had no declared paths: the result declares none, so its Machines reach each
    other only once paths are added (docs/network.md, "Version 1 files")."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    if data.get("version") == 2:
        return out
    parse_definition(dict(data))  # refuse what is not a valid version 1 file before rewriting anything
    out["version"] = 2
    for machine in out["machines"]:
        machine["egress"] = "offline" if machine.get("egress") == "deny" else "allowed"
    return out


def definition_json_schema() -> dict[str, Any]:
    """The JSON Schema of vz.json versions 1 and 2 (what ``schemas/vz.schema.json`` holds).

    The model reads both versions; conditions on ``version`` say what each one allows (version 1: no network
    fields, egress allow/deny; version 2: egress offline/allowed/allowlist). The cross-references (unknown
    Machines or services, overlapping exports) are checked by ``parse_definition``, which a schema cannot say."""
    schema = ProjectDefinition.model_json_schema(by_alias=True, mode="validation")
    out: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "vz project definition (vz.json)",
    }
    out.update(schema)
    out["title"] = "vz project definition (vz.json)"
    egress = out["$defs"]["Machine"]["properties"]["egress"]
    egress.pop("default", None)  # the default depends on the version: the conditions below say which
    allowlist = {"$ref": "#/$defs/EgressAllowlist"}
    out["allOf"] = [
        {
            "if": {"properties": {"version": {"const": 1}}, "required": ["version"]},
            "then": {
                "properties": {
                    **dict.fromkeys(NETWORK_FIELDS, False),
                    "machines": {
                        "items": {
                            "properties": {
                                "services": False,
                                "egress": {"enum": ["allow", "deny"], "default": "allow"},
                            }
                        }
                    },
                }
            },
        },
        {
            "if": {"properties": {"version": {"const": 2}}, "required": ["version"]},
            "then": {
                "properties": {
                    "machines": {
                        "items": {
                            "properties": {
                                "egress": {
                                    "oneOf": [{"type": "string", "enum": ["offline", "allowed"]}, allowlist],
                                    "default": "offline",
                                }
                            }
                        }
                    }
                }
            },
        },
    ]
    return out


# --- errors with JSON paths ---------------------------------------------------------------------------------

_MESSAGES = {
    "missing": "required field is missing",
    "extra_forbidden": "unknown field",
}


_TAGS = ("literal", "secret", "policy", "allowlist")  # discriminator tags pydantic puts in error locations


def _json_path(loc: tuple[int | str, ...], data: object) -> str:
    out = "$"
    node: object = data
    for part in loc:
        if part in _TAGS and not (isinstance(node, dict) and part in node):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
        else:
            shown = part if len(part) <= 64 else part[:61] + "..."  # one readable line, whatever the key
            out += f".{shown}" if re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_]*", shown) else f"[{json.dumps(shown)}]"
            node = node.get(part) if isinstance(node, dict) else None
    return out


def _step(tp: Any, part: int | str) -> Any:
    """The annotation reached from ``tp`` by one location part, or None."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _step(get_args(tp)[0], part)
    if origin in (Union, UnionType):
        for arg in get_args(tp):
            found = _step(arg, part)
            if found is not None:
                return found
        return None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if isinstance(part, str):
            for name, field in tp.model_fields.items():
                if (field.alias or name) == part:
                    return field.annotation
        return None
    if origin is list and isinstance(part, int):
        return get_args(tp)[0]
    if origin is dict and isinstance(part, str):
        return get_args(tp)[1]
    return None


def _model_in(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    if get_origin(tp) in (Annotated, Union, UnionType):
        for arg in get_args(tp):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _allowed_fields(loc: tuple[int | str, ...]) -> list[str]:
    """Field names allowed in the object holding the unknown field ``loc[-1]``."""
    tp: Any = ProjectDefinition
    for part in loc[:-1]:
        found = _step(tp, part)
        if found is None:
            if part in _TAGS:
                continue
            return []
        tp = found
    model = _model_in(tp)
    return [field.alias or name for name, field in model.model_fields.items()] if model else []


def _machine_label(loc: tuple[int | str, ...], data: object) -> str:
    if len(loc) >= 2 and loc[0] == "machines" and isinstance(loc[1], int) and isinstance(data, dict):
        machines = data.get("machines")
        if isinstance(machines, list) and 0 <= loc[1] < len(machines) and isinstance(machines[loc[1]], dict):
            name = machines[loc[1]].get("name")
            if isinstance(name, str) and name:
                return f" (machine {name!r})"
    return ""


def _problems(error: ValidationError, data: object) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for item in error.errors(include_url=False):
        located = (item.get("ctx") or {}).get("error")
        if isinstance(located, _LocatedProblems) and not item["loc"]:
            problems.extend(line for line in located.problems if line not in problems)
            continue
        loc = tuple(item["loc"])
        kind = item["type"]
        message = _MESSAGES.get(kind, item["msg"])
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if kind == "extra_forbidden":
            allowed = _allowed_fields(loc)
            if allowed:
                message += f" (allowed: {', '.join(allowed)})"
        elif kind == "string_pattern_mismatch" and loc and loc[-1] in ("name", "default_machine"):
            message = "must be lowercase letters, digits and inner dashes, 1..40 characters"
        elif kind == "string_pattern_mismatch" and loc == ("project_id",):
            message = "must be lowercase letters, digits, '.', '_' or '-', 1..64 characters"
        elif kind == "string_pattern_mismatch" and loc and loc[-1] == "target":
            message = "must be an absolute path (starting with '/')"
        elif kind == "string_pattern_mismatch" and loc and loc[-1] == "driver":
            message = "must be a driver name: lowercase letters, digits, '_' or '-', at most 63 (see `vz driver list`)"
        path = _json_path(loc, data)
        line = (path, message + _machine_label(loc, data))
        if line not in problems:
            problems.append(line)
    return problems


def parse_definition(data: object, *, source: str = DEFINITION_FILE) -> ProjectDefinition:
    """Validate already-decoded JSON; raise ``DefinitionError`` listing every problem with its JSON path."""
    if not isinstance(data, dict):
        problem = ("$", f"expected a JSON object, got {type(data).__name__}")
        raise DefinitionError(f"{source}: {problem[0]}: {problem[1]}", [problem])
    version = data.get("version")
    if "version" in data and (isinstance(version, bool) or version not in SUPPORTED_VERSIONS):
        given = json.dumps(version)
        given = given if len(given) <= 40 else given[:37] + "..."
        problem = ("$.version", f"this vz reads vz.json versions 1 and 2, not {given}")
        raise DefinitionError(f"{source}: {problem[0]}: {problem[1]} (upgrade vz or fix the file)", [problem])
    try:
        return ProjectDefinition.model_validate(data)
    except ValidationError as exc:
        problems = _problems(exc, data)
        lines = "\n".join(f"  {path}: {message}" for path, message in problems)
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        raise DefinitionError(f"{source} is not a valid project definition ({count}):\n{lines}", problems) from None


def load_definition(path: Path) -> ProjectDefinition:
    """Read and validate a vz.json file (strict JSON: see ``vz_core.env._discover.decode_json``)."""
    from vz_core.env._discover import load_json

    return parse_definition(load_json(path), source=str(path))


def environment_literals(machine: Machine) -> Mapping[str, str]:
    """The literal (non-secret) environment values of a Machine."""
    return {k: v for k, v in machine.environment.items() if isinstance(v, str)}


def _main() -> None:  # python -m vz_core.env._definition > schemas/vz.schema.json
    import sys

    sys.stdout.write(json.dumps(definition_json_schema(), indent=2) + "\n")


if __name__ == "__main__":
    _main()
