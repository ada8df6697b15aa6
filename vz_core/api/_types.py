"""Typed views of the API's JSON objects: each is the wire's dict itself, with typed read-only attributes.

Every class here subclasses ``dict``: ``json.dumps(result)`` prints exactly what the daemon sent, ``result["id"]``
works as before, and ``result.id`` is typed. Nested objects come back typed on access (``Environment.machines``
is a list of ``Machine``). Plain Python only: importing this module imports nothing (the CLI's hot path).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Generic, TypeVar

    _T = TypeVar("_T")
else:  # no `typing` at run time: it costs milliseconds on the CLI's path

    class Generic:
        def __class_getitem__(cls, item: object) -> type:
            return cls

    _T = None

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


class _Key(Generic[_T]):
    """A typed read-only attribute of a wire dict: its value at the attribute's name (``optional``: None when the
    key is absent; else a missing key raises ``KeyError``)."""

    def __init__(self, doc: str, *, optional: bool = False) -> None:
        self.__doc__ = doc
        self.optional = optional
        self.key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    def __get__(self, obj: dict[str, Any] | None, owner: type | None = None) -> _T:
        if obj is None:
            return self  # type: ignore[return-value]  # on the class: the attribute itself (help(), inspect)
        found: Any = obj.get(self.key) if self.optional else obj[self.key]
        value: _T = found
        return value

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(f"{self.key} is read-only (the wire's value: set the key instead)")


class Progress(dict[str, "Any"]):
    """One progress message of a long operation (Up, Stop, Delete): today's `--json` line without "command"."""

    __slots__ = ()

    event: _Key[str] = _Key('"step", "note" or "plan".')
    message: _Key[str] = _Key("The human line (masked).")
    action: _Key[str | None] = _Key(
        "Steps: preflight, create, boot, start, recreate, remove, stop, delete, delete-volume.", optional=True
    )
    status: _Key[str | None] = _Key('Steps: "started", "succeeded" or "failed".', optional=True)
    kind: _Key[str | None] = _Key("Notes: environment-created, waiting, ....", optional=True)
    seconds: _Key[float | None] = _Key("Finished steps: how long they took.", optional=True)
    environment: _Key[str | None] = _Key("The Environment's name.", optional=True)
    environment_id: _Key[str | None] = _Key("The Environment's id.", optional=True)
    machine: _Key[str | None] = _Key("The Machine's name.", optional=True)
    machine_id: _Key[str | None] = _Key("The Machine's id.", optional=True)


class EnvironmentRef(dict[str, "Any"]):
    """An Environment named in a result: id (None for a new one with dry_run), name, recorded state."""

    __slots__ = ()

    id: _Key[str | None] = _Key("The env_... id.", optional=True)
    name: _Key[str | None] = _Key("The name.", optional=True)
    state: _Key[str] = _Key("The recorded state.")


class _OperationResult(dict[str, "Any"]):
    """What the results of Environments.Up, Stop and Delete have in common."""

    __slots__ = ()

    project_id: _Key[str] = _Key("The project.")

    @property
    def environment(self) -> EnvironmentRef:
        """The Environment after the operation (state deleted after Delete)."""
        return EnvironmentRef(self["environment"])

    machines: _Key[list[dict[str, Any]]] = _Key(
        "Id, name, state of each Machine (after Up also workspace_id, driver, default)."
    )


class UpResult(_OperationResult):
    """The result of Environments.Up (`vz up --json`'s result)."""

    __slots__ = ()

    dry_run: _Key[bool] = _Key("Nothing was changed.")
    plan: _Key[dict[str, Any]] = _Key("The plan (steps, default_machine, blocked).")
    plan_lines: _Key[list[str]] = _Key("The plan as human lines.")


class _RecordedResult(_OperationResult):
    """The results of Environments.Stop and Delete: an operation's outcome with its record."""

    __slots__ = ()

    operation_id: _Key[str] = _Key("The operation record (after Delete: removed with the history).")


class StopResult(_RecordedResult):
    """The result of Environments.Stop."""

    __slots__ = ()


class DeleteResult(_RecordedResult):
    """The result of Environments.Delete: what was removed and what was kept."""

    __slots__ = ()

    volumes: _Key[list[dict[str, Any]]] = _Key("Each named volume: name, volume, machine_id, driver, state, reason.")
    bindings: _Key[list[str]] = _Key("The worktree bindings removed.")
    operations_removed: _Key[int] = _Key("Operation records removed.")


