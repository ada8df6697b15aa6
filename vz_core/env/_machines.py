"""The models of one Machine and of the network declarations of ``vz.json`` (version 2; docs/network.md).

Each model checks what one object can see; the cross-references between them are ``_network_rules``'s."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, field_validator, model_validator

from vz_core.env._fields import (
    ENV_NAME_RE,
    RESERVED_ENV,
    SUBNET_RANGES,
    AbsolutePath,
    DriverName,
    EgressDestination,
    ImageReference,
    Model,
    Name,
    OptionValue,
    Port,
    Protocol,
    Size,
    UserName,
    is_network,
    network_key,
    normalize_target,
)
from vz_core.env._workload_def import Command, DependsOn, Duration, HealthDef, RestartValue, SetupStep
from vz_core.rules import DEFAULT_PIDS, MAX_PIDS, MIN_PIDS


class Target(Model):
    """What the Machine runs: an operating system and a CPU architecture."""

    os: Literal["linux", "darwin", "windows"] = Field(default="linux", description="guest operating system")
    arch: Literal["amd64", "arm64"] | None = Field(
        default=None, description="guest architecture; omitted = the architecture the driver runs natively here"
    )


class Resources(Model):
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


class Workspace(Model):
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


class Mount(Model):
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


class Volume(Model):
    """A named volume owned by this Machine of this Environment; it survives recreation."""

    name: Name
    target: AbsolutePath
    read_only: bool = False


class SecretRef(Model):
    """A secret resolved from the caller's environment at `vz up` time; its value is never stored or printed."""

    from_env: Annotated[str, Field(pattern=ENV_NAME_RE.pattern, description="environment variable of the caller")]


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


class EgressAllowlist(Model):
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


class Service(Model):
    """A service a Machine offers; only Machines with a declared path to it reach it (version 2). With a
    ``command`` the Machine's agent runs and supervises it (docs/user-guide.md, "Services that run")."""

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
            if not ENV_NAME_RE.fullmatch(key):
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
    if not any(net.subnet_of(r) for r in SUBNET_RANGES):
        raise ValueError(
            f"{value!r} is not inside a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10)"
        )
    if not 8 <= net.prefixlen <= 29:
        raise ValueError(f"{value!r}: a network's prefix is /8 to /29 (a gateway and at least one Machine)")
    return str(net)


class Network(Model):
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


class NetworkPath(Model):
    """A declared path: Machine ``from`` may open connections to one service of Machine ``to`` (version 2)."""

    source: Name = Field(alias="from", description="the Machine that connects")
    to: Name = Field(description="the Machine that offers the service")
    service: Name | None = Field(default=None, description="the service's name (or give port and protocol)")
    port: Port | None = Field(default=None, description="the service's port, instead of its name")
    protocol: Protocol | None = Field(default=None, description="with port: tcp (default) or udp")


class Export(Model):
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


class Import(Model):
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


class Machine(Model):
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
            if not ENV_NAME_RE.fullmatch(key):
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
            cidrs = sorted({v for v in value.allow if is_network(v)}, key=network_key)
            domains = sorted({v for v in value.allow if not is_network(v)})
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
