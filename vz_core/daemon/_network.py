"""The daemon's part of Environment networks: the long-lived pieces of every running version 2 Environment.

``DaemonNetwork`` wraps a ``vz_core.network.NetworkHost`` (DNS responder, export listeners, import relays, all in
the daemon process) with what must outlive the process, in the state store table ``environment_networks``
(migration 4; keyed by environment id, removed with the Environment's row):

* the **plan** it serves (the topology plan compiled from the Environment's vz.json when `vz up` realized its
  route domain), so a restarted daemon restores the same parts without reading a vz.json that may have changed;
* the **chosen host port** of each export, tried first on the next start, so `vz stop` / `vz up` and a daemon
  restart keep an export where it was whenever that port is free.

It also converges the host half of each Environment's egress (``vz_core.network.ensure_egress``: the uplink's
/30 from the host pool, forwarding on its host end, the host table ``inet vz_<id12>``) whenever it serves the
plan, and removes it with the Environment; its ``NetworkHost`` keeps every host table's view of the host's
networks current while the daemon runs (``HostNetworkWatcher``: a new interface, address, route or VPN is
listed within a fraction of a second; directly connected destinations are refused by the route's next hop even
before). DNS beyond the Environment goes to the host's resolvers
(``VZ_NETWORK_DNS_UPSTREAMS``: comma-separated ``address[:port]`` instead of /etc/resolv.conf's; an allowlist
entry lives for its answer's TTL clamped to ``VZ_NETWORK_DNS_MIN_TTL``..``VZ_NETWORK_DNS_MAX_TTL``, default
30..3600 seconds).

The service calls ``after_up`` when an Environments.Up succeeded, ``after_stop`` / ``after_delete`` after those
operations, ``restore`` once at start (every Environment recorded running whose route domain exists) and
``endpoints`` for the status document. The route domain itself is created and removed by the Environment layer
(``vz up`` / ``vz delete``); nothing here is started for a version 1 Environment or one without a route domain.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["DaemonNetwork", "dns_options", "has_domain"]

log = logging.getLogger("vz.daemon")


_NETNS = "/run/netns"


def has_domain(environment_id: str) -> bool:
    """Whether the Environment's route domain exists (``vz_core.network.domain_exists`` without importing the
    network package: every `vz up` asks, most Environments have none)."""
    return environment_id.startswith("env_") and os.path.lexists(f"{_NETNS}/vzd-{environment_id[4:]}")


def _any_domain() -> bool:
    try:
        return any(name.startswith("vzd-") for name in os.listdir(_NETNS))
    except OSError:
        return False


class DaemonNetwork:
    """The network parts of the Environments this daemon serves (see the module docstring)."""

    def __init__(self, store_path: Path | None = None, host: Any = None) -> None:
        self._store_path = store_path
        self._host = host
        # Checked now: a bad VZ_NETWORK_DNS_* value stops the daemon at its start, naming the variable, rather
        # than a `vz up` after its Machines were created.
        self._dns_options = dns_options(os.environ)

    @property
    def host(self) -> Any:
        """The ``NetworkHost`` (created on first use: a daemon that serves no version 2 Environment never imports
        the network package)."""
        if self._host is None:
            from vz_core.network import NetworkHost

            self._host = NetworkHost(**self._dns_options)
        return self._host

    async def _egress(self, plan: Mapping[str, Any]) -> BaseException | None:
        """The host half of the plan's egress (None when converged; the error otherwise, raised by the caller
        after the other parts started: a Machine keeps its DNS, exports and imports without egress)."""
        from vz_core.network import ensure_egress

        try:
            await ensure_egress(plan)
        except Exception as exc:
            return exc
        return None

    def endpoints(self, environment_id: str) -> list[dict[str, Any]]:
        """The Environment's exports listening now, as the status document shows them."""
        if self._host is None:
            return []
        return [e.to_json() for e in self._host.endpoints(environment_id)]

    # --- the store ----------------------------------------------------------------------------------------------

    def _store(self) -> Any:
        from vz_core.env import Store

        return Store(self._store_path)

    def _recorded(self, environment_id: str) -> tuple[dict[str, Any] | None, dict[tuple[str, str], int]]:
        with self._store() as store, store.transaction() as db:
            row = db.execute(
                "SELECT plan, ports FROM environment_networks WHERE env_id = ?", (environment_id,)
            ).fetchone()
        if row is None:
            return None, {}
        return _loads_plan(row["plan"]), _loads_ports(row["ports"])

    def _record(self, environment_id: str, plan: Mapping[str, Any], ports: Mapping[tuple[str, str], int]) -> None:
        rows = [{"machine": m, "service": s, "port": p} for (m, s), p in sorted(ports.items())]
        with self._store() as store, store.transaction() as db:
            if db.execute("SELECT 1 FROM environments WHERE env_id = ?", (environment_id,)).fetchone() is None:
                return  # deleted meanwhile: nothing to remember
            db.execute(
                "INSERT INTO environment_networks (env_id, plan, ports, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (env_id) DO UPDATE SET plan = excluded.plan, ports = excluded.ports, "
                "updated_at = excluded.updated_at",
                (environment_id, json.dumps(plan, sort_keys=True), json.dumps(rows), _now()),
            )

    def _forget(self, environment_id: str) -> None:
        with self._store() as store, store.transaction() as db:
            db.execute("DELETE FROM environment_networks WHERE env_id = ?", (environment_id,))

    # --- what the service calls ---------------------------------------------------------------------------------

    async def after_up(self, ctx: Any, environment_id: str) -> list[dict[str, Any]] | None:
        """An Environments.Up succeeded: serve its plan (compiled again from the vz.json `vz up` just applied:
        deterministic, so it is the plan the route domain was realized from). None when the Environment has no
        route domain (version 1, or no Machine's driver attaches). Raises what could not be started, after
        starting everything else (the chosen ports are recorded either way)."""
        if not has_domain(environment_id):
            if self._host is not None and self._host.plan(environment_id) is not None:
                await self._host.remove(environment_id)  # it had one: what was served for it goes too
                with contextlib.suppress(Exception):
                    self._forget(environment_id)
            return None
        from vz_core.env import compile_topology, find_definition, load_definition

        definition = load_definition(find_definition(ctx.cwd, ctx.definition_file))
        if definition.version != 2:
            return None
        plan = compile_topology(definition, environment_id).to_json()
        _, ports = self._recorded(environment_id)
        host = self.host
        failed = await self._egress(plan)
        try:
            await host.ensure(plan, ports=ports)
        finally:
            self._record(environment_id, plan, {**ports, **host.chosen_ports(environment_id)})
        if failed is not None:
            raise failed
        return self.endpoints(environment_id)

    async def after_stop(self, environment_id: str) -> None:
        """The Environment was stopped: its parts are closed; its plan and chosen ports stay recorded."""
        if self._host is not None:
            await self._host.stop(environment_id)

    async def after_delete(self, environment_id: str) -> None:
        """The Environment was deleted: its parts are closed and its record is gone (with the Environment's)."""
        if self._host is not None:
            await self._host.remove(environment_id)
        with contextlib.suppress(Exception):
            self._forget(environment_id)
        if sys.platform == "linux" and environment_id.startswith("env_") and os.geteuid() == 0:
            from vz_core.network import remove_host_egress

            try:  # `vz delete` removed it with the route domain; a leftover (a killed removal) goes now
                await remove_host_egress(environment_id)
            except Exception as exc:
                log.warning("host egress of %s not removed: %s", environment_id, exc)

    async def restore(self) -> list[str]:
        """At daemon start: serve again every recorded Environment that is running and whose route domain
        exists. Failures are logged, never raised (a daemon always starts). The ids restored."""
        if not _any_domain():
            return []
        try:
            with self._store() as store, store.transaction() as db:
                rows = db.execute(
                    "SELECT n.env_id, n.plan, n.ports FROM environment_networks n "
                    "JOIN environments e ON e.env_id = n.env_id WHERE e.state = 'running' "
                    "AND EXISTS (SELECT 1 FROM machines m WHERE m.env_id = n.env_id AND m.state = 'running') "
                    "ORDER BY n.env_id"
                ).fetchall()
        except Exception as exc:
            log.warning("network parts not restored: %s", exc)
            return []
        restored = []
        for row in rows:
            env_id = row["env_id"]
            if not has_domain(env_id):
                continue
            plan = _loads_plan(row["plan"])
            if plan is None:
                log.warning("network parts of %s not restored: its recorded plan is unreadable", env_id)
                continue
            failed = await self._egress(plan)
            if failed is not None:
                log.warning("egress of %s not restored: %s", env_id, failed)
            try:
                await self.host.ensure(plan, ports=_loads_ports(row["ports"]))
            except Exception as exc:
                log.warning("network parts of %s restored in part: %s", env_id, exc)
            with contextlib.suppress(Exception):
                self._record(env_id, plan, {**_loads_ports(row["ports"]), **self.host.chosen_ports(env_id)})
            restored.append(env_id)
        return restored

    async def close(self) -> None:
        """The daemon stops: every part is closed (the records stay for the next start)."""
        if self._host is not None:
            await self._host.close()


