"""Typed views of the API's JSON objects: each is the wire's dict itself, with typed read-only attributes.

Every class here subclasses ``dict``: ``json.dumps(result)`` prints exactly what the daemon sent, ``result["id"]``
works as before, and ``result.id`` is typed. Nested objects come back typed on access (``Environment.machines``
is a list of ``Machine``). Plain Python only: importing this module imports nothing (the CLI's hot path).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "Capability",
    "DaemonStatus",
    "DeleteResult",
    "Environment",
    "EnvironmentRef",
    "Event",
    "ExecResult",
    "Machine",
    "Progress",
    "StatusReport",
    "StopResult",
    "UpResult",
    "Volume",
]


class Progress(dict[str, "Any"]):
    """One progress message of a long operation (Up, Stop, Delete): today's `--json` line without "command"."""

    __slots__ = ()

    @property
    def event(self) -> str:
        """ "step", "note" or "plan"."""
        value: str = self["event"]
        return value

    @property
    def message(self) -> str:
        """The human line (masked)."""
        value: str = self["message"]
        return value

    @property
    def action(self) -> str | None:
        """Steps: preflight, create, boot, start, recreate, remove, stop, delete, delete-volume."""
        value: str | None = self.get("action")
        return value

    @property
    def status(self) -> str | None:
        """Steps: "started", "succeeded" or "failed"."""
        value: str | None = self.get("status")
        return value

    @property
    def kind(self) -> str | None:
        """Notes: environment-created, waiting, ...."""
        value: str | None = self.get("kind")
        return value

    @property
    def seconds(self) -> float | None:
        """Finished steps: how long they took."""
        value: float | None = self.get("seconds")
        return value

    @property
    def environment(self) -> str | None:
        """The Environment's name."""
        value: str | None = self.get("environment")
        return value

    @property
    def environment_id(self) -> str | None:
        """The Environment's id."""
        value: str | None = self.get("environment_id")
        return value

    @property
    def machine(self) -> str | None:
        """The Machine's name."""
        value: str | None = self.get("machine")
        return value

    @property
    def machine_id(self) -> str | None:
        """The Machine's id."""
        value: str | None = self.get("machine_id")
        return value


class EnvironmentRef(dict[str, "Any"]):
    """An Environment named in a result: id (None for a new one with dry_run), name, recorded state."""

    __slots__ = ()

    @property
    def id(self) -> str | None:
        """The env_... id."""
        value: str | None = self.get("id")
        return value

    @property
    def name(self) -> str | None:
        """The name."""
        value: str | None = self.get("name")
        return value

    @property
    def state(self) -> str:
        """The recorded state."""
        value: str = self["state"]
        return value


class _OperationResult(dict[str, "Any"]):
    """What the results of Environments.Up, Stop and Delete have in common."""

    __slots__ = ()

    @property
    def project_id(self) -> str:
        """The project."""
        value: str = self["project_id"]
        return value

    @property
    def environment(self) -> EnvironmentRef:
        """The Environment after the operation (state deleted after Delete)."""
        return EnvironmentRef(self["environment"])

    @property
    def machines(self) -> list[dict[str, Any]]:
        """Id, name, state of each Machine (after Up also workspace_id, driver, default)."""
        value: list[dict[str, Any]] = self["machines"]
        return value


class UpResult(_OperationResult):
    """The result of Environments.Up (`vz up --json`'s result)."""

    __slots__ = ()

    @property
    def dry_run(self) -> bool:
        """Nothing was changed."""
        value: bool = self["dry_run"]
        return value

    @property
    def plan(self) -> dict[str, Any]:
        """The plan (steps, default_machine, blocked)."""
        value: dict[str, Any] = self["plan"]
        return value

    @property
    def plan_lines(self) -> list[str]:
        """The plan as human lines."""
        value: list[str] = self["plan_lines"]
        return value


class _RecordedResult(_OperationResult):
    """The results of Environments.Stop and Delete: an operation's outcome with its record."""

    __slots__ = ()

    @property
    def operation_id(self) -> str:
        """The operation record (after Delete: removed with the history)."""
        value: str = self["operation_id"]
        return value


class StopResult(_RecordedResult):
    """The result of Environments.Stop."""

    __slots__ = ()


