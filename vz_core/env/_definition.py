"""The ProjectDefinition: the versioned model of ``vz.json``.

Its parts live below it: the field types in ``_fields``, the Machine and network models in ``_machines``, the
cross-references of the network declarations in ``_network_rules``, the JSON-path errors in ``_json_errors``.

``load_definition(path)`` reads and validates a file and raises ``DefinitionError`` with one line per problem,
each prefixed by its JSON path (``$.machines[0].profile: ...``). ``definition_json_schema()`` is the exported
JSON Schema (``schemas/vz.schema.json`` is generated from it and a test keeps the two equal).

This module imports pydantic, which is slow to import: the hot CLI paths (``vz exec``, ``vz --help``) never
import it (see ``vz_core.env._discover.read_header``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from vz_core.env._errors import DefinitionError
from vz_core.env._fields import (
    AUTO_POOL,
    AUTO_ROOM,
    DEFINITION_FILE,
    DEFINITION_VERSION,
    INT64_MAX,
    MAX_ATTACHMENTS,
    NETWORK_FIELDS,
    RESERVED_DOMAINS,
    RESERVED_ENV,
    RESERVED_PORTS,
    SCHEMA_ID,
    SUPPORTED_VERSIONS,
    Model,
    Name,
    check_egress_destination,
    check_image_reference,
    normalize_target,
)
from vz_core.env._ids import PROJECT_ID_RE
from vz_core.env._json import load_json
from vz_core.env._json_errors import LocatedProblems, located_problems
from vz_core.env._machines import (
    EgressAllowlist,
    EgressPolicy,
    Export,
    Import,
    Machine,
    Mount,
    Network,
    NetworkPath,
    Resources,
    SecretRef,
    Service,
    Target,
    Volume,
    Workspace,
)
from vz_core.env._network_rules import network_problems, unreachable_problems
from vz_core.env._workload_def import workload_problems

__all__ = [
    "AUTO_POOL",
    "AUTO_ROOM",
    "DEFINITION_FILE",
    "DEFINITION_VERSION",
    "INT64_MAX",
    "MAX_ATTACHMENTS",
    "NETWORK_FIELDS",
    "RESERVED_DOMAINS",
    "RESERVED_ENV",
    "RESERVED_PORTS",
    "SCHEMA_ID",
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
    "check_egress_destination",
    "check_image_reference",
    "definition_json_schema",
    "environment_literals",
    "load_definition",
    "migrate_definition",
    "network_problems",
    "normalize_target",
    "parse_definition",
    "unreachable_problems",
]


class ProjectDefinition(Model):
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
            raise LocatedProblems(problems)
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
        problems = located_problems(ProjectDefinition, exc, data)
        lines = "\n".join(f"  {path}: {message}" for path, message in problems)
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        raise DefinitionError(f"{source} is not a valid project definition ({count}):\n{lines}", problems) from None


def load_definition(path: Path) -> ProjectDefinition:
    """Read and validate a vz.json file (strict JSON: see ``vz_core.env._json.decode_json``)."""
    return parse_definition(load_json(path), source=str(path))


def environment_literals(machine: Machine) -> Mapping[str, str]:
    """The literal (non-secret) environment values of a Machine."""
    return {k: v for k, v in machine.environment.items() if isinstance(v, str)}


def _main() -> None:  # python -m vz_core.env._definition > schemas/vz.schema.json
    import sys

    sys.stdout.write(json.dumps(definition_json_schema(), indent=2) + "\n")


if __name__ == "__main__":
    _main()
