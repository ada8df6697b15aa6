"""The field types of ``vz.json`` and the checks behind them: names, paths, sizes, image references, egress
destinations, and the constants the definition's rules are written in (``vz_core.env._definition`` assembles
them into the model)."""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from vz_core.env._ids import NAME_RE
from vz_core.registry import DRIVER_NAME_PATTERN
from vz_core.rules import (
    DIGEST_RE,
    EMBEDDED_IMAGES,
    HOST_RE,
    PATH_COMPONENT_RE,
    TAG_RE,
    names_registry_host,
    reserved_target,
)

DEFINITION_FILE = "vz.json"
DEFINITION_VERSION = 2
"""The newest vz.json format: version 2 adds the network declarations (docs/network.md)."""
SUPPORTED_VERSIONS = (1, 2)
"""Every format this vz reads. A version 1 file keeps exactly its version 1 meaning (see ``migrate_definition``)."""
SCHEMA_ID = "urn:vz:schema:project-definition:2"
NETWORK_FIELDS = ("networks", "paths", "exports", "imports")
"""Top-level fields that exist from version 2 on (a version 1 file naming one is refused, never ignored)."""

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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
    drivers before anything is created or compared. Only the syntax, and the names of the embedded ``vz:``
    images: whether any other image exists is the driver's answer.
    """
    if len(ref) > 1024:
        raise ValueError("an image reference is at most 1024 characters")
    if _CONTROL_RE.search(ref):
        raise ValueError(f"an image reference contains no whitespace or control characters; {_IMAGE_FORMS}")
    if ref.startswith("vz:"):
        if not _IMAGE_NAME_RE.fullmatch(ref[3:]):
            raise ValueError(f"{ref!r}: the name after 'vz:' is lowercase letters, digits, '.', '_' or '-'")
        if ref[3:] not in EMBEDDED_IMAGES:
            known = ", ".join(f"vz:{name}" for name in EMBEDDED_IMAGES)
            raise ValueError(f"there is no embedded image {ref!r}; the embedded images are: {known}")
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


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


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
SUBNET_RANGES = tuple(
    ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
)


def is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text)
    except ValueError:
        return False
    return True


def network_key(text: str) -> tuple[int, int, int]:
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
