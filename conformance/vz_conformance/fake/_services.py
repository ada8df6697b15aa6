"""Services of the fake driver's Machines: what the shared guest agent's supervisor does, modelled on the host.

One ``Supervisor`` per running Machine keeps the service set ``SetServices`` gave it: each service is its own
process group, started in dependency order once what it depends on is in the state it waits for, restarted by
its policy with a doubling back-off (0.1 s up to 30 s, reset after a run of 10 s), health-checked by a command or
a TCP connection on the Machine's loopback, and stopped with SIGTERM, then SIGKILL after its stop timeout,
dependents first. Its output (stdout and stderr merged) goes to a ring of the newest ``LOG_LIMIT`` bytes kept
across its restarts. The rules are the agent's (``vz_drivers/_agent/go/services.go``); two fault modes break
them on purpose: ``service-crashes`` and ``health-never-passes`` (``_faults``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from vz_core.errors import InvalidArgumentError
from vz_core.services import DEPENDENCY_CONDITIONS, RESTART_POLICIES, ServiceSpec, ServiceState

from ._exec import Launch, _reap_in_background, _wait_exit, kill_group, spawn

__all__ = ["LOG_LIMIT", "MAX_SERVICES", "Supervisor", "service_order"]

LOG_LIMIT = 4 << 20
"""The newest bytes of output kept per service (the agent's default)."""
MAX_SERVICES = 256
_MIN_BACKOFF = 0.1
_MAX_BACKOFF = 30.0
_BACKOFF_RESET_AFTER = 10.0
_CRASH_AFTER = 0.3
"""Under ``service-crashes``: seconds after its start at which every service process is killed."""
_PROBE = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), float(sys.argv[2])).close()"

LaunchFor = Callable[[ServiceSpec, Sequence[str]], Launch]
"""The Launch of a service's command (or of its health command) in the Machine: user, workdir, environment."""


def service_order(specs: Sequence[ServiceSpec]) -> list[str]:
    """The start order of a valid set (dependencies first, ties by name); ``InvalidArgumentError`` naming what is
    wrong with a bad one (the agent's ``validateServices``)."""
    if len(specs) > MAX_SERVICES:
        raise InvalidArgumentError(f"at most {MAX_SERVICES} services, got {len(specs)}")
    by_name: dict[str, ServiceSpec] = {}
    for index, spec in enumerate(specs):
        if not spec.name:
            raise InvalidArgumentError(f"services[{index}]: name is empty")
        if spec.name in by_name:
            raise InvalidArgumentError(f"service {spec.name!r} is given twice")
        by_name[spec.name] = spec
        if not spec.argv or not spec.argv[0]:
            raise InvalidArgumentError(f"service {spec.name!r}: argv must be non-empty")
        if spec.restart not in RESTART_POLICIES:
            raise InvalidArgumentError(
                f"service {spec.name!r}: restart {spec.restart!r} is not one of {', '.join(RESTART_POLICIES)}"
            )
        h = spec.health
        if h is not None and bool(h.argv) == bool(h.tcp_port):
            raise InvalidArgumentError(f"service {spec.name!r}: health needs exactly one of argv and tcp_port")
    for spec in specs:
        for dep, condition in spec.depends_on.items():
            if dep not in by_name:
                raise InvalidArgumentError(f"service {spec.name!r} depends on {dep!r}, which is not in the set")
            if condition not in DEPENDENCY_CONDITIONS:
                raise InvalidArgumentError(
                    f"service {spec.name!r}: depends_on {dep!r} condition {condition!r} is not "
                    + ", ".join(DEPENDENCY_CONDITIONS)
                )
            if condition == "service_healthy" and by_name[dep].health is None:
                raise InvalidArgumentError(
                    f"service {spec.name!r} waits for {dep!r} to be healthy, but {dep!r} has no health check"
                )
    pending = {s.name: set(s.depends_on) for s in specs}
    order: list[str] = []
    while pending:
        ready = sorted(n for n, deps in pending.items() if not deps - set(order))
        if not ready:
            raise InvalidArgumentError(f"depends_on has a cycle among {sorted(pending)}")
        order.append(ready[0])
        del pending[ready[0]]
    return order


def _key(spec: ServiceSpec) -> tuple[object, ...]:
    return (spec.argv, dict(spec.environment), spec.user, spec.workdir, spec.restart, spec.max_retries, spec.health,
            dict(spec.depends_on), spec.stop_timeout)  # fmt: skip


@dataclass
class _Service:
    spec: ServiceSpec
    log: bytearray
    state: ServiceState
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    pgid: int = 0


