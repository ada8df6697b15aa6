"""`vz exec --detach`: start the command in the background and return, as `docker exec --detach` does.

The Machine is selected and checked first (an unknown Machine, or one that is not running, fails here with
the usual message and exit code). The command then starts with stdin, stdout and stderr on ``/dev/null``; a
background `vz` process of its own session holds the call to its end (the daemon ends a command whose caller
hung up) and discards the result, and this process exits 0 at once, leaving the caller's descriptors.
The command runs until it exits, is killed in the Machine, the Machine stops, or the vz daemon stops
(`vz daemon stop`: the daemon ends the commands it runs).
"""

from __future__ import annotations

import os
import sys

# POSIX only (fork, setsid, descriptors handed to the daemon): `vz exec` refuses before this on Windows
# (vz_core.cli._exec.WINDOWS_EXEC). mypy skips the rest of this file for win32.
assert sys.platform != "win32", "vz exec --detach does not run on Windows"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["run_detached"]


def _selected_machine(client: Any, context: dict[str, Any], environment: str | None, machine: str | None) -> Any:
    """The Machine row the exec would use, or None when no default Machine exists (the exec then says why)."""
    explicit = machine or context["environ"].get("VZ_MACHINE_ID") or None
    if explicit is not None:
        return client.machine(explicit, environment=environment, context=context)
    rows = client.machines(environment, context=context)
    return next((row for row in rows if row.get("default")), None)


def run_detached(
    client: Any,
    *,
    context: dict[str, Any],
    argv: list[str],
    environment: str | None,
    machine: str | None,
    workdir: str | None,
    env: dict[str, str] | None,
    user: str | None,
) -> int:
    """Start ``argv`` detached (see the module docstring); 0 once it is handed to the daemon."""
    row = _selected_machine(client, context, environment, machine)
    if row is not None and row.get("state") != "running":
        from vz_core.errors import FailedPreconditionError

        env_name = (row.get("environment") or {}).get("name") or environment or ""
        again = f"vz up --environment {env_name}" if env_name else "vz up"
        raise FailedPreconditionError(
            f"machine {row.get('name')} is not running (its driver reports {row.get('state')}); run `{again}` to "
            "start it"
        )
    null = os.open(os.devnull, os.O_RDWR)
    try:
        call = client.open_exec(
            argv,
            context=context,
            environment=environment,
            machine=machine,
            workdir=workdir,
            env=env,
            user=user,
            stdio=(null, null, null),
        )
        call.close_stdin()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() != 0:
            os._exit(0)  # the parent: the call is the child's now (nothing of it is closed or sent from here)
        os.setsid()
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    finally:
        os.close(null)
    try:  # the child: hold the call to its end, then leave without a trace
        while call.receive()[0] != "result":
            pass
    except BaseException:  # nobody is listening: whatever ended the call, end quietly
        pass
    os._exit(0)