def dns_options(environ: Mapping[str, str]) -> dict[str, Any]:
    """``NetworkHost`` options from ``VZ_NETWORK_DNS_UPSTREAMS`` / ``_MIN_TTL`` / ``_MAX_TTL`` (bad values are
    refused naming the variable: the daemon does not silently resolve through somewhere else)."""
    from vz_core.errors import InvalidArgumentError

    out: dict[str, Any] = {}
    text = environ.get("VZ_NETWORK_DNS_UPSTREAMS", "").strip()
    if text:
        import ipaddress

        upstreams = []
        for item in text.split(","):
            host, _, port = item.strip().partition(":")
            try:
                upstreams.append((str(ipaddress.IPv4Address(host)), int(port) if port else 53))
            except ValueError:
                raise InvalidArgumentError(
                    f"VZ_NETWORK_DNS_UPSTREAMS: {item.strip()!r} is not an IPv4 address[:port] "
                    f"(e.g. 127.0.0.1:5353,192.0.2.53)"
                ) from None
            if not 1 <= upstreams[-1][1] <= 65535:
                raise InvalidArgumentError(f"VZ_NETWORK_DNS_UPSTREAMS: {item.strip()!r} has no valid port")
        out["upstreams"] = upstreams
    for key, name in (("min_ttl", "VZ_NETWORK_DNS_MIN_TTL"), ("max_ttl", "VZ_NETWORK_DNS_MAX_TTL")):
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit() or not 1 <= int(value) <= 86400:
                raise InvalidArgumentError(f"{name}={value!r}: expected seconds, 1..86400")
            out[key] = int(value)
    return out


def _now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def _loads_plan(text: str) -> dict[str, Any] | None:
    try:
        plan = json.loads(text)
    except ValueError:
        return None
    return plan if isinstance(plan, dict) else None


def _loads_ports(text: str) -> dict[tuple[str, str], int]:
    try:
        rows = json.loads(text)
    except ValueError:
        return {}
    out: dict[tuple[str, str], int] = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and isinstance(row.get("port"), int) and not isinstance(row.get("port"), bool):
            out[(str(row.get("machine")), str(row.get("service")))] = row["port"]
    return out