class DeleteResult(_RecordedResult):
    """The result of Environments.Delete: what was removed and what was kept."""

    __slots__ = ()

    @property
    def volumes(self) -> list[dict[str, Any]]:
        """Each named volume: name, volume, machine_id, driver, state, reason."""
        value: list[dict[str, Any]] = self["volumes"]
        return value

    @property
    def bindings(self) -> list[str]:
        """The worktree bindings removed."""
        value: list[str] = self["bindings"]
        return value

    @property
    def operations_removed(self) -> int:
        """Operation records removed."""
        value: int = self["operations_removed"]
        return value


class Machine(dict[str, "Any"]):
    """A Machine's status row (`vz status --json`), with live health."""

    __slots__ = ()

    @property
    def id(self) -> str:
        """The mch_... id."""
        value: str = self["id"]
        return value

    @property
    def name(self) -> str:
        """The name."""
        value: str = self["name"]
        return value

    @property
    def workspace_id(self) -> str:
        """The id its driver knows it by."""
        value: str = self["workspace_id"]
        return value

    @property
    def default(self) -> bool:
        """It is the Environment's default Machine."""
        value: bool = self["default"]
        return value

    @property
    def target(self) -> dict[str, Any]:
        """Os and arch."""
        value: dict[str, Any] = self["target"]
        return value

    @property
    def profile(self) -> str | None:
        """The recorded profile."""
        value: str | None = self.get("profile")
        return value

    @property
    def image(self) -> str | None:
        """The recorded image."""
        value: str | None = self.get("image")
        return value

    @property
    def workspace(self) -> dict[str, Any] | None:
        """The recorded workspace settings."""
        value: dict[str, Any] | None = self.get("workspace")
        return value

    @property
    def driver(self) -> dict[str, Any]:
        """The negotiated driver, or name/error/matrix."""
        value: dict[str, Any] = self["driver"]
        return value

    @property
    def state(self) -> str:
        """What the driver reports now: running, stopped, missing, unknown."""
        value: str = self["state"]
        return value

    @property
    def recorded_state(self) -> str:
        """What vz recorded."""
        value: str = self["recorded_state"]
        return value

    @property
    def find(self) -> dict[str, Any] | None:
        """The driver's Find answer."""
        value: dict[str, Any] | None = self.get("find")
        return value

    @property
    def error(self) -> str | None:
        """Why the driver could not be asked."""
        value: str | None = self.get("error")
        return value

    @property
    def drift(self) -> dict[str, Any]:
        """Vz.json compared with the record."""
        value: dict[str, Any] = self["drift"]
        return value

    @property
    def health(self) -> dict[str, Any] | None:
        """Source, state, checked_at, error."""
        value: dict[str, Any] | None = self.get("health")
        return value


class Volume(dict[str, "Any"]):
    """A named volume vz kept."""

    __slots__ = ()

    @property
    def name(self) -> str:
        """The driver's volume name."""
        value: str = self["name"]
        return value

    @property
    def volume(self) -> str:
        """Its name in vz.json."""
        value: str = self["volume"]
        return value

    @property
    def project_id(self) -> str:
        """The project."""
        value: str = self["project_id"]
        return value

    @property
    def environment_id(self) -> str:
        """The Environment it belonged to."""
        value: str = self["environment_id"]
        return value

    @property
    def machine_id(self) -> str:
        """The Machine it belonged to."""
        value: str = self["machine_id"]
        return value

    @property
    def driver(self) -> str:
        """Its driver."""
        value: str = self["driver"]
        return value

    @property
    def state(self) -> str:
        """Kept or removed."""
        value: str = self["state"]
        return value

    @property
    def created_at(self) -> str:
        """RFC 3339 creation time."""
        value: str = self["created_at"]
        return value


class Event(dict[str, "Any"]):
    """A numbered event: watch from its revision to resume after it."""

    __slots__ = ()

    @property
    def revision(self) -> int:
        """Increasing, never reused, kept across daemon restarts."""
        value: int = self["revision"]
        return value

    @property
    def time(self) -> str:
        """RFC 3339 time."""
        value: str = self["time"]
        return value

    @property
    def kind(self) -> str:
        """environment.updated, machine.state, operation.started, operation.finished, ..."""
        value: str = self["kind"]
        return value

    @property
    def environment_id(self) -> str | None:
        """The Environment it is about."""
        value: str | None = self.get("environment_id")
        return value

    @property
    def machine_id(self) -> str | None:
        """The Machine it is about."""
        value: str | None = self.get("machine_id")
        return value

    @property
    def data(self) -> dict[str, Any]:
        """Free-form data of the kind."""
        value: dict[str, Any] = self["data"]
        return value


