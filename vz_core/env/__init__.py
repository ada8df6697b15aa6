"""Developer Environments: the project definition, identity and selection, the state store, reconciliation.

Importing this package is cheap: names are loaded on first use, so the hot CLI paths (``vz exec``) never pay
for pydantic. The public surface:

* definition: ``ProjectDefinition`` (and its parts, ``EgressPolicy``), ``load_definition``, ``parse_definition``,
  ``definition_json_schema``, ``find_definition``, ``migrate_definition``, ``network_problems``;
* network topology: ``compile_topology`` → ``TopologyPlan``;
* identity and selection: ``workspace_id``, ``select_environment``, ``select_machine``;
* state: ``Store`` with its records, ``MIGRATIONS``;
* reconciliation: ``compute_plan``, ``Plan``, ``Step``, ``Change``;
* operations: ``Context`` (``learn_project_secrets``: the project's secret values, to mask what a caller
  supplied), ``Progress``, ``up``, ``status`` (``STATUS_SCHEMA``), ``stop``, ``delete``;
  kept volumes: ``list_volumes``, ``remove_volume``;
* exec: ``prepare_exec`` (selection, fast) then ``execute`` (driver, ExecSpec, stream, errors translated once),
  ``ExecTarget``, ``OutputSink``; on descriptors (the daemon's local exec, ``Driver.exec_local``):
  ``execute_local``; a terminal session (`vz exec -t`):
  ``execute_terminal``, ``TerminalSink``; a Machine's log: ``execute_logs``, ``LogSink``;
* status: ``status`` and its live-health summary ``environment_health``;
* drivers: ``acquire_driver`` (the one place a Driver is obtained), ``DriverPool``, ``DriverFacts``;
* errors: ``DefinitionError``, ``DefinitionNotFoundError``, ``PlanError``, ``ConflictError``,
  ``SelectionNotFoundError``, ``AmbiguousSelectionError``, ``UnboundWorktreeError``, ``StoreError``, ``StoreBusyError``.

Modules, by concern: ``_context`` (Context, project/Environment selection, store, locks, secrets to mask),
``_up`` (up and reconcile), ``_lifecycle`` (stop, delete), ``_status``, ``_exec``; below them ``_definition``,
``_discover``, ``_plan``, ``_select``, ``_store``, ``_locks``, ``_ids``, ``_drivers``, ``_secrets``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vz_core._lazy import lazy_names

if TYPE_CHECKING:
    from vz_core.env._context import Context, learn_project_secrets
    from vz_core.env._definition import (
        EgressPolicy,
        Machine,
        ProjectDefinition,
        SecretRef,
        definition_json_schema,
        load_definition,
        migrate_definition,
        network_problems,
        parse_definition,
    )
    from vz_core.env._discover import find_definition
    from vz_core.env._drivers import DriverFacts, DriverPool, acquire_driver
    from vz_core.env._errors import (
        AmbiguousSelectionError,
        ConflictError,
        DefinitionError,
        DefinitionNotFoundError,
        PlanError,
        SelectionNotFoundError,
        UnboundWorktreeError,
    )
    from vz_core.env._exec import (
        ExecTarget,
        LogSink,
        OutputSink,
        TerminalSink,
        execute,
        execute_local,
        execute_logs,
        execute_terminal,
        prepare_exec,
    )
    from vz_core.env._ids import workspace_id
    from vz_core.env._lifecycle import delete, stop
    from vz_core.env._plan import Change, Plan, Step, compute_plan
    from vz_core.env._progress import Progress
    from vz_core.env._select import select_environment, select_machine
    from vz_core.env._service_logs import execute_service_logs
    from vz_core.env._status import STATUS_SCHEMA, environment_health, status
    from vz_core.env._store import (
        MIGRATIONS,
        EnvironmentRecord,
        MachineRecord,
        OperationRecord,
        Store,
        StoreBusyError,
        StoreError,
    )
    from vz_core.env._topology import TopologyPlan, compile_topology
    from vz_core.env._up import up
    from vz_core.env._volumes import list_volumes, remove_volume

_WHERE = {
    "EgressPolicy": "_definition",
    "migrate_definition": "_definition",
    "network_problems": "_definition",
    "TopologyPlan": "_topology",
    "compile_topology": "_topology",
    "Machine": "_definition",
    "ProjectDefinition": "_definition",
    "SecretRef": "_definition",
    "definition_json_schema": "_definition",
    "load_definition": "_definition",
    "parse_definition": "_definition",
    "find_definition": "_discover",
    "DriverFacts": "_drivers",
    "DriverPool": "_drivers",
    "acquire_driver": "_drivers",
    "Context": "_context",
    "learn_project_secrets": "_context",
    "ExecTarget": "_exec",
    "LogSink": "_exec",
    "execute_local": "_exec",
    "execute_logs": "_exec",
    "execute_service_logs": "_service_logs",
    "environment_health": "_status",
    "OutputSink": "_exec",
    "TerminalSink": "_exec",
    "execute_terminal": "_exec",
    "execute": "_exec",
    "prepare_exec": "_exec",
    "delete": "_lifecycle",
    "stop": "_lifecycle",
    "STATUS_SCHEMA": "_status",
    "status": "_status",
    "up": "_up",
    "list_volumes": "_volumes",
    "remove_volume": "_volumes",
    "AmbiguousSelectionError": "_errors",
    "ConflictError": "_errors",
    "DefinitionError": "_errors",
    "DefinitionNotFoundError": "_errors",
    "PlanError": "_errors",
    "SelectionNotFoundError": "_errors",
    "UnboundWorktreeError": "_errors",
    "workspace_id": "_ids",
    "Change": "_plan",
    "Plan": "_plan",
    "Step": "_plan",
    "compute_plan": "_plan",
    "Progress": "_progress",
    "select_environment": "_select",
    "select_machine": "_select",
    "MIGRATIONS": "_store",
    "EnvironmentRecord": "_store",
    "MachineRecord": "_store",
    "OperationRecord": "_store",
    "Store": "_store",
    "StoreBusyError": "_store",
    "StoreError": "_store",
}

__all__ = [
    "MIGRATIONS",
    "STATUS_SCHEMA",
    "AmbiguousSelectionError",
    "Change",
    "ConflictError",
    "Context",
    "DefinitionError",
    "DefinitionNotFoundError",
    "DriverFacts",
    "DriverPool",
    "EgressPolicy",
    "EnvironmentRecord",
    "ExecTarget",
    "LogSink",
    "Machine",
    "MachineRecord",
    "OperationRecord",
    "OutputSink",
    "Plan",
    "PlanError",
    "Progress",
    "ProjectDefinition",
    "SecretRef",
    "SelectionNotFoundError",
    "Step",
    "Store",
    "StoreBusyError",
    "StoreError",
    "TerminalSink",
    "TopologyPlan",
    "UnboundWorktreeError",
    "acquire_driver",
    "compile_topology",
    "compute_plan",
    "definition_json_schema",
    "delete",
    "environment_health",
    "execute",
    "execute_local",
    "execute_logs",
    "execute_service_logs",
    "execute_terminal",
    "find_definition",
    "learn_project_secrets",
    "list_volumes",
    "load_definition",
    "migrate_definition",
    "network_problems",
    "parse_definition",
    "prepare_exec",
    "remove_volume",
    "select_environment",
    "select_machine",
    "status",
    "stop",
    "up",
    "workspace_id",
]


__getattr__ = lazy_names(__name__, _WHERE)


def __dir__() -> list[str]:
    return __all__
