"""One service's output (``vz status --logs --service S``, ``Machines.Logs`` with ``service``).

The Machine's agent keeps the newest few MiB of each service's output (stdout and stderr merged), across the
service's restarts, and drops it with the Machine (``Driver.service_logs``; ``vz_core.services``). A stopped
Machine has none: its agent is gone.

``follow`` polls: a service's ``log_bytes`` (every byte it wrote) says how much is new since the last read, and
the reply's last that many bytes are it. A read counts only when ``log_bytes`` is the same just before and just
after it (the reply then ends exactly there); while the service writes without pause a few reads are retried,
then the newest bytes are sent as they are (output written between two reads may then be repeated or missed).
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

from vz_core._types import MAX_CHUNK
from vz_core.env._context import Context
from vz_core.env._drivers import acquire_driver
from vz_core.env._exec import ExecTarget, LogSink, _exec_errors, _last_lines
from vz_core.errors import InvalidArgumentError, NotFoundError, UnsupportedError
from vz_core.services import ServiceState

__all__ = ["execute_service_logs"]

_SETTLE_TRIES = 5


class _NoService(Exception):
    """Raised inside ``_exec_errors`` (which rewrites NotFoundError as a missing Machine), turned into the
    NotFoundError naming the service outside it."""


async def execute_service_logs(
    ctx: Context,
    target: ExecTarget,
    service: str,
    output: LogSink,
    *,
    follow: bool = False,
    tail: int | None = None,
    interval: float = 1.0,
) -> None:
    """Service ``service`` of the target Machine: its kept output to ``output`` (``tail``: only its last lines),
    then with ``follow`` what it adds, until the Machine no longer runs or the calling task is cancelled.

    ``NotFoundError`` names the Machine's services when it has none called ``service``; ``UnsupportedError``
    when its driver supervises no services."""
    machine = target.machine
    driver = acquire_driver(
        machine.driver, machine.driver_options, recorded=True, redactor=ctx.redactor, source=ctx.drivers
    )
    states_of = getattr(driver, "service_states", None)
    logs_of = getattr(driver, "service_logs", None)
    try:
        if states_of is None or logs_of is None:
            raise UnsupportedError(f"driver {machine.driver!r} of machine {machine.name} runs no services")
        with _exec_errors(target):

            async def total() -> int:
                states: tuple[ServiceState, ...] = await states_of(machine.workspace_id)
                for state in states:
                    if state.name == service:
                        return state.log_bytes
                raise _NoService(", ".join(s.name for s in states) or "none")

            async def read() -> tuple[bytes, int]:
                """The kept output and how many bytes the service wrote in all when it was read."""
                data, after = b"", -1
                for _ in range(_SETTLE_TRIES):
                    before = await total()
                    try:
                        data = await logs_of(machine.workspace_id, service, 0)
                    except InvalidArgumentError:  # it left the set between the two calls
                        await total()
                        raise
                    after = await total()
                    if after == before:
                        break
                return data, after

            data, written = await read()
            fresh = _last_lines(data, tail) if tail is not None else data
            while True:
                for start in range(0, len(fresh), MAX_CHUNK):
                    await output(fresh[start : start + MAX_CHUNK])
                if not follow:
                    return
                found = await driver.find(machine.workspace_id)
                if found is None or found.state.status != "running":
                    return
                await asyncio.sleep(interval)
                data, now = await read()
                new = now - written
                if new < 0:  # the service was replaced (its log started again)
                    new = now
                fresh = data[len(data) - min(new, len(data)) :] if new else b""
                written = now
    except _NoService as exc:
        raise NotFoundError(
            f"machine {machine.name} has no service {service!r} (its services: {exc}); "
            "see vz status for each Machine's services",
            details={"machine": machine.name, "service": service},
        ) from None
    finally:
        with suppress(Exception):
            await driver.close()