class DaemonStatus(dict[str, "Any"]):
    """The daemon's status (System.Status)."""

    __slots__ = ()

    @property
    def pid(self) -> int:
        """Its process id."""
        value: int = self["pid"]
        return value

    @property
    def version(self) -> str:
        """The vz version it runs."""
        value: str = self["version"]
        return value

    @property
    def fingerprint(self) -> str:
        """What clients compare at connect."""
        value: str = self["fingerprint"]
        return value

    @property
    def started(self) -> str:
        """RFC 3339 start time."""
        value: str = self["started"]
        return value

    @property
    def uptime_seconds(self) -> float:
        """Seconds since it started."""
        value: float = self["uptime_seconds"]
        return value

    @property
    def busy(self) -> bool:
        """A Machine operation is in flight."""
        value: bool = self["busy"]
        return value

    @property
    def plugins(self) -> list[dict[str, Any]]:
        """Its driver plugin sessions."""
        value: list[dict[str, Any]] = self["plugins"]
        return value

    @property
    def operations(self) -> list[dict[str, Any]]:
        """The operations in flight."""
        value: list[dict[str, Any]] = self["operations"]
        return value

    @property
    def socket(self) -> str | None:
        """The socket it listens on."""
        value: str | None = self.get("socket")
        return value

    @property
    def home(self) -> str | None:
        """The state directory it serves."""
        value: str | None = self.get("home")
        return value


class Capability(dict[str, "Any"]):
    """One driver's negotiated facts (System.Capabilities), or why it could not be negotiated."""

    __slots__ = ()

    @property
    def name(self) -> str:
        """The driver's name."""
        value: str = self["name"]
        return value

    @property
    def facts(self) -> dict[str, Any] | None:
        """Info, capabilities, extensions, accelerator."""
        value: dict[str, Any] | None = self.get("facts")
        return value

    @property
    def error(self) -> dict[str, Any] | None:
        """Code and message when it failed."""
        value: dict[str, Any] | None = self.get("error")
        return value


class Environment(dict[str, "Any"]):
    """One Environment of a status report (`vz status --json`), with live health."""

    __slots__ = ()

    @property
    def id(self) -> str:
        """The env_... id."""
        value: str = self["id"]
        return value

    @property
    def name(self) -> str:
        """The name."""
        value: str = self["name"]
        return value

    @property
    def project_id(self) -> str:
        """The project."""
        value: str = self["project_id"]
        return value

    @property
    def state(self) -> str:
        """What vz recorded: creating, running, stopped, deleting, failed."""
        value: str = self["state"]
        return value

    @property
    def worktree(self) -> str:
        """The worktree it was created from."""
        value: str = self["worktree"]
        return value

    @property
    def bound_worktrees(self) -> list[str]:
        """Every worktree bound to it."""
        value: list[str] = self["bound_worktrees"]
        return value

    @property
    def default_machine(self) -> str | None:
        """The recorded default Machine."""
        value: str | None = self.get("default_machine")
        return value

    @property
    def machines(self) -> list[Machine]:
        """Its Machines."""
        return [Machine(m) for m in self.get("machines") or ()]

    @property
    def last_operation(self) -> dict[str, Any] | None:
        """The last operation record."""
        value: dict[str, Any] | None = self.get("last_operation")
        return value

    @property
    def drift(self) -> dict[str, Any]:
        """vz.json compared with what the last up applied."""
        value: dict[str, Any] = self["drift"]
        return value

    @property
    def health(self) -> dict[str, Any] | None:
        """Source, state (running, stopped, degraded, unknown, empty) and checked_at."""
        value: dict[str, Any] | None = self.get("health")
        return value


class StatusReport(dict[str, "Any"]):
    """The `vz status --json` document (Environments.Get and Environments.List)."""

    __slots__ = ()

    @property
    def schema(self) -> str:
        """The document's schema, "vz.status/1"."""
        value: str = self["schema"]
        return value

    @property
    def project(self) -> dict[str, Any] | None:
        """The project found from the context (id, definition, definition_error), or None."""
        value: dict[str, Any] | None = self.get("project")
        return value

    @property
    def environments(self) -> list[Environment]:
        """The Environments."""
        return [Environment(e) for e in self.get("environments") or ()]


from vz_core.api._client import ExecResult  # noqa: E402  (defined with the exec path, which avoids this module)
