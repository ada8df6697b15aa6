"""The long-lived network parts of running Environments, in one process (the vz daemon): ``NetworkHost``.

For each Environment, keyed by its environment id, from its topology plan (JSON form):

* its **DNS responder** (``DnsServer``) on the gateways of the route domain that have an attached Machine (the
  sockets are made inside the domain's namespace; a gateway with no Machine attached has no address to bind),
  forwarding what each Machine's egress allows to the host's resolvers;
* one **export listener** per export (``ExportListener``) on 127.0.0.1, at the first free port of: the port
  this export had before (``ports``, or the one it listens on now) when it is still one of the export's
  candidates, then the plan's ``host_ports`` (the declared preference, then the Environment's fallbacks);
* one **import relay** per import (``ImportRelay``) on the importing Machine's gateways, relaying only that
  Machine's connections to the declared host loopback address and port.

A part whose Machine is not attached to the domain (its domain end does not exist: not running, or its driver
does not attach Machines) is not started; the next ``ensure`` starts it once the Machine is there. ``ensure`` is
idempotent: parts whose plan is unchanged keep running (and keep their connections); changed ones are
restarted, removed ones closed. ``stop`` closes every part and keeps what the Environment chose (its export
ports, for the next ``ensure``); ``remove`` also forgets it. Nothing here is persisted: the daemon records the
plan and the chosen ports (``vz_core.daemon._network``) and hands them back after a restart.

It also follows the host's networks for every Environment's egress: from its first ``ensure`` (as root) until
``close``, a ``HostNetworkWatcher`` rewrites the host tables' ``connected``/``gateways``/``direct_out`` sets within
a fraction of a second of each change of the host's addresses, routes or links (a NETLINK_ROUTE socket in the
event loop, no long-lived child process; ``close`` waits for a refresh in progress).

The route domain itself (``ensure_domain``/``attach_machine``/``remove_domain``) is not created or removed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vz_core.errors import DriverError, FailedPreconditionError, RuntimeFailureError
from vz_core.network._dns import DnsServer
from vz_core.network._domain import domain_exists
from vz_core.network._egress import HostNetworkWatcher
from vz_core.network._ns import in_namespace
from vz_core.network._relay import ExportListener, ImportRelay
from vz_core.network._spec import DomainSpec, PlanError

__all__ = ["Endpoint", "NetworkHost"]

ExportKey = tuple[str, str]
"""(machine, service) of an export."""


@dataclass(frozen=True)
class Endpoint:
    """An export the host reaches now: ``host``:``port`` (always 127.0.0.1) relays to ``machine``'s ``service``."""

    machine: str
    service: str
    protocol: str
    host: str
    port: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass
class _Environment:
    environment_id: str
    plan: Mapping[str, Any] | None = None
    dns: DnsServer | None = None
    dns_key: str | None = None
    exports: dict[ExportKey, tuple[str, ExportListener]] = field(default_factory=dict)
    imports: dict[str, ImportRelay] = field(default_factory=dict)
    chosen: dict[ExportKey, int] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def running(self) -> bool:
        return self.dns is not None or bool(self.exports) or bool(self.imports)


def _present(domain_path: str, ifnames: Iterable[str]) -> set[str]:
    """Which of ``ifnames`` exist inside the namespace at ``domain_path`` (run on a thread joined to it)."""
    names = list(ifnames)

    def look() -> set[str]:
        found = set()
        for name in names:
            try:
                socket.if_nametoindex(name)
            except OSError:
                continue
            found.add(name)
        return found

    return in_namespace(domain_path, look)


async def _close(part: Any) -> None:
    with contextlib.suppress(Exception):
        await part.close()