class Supervisor:
    """The service set of one running Machine (see the module docstring). ``faults`` are the driver's."""

    def __init__(self, launch_for: LaunchFor, faults: frozenset[str]) -> None:
        self._launch_for = launch_for
        self._faults = faults
        self._services: dict[str, _Service] = {}
        self._logs: dict[str, bytearray] = {}
        self._order: list[str] = []
        self._changed = asyncio.Condition()
        self._lock = asyncio.Lock()

    async def set(self, specs: Sequence[ServiceSpec]) -> tuple[ServiceState, ...]:
        """Make ``specs`` the whole set: unchanged services keep running, changed ones restart, others stop."""
        async with self._lock:
            order = service_order(specs)
            for spec in specs:  # a user or workdir the Machine lacks: refused before anything changes
                self._launch_for(spec, spec.argv)
            want = {s.name: s for s in specs}
            gone = [s for n, s in self._services.items() if n not in want or _key(s.spec) != _key(want[n])]
            await self._stop_all(gone)
            for service in gone:
                del self._services[service.spec.name]
            self._order = order
            for name in order:
                if name in self._services:
                    continue
                log = self._logs.setdefault(name, bytearray())
                health = "starting" if want[name].health is not None else ""
                service = _Service(want[name], log, ServiceState(name, "waiting", health=health))
                self._services[name] = service
                service.task = asyncio.get_running_loop().create_task(self._supervise(service))
            for name in list(self._logs):
                if name not in want:
                    del self._logs[name]
            await self._notify()
            return self.states()

    def states(self) -> tuple[ServiceState, ...]:
        return tuple(s.state for n in self._order if (s := self._services.get(n)))

    def log_tail(self, name: str, tail_bytes: int) -> bytes:
        log = self._logs.get(name)
        if log is None:
            raise InvalidArgumentError(f"no service {name!r} in this Machine")
        n = tail_bytes if 0 < tail_bytes <= LOG_LIMIT else LOG_LIMIT
        return bytes(log[-n:])

    async def stop(self) -> None:
        """Stop every service (the Machine stops): dependents first, SIGTERM then SIGKILL after the timeout."""
        async with self._lock:
            await self._stop_all(list(self._services.values()))

    def kill(self) -> None:
        """Kill every service at once (the Machine is deleted or replaced)."""
        for service in self._services.values():
            service.stop.set()
            if service.pgid:
                kill_group(service.pgid)
            if service.task is not None:
                service.task.cancel()

    # -- internals --------------------------------------------------------------------------------------------

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _update(self, service: _Service, **changes: object) -> None:
        service.state = replace(service.state, **changes)  # type: ignore[arg-type]
        await self._notify()

    async def _stop_all(self, services: list[_Service]) -> None:
        position = {n: i for i, n in enumerate(self._order)}
        for service in sorted(services, key=lambda s: -position.get(s.spec.name, 0)):
            service.stop.set()
            await self._notify()
            if service.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await service.task

    def _deps_met(self, service: _Service) -> bool:
        for dep, condition in service.spec.depends_on.items():
            other = self._services.get(dep)
            if other is None:
                return False
            st = other.state
            if condition == "service_started" and st.state != "running":
                return False
            if condition == "service_healthy" and st.health != "healthy":
                return False
            if condition == "service_completed_successfully" and not (
                st.state == "exited" and st.last_exit_code == 0 and not st.last_signal
            ):
                return False
        return True

    def _append(self, service: _Service, data: bytes) -> None:
        service.log.extend(data)
        if len(service.log) > LOG_LIMIT:
            del service.log[: len(service.log) - LOG_LIMIT]
        service.state = replace(service.state, log_bytes=service.state.log_bytes + len(data))

    async def _wait_deps(self, service: _Service) -> bool:
        async with self._changed:
            while not self._deps_met(service):
                if service.stop.is_set():
                    return False
                await self._changed.wait()
        return not service.stop.is_set()

    async def _supervise(self, service: _Service) -> None:
        backoff = _MIN_BACKOFF
        try:
            while await self._wait_deps(service):
                started = asyncio.get_running_loop().time()
                if not await self._run_once(service):
                    return
                st = service.state
                failed = st.state == "failed" or st.last_exit_code != 0 or bool(st.last_signal)
                policy = service.spec.restart
                restart = policy in ("always", "unless-stopped") or (
                    policy == "on-failure"
                    and failed
                    and (service.spec.max_retries == 0 or st.restarts < service.spec.max_retries)
                )
                if not restart:
                    if policy == "on-failure" and failed:
                        await self._update(service, state="failed", last_error=f"gave up after {st.restarts} restarts")
                    await service.stop.wait()
                    return
                if asyncio.get_running_loop().time() - started >= _BACKOFF_RESET_AFTER:
                    backoff = _MIN_BACKOFF
                await self._update(service, state="backoff")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(service.stop.wait(), backoff)
                if service.stop.is_set():
                    return
                backoff = min(backoff * 2, _MAX_BACKOFF)
                await self._update(service, restarts=service.state.restarts + 1)
        finally:
            service.pgid = 0
            service.state = replace(service.state, state="stopped", pid=0)
            with contextlib.suppress(RuntimeError):
                await self._notify()

    async def _run_once(self, service: _Service) -> bool:
        """One run of the service's command; False when it was stopped (the supervision ends)."""
        name = service.spec.name
        try:
            launch = self._launch_for(service.spec, service.spec.argv)
            proc = spawn(launch, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except (OSError, InvalidArgumentError) as exc:
            self._append(service, f"vz-fake: service {name}: {exc}\n".encode())
            await self._update(service, state="failed", last_error=str(exc), pid=0, last_exit_code=127, last_signal="")
            return True
        service.pgid = proc.pid
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        health = "starting" if service.spec.health is not None else ""
        await self._update(service, state="running", pid=proc.pid, last_error="", started_at=now, health=health)
        assert proc.stdout is not None
        reader = asyncio.create_task(self._read(service, proc.stdout.fileno()))
        checker = asyncio.create_task(self._check_health(service)) if service.spec.health is not None else None
        crasher = asyncio.create_task(self._crash(proc.pid)) if "service-crashes" in self._faults else None
        exited = asyncio.create_task(_wait_exit(proc))
        stopped = asyncio.create_task(service.stop.wait())
        try:
            await asyncio.wait({exited, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():
                await self._update(service, state="stopping")
                code = await self._terminate(proc, exited, service.spec.stop_timeout)
            else:
                code = exited.result()
        finally:
            for task in (checker, crasher, stopped, exited):
                if task is not None:
                    task.cancel()
            kill_group(proc.pid)  # what is left of the group (daemons it forked) goes with it
            _reap_in_background(proc)  # a no-op once it was waited for; after a cancellation, someone must
            if asyncio.current_task() is not None and asyncio.current_task().cancelling():  # type: ignore[union-attr]
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await reader
            proc.stdout.close()
        exit_code, sig = (128 - code, signal.Signals(-code).name) if code < 0 else (code, "")
        if service.stop.is_set():
            service.state = replace(service.state, last_exit_code=exit_code, last_signal=sig)
            return False
        suffix = f", {sig}" if sig else ""
        self._append(service, f"vz-fake: service {name} exited (code {exit_code}{suffix})\n".encode())
        unhealthy = "unhealthy" if service.spec.health is not None else ""
        await self._update(service, state="exited", pid=0, last_exit_code=exit_code, last_signal=sig, health=unhealthy)
        return True

    async def _read(self, service: _Service, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(fd)))
        try:
            while data := await reader.read(65536):
                self._append(service, data)
        finally:
            transport.close()

    async def _terminate(self, proc: subprocess.Popen[bytes], exited: asyncio.Task[int], limit: float) -> int:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            return await asyncio.wait_for(asyncio.shield(exited), limit if limit > 0 else 10.0)
        except TimeoutError:
            kill_group(proc.pid)
            return await exited

    async def _crash(self, pid: int) -> None:
        await asyncio.sleep(_CRASH_AFTER)
        kill_group(pid)

    async def _check_health(self, service: _Service) -> None:
        h = service.spec.health
        assert h is not None
        interval = h.interval if h.interval > 0 else 30.0
        timeout = h.timeout if h.timeout > 0 else 30.0
        retries = h.retries or 3
        began = asyncio.get_running_loop().time()
        failures = 0
        wait = 1.0 if interval > 1.0 else 0.0  # the first check comes soon
        while True:
            await asyncio.sleep(wait)
            wait = interval
            passed, why = await self._probe(service, timeout)
            if "health-never-passes" in self._faults:
                passed, why = False, "the check never passes (fault mode 'health-never-passes')"
            if passed:
                failures = 0
                await self._update(service, health="healthy")
                continue
            if asyncio.get_running_loop().time() - began < h.start_period:
                continue
            failures += 1
            if failures >= retries:
                await self._update(service, health="unhealthy", last_error=f"health check: {why}")

    async def _probe(self, service: _Service, limit: float) -> tuple[bool, str]:
        h = service.spec.health
        assert h is not None
        argv: Sequence[str] = h.argv or (sys.executable, "-c", _PROBE, str(h.tcp_port), str(limit))
        try:
            proc = spawn(
                self._launch_for(service.spec, argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except (OSError, InvalidArgumentError) as exc:
            return False, str(exc)
        try:
            code = await asyncio.wait_for(_wait_exit(proc), limit)
        except TimeoutError:
            kill_group(proc.pid)
            await _wait_exit(proc)
            return False, f"{argv[0]} did not finish within {limit} s"
        finally:
            kill_group(proc.pid)
            _reap_in_background(proc)
        if code != 0:
            what = f"a TCP connection to port {h.tcp_port}" if h.tcp_port else argv[0]
            return False, f"{what} failed (exit code {code})"
        return True, ""
