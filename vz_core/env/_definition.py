"""The ProjectDefinition: the versioned model of ``vz.json``.

``load_definition(path)`` reads and validates a file and raises ``DefinitionError`` with one line per problem,
each prefixed by its JSON path (``$.machines[0].profile: ...``). ``definition_json_schema()`` is the exported
JSON Schema (``schemas/vz.schema.json`` is generated from it and a test keeps the two equal).

This module imports pydantic, which is slow to import: the hot CLI paths (``vz exec``, ``vz --help``) never
import it (see ``vz_core.env._discover.read_header``).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
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
from vz_core.registry import DRIVER_NAME_PATTERN
from vz_core.rules import (
    DIGEST_RE,
    HOST_RE,
    PATH_COMPONENT_RE,
    TAG_RE,
    names_registry_host,
    reserved_target,
)

__all__ = [
    "DEFINITION_FILE",
    "DEFINITION_VERSION",
    "Machine",
    "Mount",
    "ProjectDefinition",
    "Resources",
    "SecretRef",
    "Target",
    "Volume",
    "Workspace",
    "definition_json_schema",
    "load_definition",
    "parse_definition",
]

DEFINITION_FILE = "vz.json"
DEFINITION_VERSION = 1
SCHEMA_ID = "urn:vz:schema:project-definition:1"

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
OptionValue = str | Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)] | bool


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Target(_Model):
    """What the Machine runs: an operating system and a CPU architecture."""

    os: Literal["linux", "darwin", "windows"] = Field(default="linux", description="guest operating system")
    arch: Literal["amd64", "arm64"] | None = Field(
        default=None, description="guest architecture; omitted = the architecture the driver runs natively here"
    )


class Resources(_Model):
    """Requested resources; omitted values are the driver's defaults."""

    cpus: Annotated[int, Field(gt=0, le=1024)] | None = Field(default=None, description="number of CPUs")
    memory: Size | None = Field(default=None, description="memory size")
    disk: Size | None = Field(default=None, description="root disk size")

    def requested(self) -> bool:
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
    egress: Literal["allow", "deny"] = Field(default="allow", description="outbound network policy")
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
        workspace = data.get("workspace")
        if isinstance(workspace, dict):
            workspace.pop("sharing", None)
        return data


class ProjectDefinition(_Model):
    """A project's vz.json (version 1)."""

    schema_: str | None = Field(default=None, alias="$schema", description="optional path or URI of this schema")
    version: Literal[1] = Field(description="definition format version; this vz reads version 1")
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


def definition_json_schema() -> dict[str, Any]:
    """The JSON Schema of vz.json version 1 (what ``schemas/vz.schema.json`` holds)."""
    schema = ProjectDefinition.model_json_schema(by_alias=True, mode="validation")
    out: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "vz project definition (vz.json)",
    }
    out.update(schema)
    out["title"] = "vz project definition (vz.json)"
    return out


# --- errors with JSON paths ---------------------------------------------------------------------------------

_MESSAGES = {
    "missing": "required field is missing",
    "extra_forbidden": "unknown field",
}


_TAGS = ("literal", "secret")  # discriminator tags of EnvValue that pydantic puts in error locations


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
    if "version" in data and version != DEFINITION_VERSION:
        given = json.dumps(version)
        given = given if len(given) <= 40 else given[:37] + "..."
        problem = ("$.version", f"this vz reads vz.json version {DEFINITION_VERSION}, not {given}")
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