class NetworkHost:
    """DNS responders, export listeners and import relays of every Environment this process serves.

    ``await ensure(plan, ports=...)`` -> the Environment's endpoints; ``await stop(id)``; ``await remove(id)``;
    ``endpoints(id)``; ``chosen_ports(id)``; ``await close()`` (every Environment, at shutdown)."""

    def __init__(
        self,
        *,
        upstreams: Sequence[tuple[str, int]] | None = None,
        min_ttl: int = 30,
        max_ttl: int = 3600,
        follow_host_networks: bool = True,
    ) -> None:
        """``upstreams``: the resolvers DNS queries beyond the Environment go to (default: /etc/resolv.conf's,
        read at each query); ``min_ttl``/``max_ttl``: the clamp of an allowlist entry's lifetime (seconds);
        ``follow_host_networks``: run the ``HostNetworkWatcher`` (as root) from the first ``ensure`` on."""
        self._envs: dict[str, _Environment] = {}
        self._dns_options: dict[str, Any] = {"upstreams": upstreams, "min_ttl": min_ttl, "max_ttl": max_ttl}
        self._follow = follow_host_networks
        self.watcher: HostNetworkWatcher | None = None
        """The watcher of the host's networks while it runs (None before the first ``ensure`` and after
        ``close``)."""

    async def _watch(self) -> None:
        if not self._follow or self.watcher is not None or os.geteuid() != 0:
            return
        watcher = HostNetworkWatcher()
        await watcher.start()  # raises (the tools missing, no netlink) before anything else of ensure is done
        self.watcher = watcher

    def environments(self) -> list[str]:
        """Ids of the Environments with at least one part running."""
        return sorted(env_id for env_id, env in self._envs.items() if env.running)

    def plan(self, environment_id: str) -> Mapping[str, Any] | None:
        """The plan last ensured for the Environment (kept by ``stop``), or None."""
        env = self._envs.get(environment_id)
        return env.plan if env is not None else None

    def endpoints(self, environment_id: str) -> list[Endpoint]:
        """The Environment's exports that listen now, in the plan's order."""
        env = self._envs.get(environment_id)
        if env is None:
            return []
        out = []
        for (machine, service), (_, listener) in env.exports.items():
            if listener.port is not None:
                out.append(Endpoint(machine, service, listener.protocol, "127.0.0.1", listener.port))
        return out

    def chosen_ports(self, environment_id: str) -> dict[ExportKey, int]:
        """The host port each export of the Environment listens on or last listened on (kept by ``stop``)."""
        env = self._envs.get(environment_id)
        return dict(env.chosen) if env is not None else {}

    async def ensure(self, plan: Mapping[str, Any], *, ports: Mapping[ExportKey, int] | None = None) -> list[Endpoint]:
        """Start (or converge) every part of the plan's Environment whose Machine is attached; its endpoints.

        ``ports``: host ports the exports had before (from the daemon's records), tried first when still a
        candidate. Every part is attempted; when some cannot start (every candidate port taken),
        the others keep running and the error names each failure (the class of the first)."""
        spec = DomainSpec.from_plan(plan)  # checks the addressing half; PlanError names what is wrong
        env_id = spec.environment_id
        domain_path = f"/run/netns/{spec.name}"
        if not domain_exists(env_id):
            raise FailedPreconditionError(
                f"the route domain {spec.name} of {env_id} does not exist; `vz up` creates it before the Machines"
            )
        await self._watch()
        env = self._envs.setdefault(env_id, _Environment(env_id))
        async with env.lock:
            for key, port in (ports or {}).items():
                env.chosen.setdefault(key, port)
            present = await asyncio.to_thread(_present, domain_path, [a.domain_ifname for a in spec.attachments])
            attached = {m for m in spec.machines if all(a.domain_ifname in present for a in spec.machine(m))}
            problems: list[tuple[str, BaseException]] = []
            await self._ensure_dns(env, plan, spec, present, problems)
            await self._ensure_exports(env, plan, attached, problems)
            await self._ensure_imports(env, plan, attached, problems)
            env.plan = plan
        if problems:
            first = problems[0][1]
            message = f"network of {env_id}: " + "; ".join(f"{what}: {_message(exc)}" for what, exc in problems)
            if isinstance(first, DriverError):
                raise type(first)(message) from first
            raise RuntimeFailureError(message) from first
        return self.endpoints(env_id)

    async def _ensure_dns(
        self,
        env: _Environment,
        plan: Mapping[str, Any],
        spec: DomainSpec,
        present: set[str],
        problems: list[tuple[str, BaseException]],
    ) -> None:
        gateways = tuple(sorted({a.gateway for a in spec.attachments if a.domain_ifname in present}))
        items = plan.get("machines")
        machines = [m for m in items if isinstance(m, Mapping)] if isinstance(items, list) else []
        key = _key(
            {
                "gateways": [str(g) for g in gateways],
                "machines": [{k: m.get(k) for k in ("name", "attachments", "dns", "egress")} for m in machines],
            }
        )
        if env.dns is not None and env.dns_key == key:
            return
        if env.dns is not None:
            await _close(env.dns)
            env.dns, env.dns_key = None, None
        if not gateways:
            return
        try:
            server = DnsServer(plan, **self._dns_options)
            # Only the gateways with an attached Machine have their address in the domain (the others cannot
            # be bound, and no Machine could send there); the records are the plan's, unchanged.
            server.view = dataclasses.replace(server.view, gateways=gateways)
            await server.start()
        except Exception as exc:
            problems.append(("DNS", exc))
            return
        env.dns, env.dns_key = server, key

    async def _ensure_exports(
        self,
        env: _Environment,
        plan: Mapping[str, Any],
        attached: set[str],
        problems: list[tuple[str, BaseException]],
    ) -> None:
        items = plan.get("exports")
        if not isinstance(items, list):
            raise PlanError("$.exports: expected a list")
        wanted: dict[ExportKey, tuple[str, Mapping[str, Any]]] = {}
        for item in items:
            if isinstance(item, Mapping):
                wanted[(str(item.get("machine")), str(item.get("service")))] = (_key(item), item)
        for key in [k for k in env.exports if k not in wanted or k[0] not in attached]:
            await _close(env.exports.pop(key)[1])
        for key, (config, _item) in wanted.items():
            machine, service = key
            if machine not in attached:
                continue
            current = env.exports.get(key)
            if current is not None and current[0] == config:
                continue
            before = current[1].port if current is not None else None
            if current is not None:
                await _close(env.exports.pop(key)[1])
            try:
                listener = ExportListener(plan, machine, service)
                first = before if before is not None else env.chosen.get(key)
                if first is not None and first in listener.candidates:
                    listener.candidates = [first, *(p for p in listener.candidates if p != first)]
                port = await listener.start()
            except Exception as exc:
                problems.append((f"export {machine}/{service}", exc))
                continue
            env.exports[key] = (config, listener)
            env.chosen[key] = port

    async def _ensure_imports(
        self,
        env: _Environment,
        plan: Mapping[str, Any],
        attached: set[str],
        problems: list[tuple[str, BaseException]],
    ) -> None:
        items = plan.get("imports")
        if not isinstance(items, list):
            raise PlanError("$.imports: expected a list")
        wanted: dict[str, int] = {}
        for index, item in enumerate(items):
            if isinstance(item, Mapping) and str(item.get("machine")) in attached:
                wanted[_key(item)] = index
        for config in [c for c in env.imports if c not in wanted]:
            await _close(env.imports.pop(config))
        for config, index in wanted.items():
            if config in env.imports:
                continue
            item = items[index]
            what = f"import {item.get('machine')} {item.get('host_address')}:{item.get('host_port')}"
            try:
                relay = ImportRelay(plan, index)
                await relay.start()
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:  # the Machine went away between the look and the bind
                    continue
                problems.append((what, exc))
                continue
            except Exception as exc:
                problems.append((what, exc))
                continue
            env.imports[config] = relay

    async def stop(self, environment_id: str) -> bool:
        """Close every part of the Environment (its listeners refuse from now on); its plan and chosen ports are
        kept for the next ``ensure``. Whether anything was running."""
        env = self._envs.get(environment_id)
        if env is None:
            return False
        async with env.lock:
            was = env.running
            if env.dns is not None:
                await _close(env.dns)
            env.dns, env.dns_key = None, None
            for _, listener in env.exports.values():
                await _close(listener)
            env.exports.clear()
            for relay in env.imports.values():
                await _close(relay)
            env.imports.clear()
        return was

    async def remove(self, environment_id: str) -> bool:
        """``stop``, then forget the Environment (plan and chosen ports). Whether anything was running."""
        was = await self.stop(environment_id)
        self._envs.pop(environment_id, None)
        return was

    async def close(self) -> None:
        """Close the parts of every Environment (the daemon's shutdown; its records keep the ports) and the
        watcher of the host's networks."""
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            await watcher.close()
        for env_id in list(self._envs):
            await self.stop(env_id)


def _message(exc: BaseException) -> str:
    if isinstance(exc, DriverError):
        return exc.message
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