class Machine(dict[str, "Any"]):
    """A Machine's status row (`vz status --json`), with live health."""

    __slots__ = ()

    id: _Key[str] = _Key("The mch_... id.")
    name: _Key[str] = _Key("The name.")
    workspace_id: _Key[str] = _Key("The id its driver knows it by.")
    default: _Key[bool] = _Key("It is the Environment's default Machine.")
    target: _Key[dict[str, Any]] = _Key("Os and arch.")
    profile: _Key[str | None] = _Key("The recorded profile.", optional=True)
    image: _Key[str | None] = _Key("The recorded image.", optional=True)
    workspace: _Key[dict[str, Any] | None] = _Key("The recorded workspace settings.", optional=True)
    driver: _Key[dict[str, Any]] = _Key("The negotiated driver, or name/error/matrix.")
    state: _Key[str] = _Key("What the driver reports now: running, stopped, missing, unknown.")
    recorded_state: _Key[str] = _Key("What vz recorded.")
    find: _Key[dict[str, Any] | None] = _Key("The driver's Find answer.", optional=True)
    error: _Key[str | None] = _Key("Why the driver could not be asked.", optional=True)
    drift: _Key[dict[str, Any]] = _Key("Vz.json compared with the record.")
    health: _Key[dict[str, Any] | None] = _Key("Source, state, checked_at, error.", optional=True)


class Volume(dict[str, "Any"]):
    """A named volume vz kept."""

    __slots__ = ()

    name: _Key[str] = _Key("The driver's volume name.")
    volume: _Key[str] = _Key("Its name in vz.json.")
    project_id: _Key[str] = _Key("The project.")
    environment_id: _Key[str] = _Key("The Environment it belonged to.")
    machine_id: _Key[str] = _Key("The Machine it belonged to.")
    driver: _Key[str] = _Key("Its driver.")
    state: _Key[str] = _Key("Kept or removed.")
    created_at: _Key[str] = _Key("RFC 3339 creation time.")


class Event(dict[str, "Any"]):
    """A numbered event: watch from its revision to resume after it."""

    __slots__ = ()

    revision: _Key[int] = _Key("Increasing, never reused, kept across daemon restarts.")
    time: _Key[str] = _Key("RFC 3339 time.")
    kind: _Key[str] = _Key("environment.updated, machine.state, operation.started, operation.finished, ...")
    environment_id: _Key[str | None] = _Key("The Environment it is about.", optional=True)
    machine_id: _Key[str | None] = _Key("The Machine it is about.", optional=True)
    data: _Key[dict[str, Any]] = _Key("Free-form data of the kind.")


class DaemonStatus(dict[str, "Any"]):
    """The daemon's status (System.Status)."""

    __slots__ = ()

    pid: _Key[int] = _Key("Its process id.")
    version: _Key[str] = _Key("The vz version it runs.")
    fingerprint: _Key[str] = _Key("What clients compare at connect.")
    started: _Key[str] = _Key("RFC 3339 start time.")
    uptime_seconds: _Key[float] = _Key("Seconds since it started.")
    busy: _Key[bool] = _Key("A Machine operation is in flight.")
    plugins: _Key[list[dict[str, Any]]] = _Key("Its driver plugin sessions.")
    operations: _Key[list[dict[str, Any]]] = _Key("The operations in flight.")
    socket: _Key[str | None] = _Key("The socket it listens on.", optional=True)
    home: _Key[str | None] = _Key("The state directory it serves.", optional=True)


class Capability(dict[str, "Any"]):
    """One driver's negotiated facts (System.Capabilities), or why it could not be negotiated."""

    __slots__ = ()

    name: _Key[str] = _Key("The driver's name.")
    facts: _Key[dict[str, Any] | None] = _Key("Info, capabilities, extensions, accelerator.", optional=True)
    error: _Key[dict[str, Any] | None] = _Key("Code and message when it failed.", optional=True)


class Environment(dict[str, "Any"]):
    """One Environment of a status report (`vz status --json`), with live health."""

    __slots__ = ()

    id: _Key[str] = _Key("The env_... id.")
    name: _Key[str] = _Key("The name.")
    project_id: _Key[str] = _Key("The project.")
    state: _Key[str] = _Key("What vz recorded: creating, running, stopped, deleting, failed.")
    worktree: _Key[str] = _Key("The worktree it was created from.")
    bound_worktrees: _Key[list[str]] = _Key("Every worktree bound to it.")
    default_machine: _Key[str | None] = _Key("The recorded default Machine.", optional=True)

    @property
    def machines(self) -> list[Machine]:
        """Its Machines."""
        return [Machine(m) for m in self.get("machines") or ()]

    last_operation: _Key[dict[str, Any] | None] = _Key("The last operation record.", optional=True)
    drift: _Key[dict[str, Any]] = _Key("vz.json compared with what the last up applied.")
    health: _Key[dict[str, Any] | None] = _Key(
        "Source, state (running, stopped, degraded, unknown, empty) and checked_at.", optional=True
    )


class StatusReport(dict[str, "Any"]):
    """The `vz status --json` document (Environments.Get and Environments.List)."""

    __slots__ = ()

    schema: _Key[str] = _Key('The document\'s schema, "vz.status/1".')
    project: _Key[dict[str, Any] | None] = _Key(
        "The project found from the context (id, definition, definition_error), or None.", optional=True
    )

    @property
    def environments(self) -> list[Environment]:
        """The Environments."""
        return [Environment(e) for e in self.get("environments") or ()]


from vz_core.api._exec_result import ExecResult  # noqa: E402  (shared with the exec path, which avoids this module)
