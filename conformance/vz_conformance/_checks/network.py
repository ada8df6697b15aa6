"""network: a driver advertising the Extensions fact ``topology`` joins a Machine given the ``vz.network`` label to
its Environment's route domain, so exactly what the Environment declares connects (docs/network.md).

The suite plays the host side (``network_rig``: route domains, stand-in Machines in namespaces it attaches
itself, an upstream, the DNS responder, export listener and import relay the daemon runs). Every listener
records what reaches it, so a refused connection is also checked to have arrived nowhere. A driver without the
fact must refuse the label (UNSUPPORTED, nothing created): the cases are then not applicable. A host that cannot
build route domains (not root, not Linux, no ``ip``/``nft``) fails the cases as an unmet requirement: they never
pass there.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._checks import network_rig
from vz_conformance._checks.network_rig import (
    ALLOWED_HOST,
    DB_ADMIN_PORT,
    DB_PORT,
    EXPORT_PORT,
    LISTED_NAME,
    NAME_TTL,
    NAMED_HOST,
    OTHER_PORT,
    UNLISTED_HOST,
    UNLISTED_NAME,
    UNLISTED_NAMED_HOST,
    UPSTREAM_PORT,
    Rig,
)
from vz_conformance._context import CheckContext
from vz_conformance._expect import ensure, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed

__all__ = [
    "CASES",
    "check_after_restart",
    "check_allowlist_cidr",
    "check_allowlist_domain",
    "check_cross_environment",
    "check_dns",
    "check_export",
    "check_import",
    "check_offline",
    "check_paths",
    "connect_argv",
    "lookup_argv",
    "serve_once_argv",
]

Argv = tuple[str, ...]
_NC = (
    'if command -v nc >/dev/null 2>&1; then N="nc"; '
    'elif command -v busybox >/dev/null 2>&1; then N="busybox nc"; '
    "else echo 'no nc in the Machine' >&2; exit 2; fi; "
)


def connect_argv(host: str, port: int) -> Argv:
    """Open a TCP connection to host:port and send one line; exit 0 only when that worked."""
    return ("sh", "-c", _NC + 'echo vz-conformance | $N -w 3 "$1" "$2"', "sh", host, str(port))


def serve_once_argv(port: int, line: str) -> Argv:
    """Listen on TCP ``port``, write ``line`` to the first connection, then exit."""
    return ("sh", "-c", _NC + 'echo "$2" | $N -l -p "$1"', "sh", str(port), line)


def lookup_argv(name: str) -> Argv:
    """Resolve ``name`` through the Machine's /etc/resolv.conf; print the answer; non-zero when there is none."""
    script = (
        'if command -v nslookup >/dev/null 2>&1; then exec nslookup "$1"; '
        'elif command -v busybox >/dev/null 2>&1; then exec busybox nslookup "$1"; '
        'else exec getent hosts "$1"; fi'
    )
    return ("sh", "-c", script, "sh", name)


async def _guarded(ctx: CheckContext, body: Callable[[Rig], Awaitable[None]]) -> Outcome:
    if not ctx.declared(cap.TOPOLOGY):
        return await _refusal(ctx)
    unmet = network_rig.requirements()
    if unmet is not None:
        fail("network", "a host that can build route domains", f"unmet requirement: {unmet}")
    found = await network_rig.rig(ctx)
    await body(found)
    return Passed()


async def _refusal(ctx: CheckContext) -> Outcome:
    from vz_core.env import compile_topology, parse_definition

    plan = compile_topology(parse_definition(network_rig.suite_definition(11434)), "env_0000000000na").to_json()
    plan = json.loads(json.dumps(plan))
    req = network_rig.label_request(ctx, plan, "app", ctx.new_id("nolabel"))
    return await ctx.run_image_refused(
        cap.TOPOLOGY,
        req,
        "label 'vz.network'",
        note="label vz.network without the Extensions fact 'topology'",
    )


async def _connects(ctx: CheckContext, workspace_id: str, host: str, port: int) -> bool:
    argv = connect_argv(host, port)
    result = await expect_ok("Exec", lambda: ctx.run(workspace_id, argv), note=f"argv={list(argv)!r}")
    code = result.require_exit().exit_code
    if code == 2 and b"no nc" in result.stderr:
        fail("Exec", "a Machine image with nc (the network cases connect with it)", result.stderr.decode())
    return result.require_exit().success


async def _reaches(ctx: CheckContext, rig: Rig, machine: str, host: str, port: int, listener: str, what: str) -> None:
    where = f"{host}:{port}"
    ensure(
        await _connects(ctx, rig.machines[machine], host, port),
        "Exec",
        f"{machine} connects to {where} ({what})",
        "the connection failed",
    )
    await _settle(lambda: rig.listeners[listener].got(where))
    ensure(
        rig.listeners[listener].got(where),
        "test listener",
        f"{machine}'s probe line at {where} ({what})",
        rig.listeners[listener].received,
    )


async def _refused(ctx: CheckContext, rig: Rig, machine: str, host: str, port: int, listener: str, what: str) -> None:
    where = f"{host}:{port}"
    before = rig.listeners[listener].count(where)
    ensure(
        not await _connects(ctx, rig.machines[machine], host, port),
        "Exec",
        f"{machine}'s connection to {where} refused ({what})",
        "it connected",
    )
    await asyncio.sleep(0.2)  # a stray connection would be recorded by now
    ensure(
        rig.listeners[listener].count(where) == before,
        "test listener",
        f"nothing from {machine} arrives at {where} ({what})",
        rig.listeners[listener].received,
    )


async def _settle(done: Callable[[], bool], within: float = 3.0) -> None:
    for _ in range(int(within / 0.05)):
        if done():
            return
        await asyncio.sleep(0.05)


async def check_paths(ctx: CheckContext) -> Outcome:
    """Declared paths connect; an undeclared service of the same Machine and Machines without a path are
    refused, and nothing arrives there."""

    async def body(rig: Rig) -> None:
        db, other = rig.address("db"), rig.address("other")
        await _reaches(ctx, rig, "app", db, DB_PORT, "db", "the declared path app -> db/pg")
        await _refused(ctx, rig, "app", db, DB_ADMIN_PORT, "db", "db's admin service: no path")
        await _refused(ctx, rig, "app", other, OTHER_PORT, "other", "other: no path")
        await _reaches(ctx, rig, "off", other, OTHER_PORT, "other", "the declared path off -> other/web")
        await _refused(ctx, rig, "off", db, DB_PORT, "db", "off has no path to db")

    return await _guarded(ctx, body)


async def check_dns(ctx: CheckContext) -> Outcome:
    """The Machine's resolv.conf names its DNS server: it resolves the Machines it has a path to and nothing
    else (another Machine's name is not confirmed; a name outside the Environment is not answered)."""

    async def body(rig: Rig) -> None:
        db = rig.address("db")
        app = rig.machines["app"]
        found = await ctx.run(app, lookup_argv("db.vz.internal"))
        ensure(
            found.require_exit().success and db.encode() in found.stdout,
            "Exec",
            f"app resolves db.vz.internal to {db}",
            f"exit {found.require_exit().exit_code}, stdout {found.stdout!r}, stderr {found.stderr[-300:]!r}",
        )
        for machine, name, address in (
            ("app", "other.vz.internal", rig.address("other")),
            ("off", "db.vz.internal", db),
            ("app", "example.com", None),
        ):
            result = await ctx.run(rig.machines[machine], lookup_argv(name))
            answered = address is not None and address.encode() in result.stdout
            ensure(
                not result.require_exit().success and not answered,
                "Exec",
                f"{machine} gets no answer for {name}",
                f"exit {result.require_exit().exit_code}, stdout {result.stdout!r}",
            )

    return await _guarded(ctx, body)


def _host_reads(port: int, address: str = "127.0.0.1") -> bytes:
    with socket.create_connection((address, port), timeout=3) as sock:
        sock.settimeout(5)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
            if b"\n" in data:
                break
        return data


def _host_addresses() -> list[str]:
    """The host's own IPv4 addresses other than loopback (a wildcard listener would answer there)."""
    done = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False)
    found = []
    for line in done.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            address = fields[fields.index("inet") + 1].split("/")[0]
            if not address.startswith("127."):
                found.append(address)
    return found


async def check_export(ctx: CheckContext) -> Outcome:
    """The export listener on 127.0.0.1 reaches the Machine's service; the port is on loopback 127.0.0.1 only."""

    async def body(rig: Rig) -> None:
        line = f"vz-export-{ctx.token}"
        server = asyncio.create_task(ctx.run(rig.machines["app"], serve_once_argv(EXPORT_PORT, line), within=40))
        got = b""
        try:
            deadline = time.monotonic() + 25
            while time.monotonic() < deadline and line.encode() not in got and not server.done():
                try:
                    got = await asyncio.to_thread(_host_reads, rig.export_port)
                except OSError:
                    got = b""
                if line.encode() not in got:
                    await asyncio.sleep(0.3)
        finally:
            if not server.done():
                server.cancel()
            await asyncio.gather(server, return_exceptions=True)
        ensure(line.encode() in got, "export 127.0.0.1", f"the Machine's line {line!r}", got)
        for address in ("127.0.0.2", *_host_addresses()):
            try:
                await asyncio.to_thread(_host_reads, rig.export_port, address)
            except OSError:
                continue
            fail("export", f"nothing listening on {address}:{rig.export_port} (127.0.0.1 only)", "it connected")

    return await _guarded(ctx, body)


async def check_import(ctx: CheckContext) -> Outcome:
    """The import relay on the Machine's gateway reaches the host's 127.0.0.1 port from the declaring Machine
    only: another Machine of the driver and a suite Machine are refused and nothing reaches the host port."""

    async def body(rig: Rig) -> None:
        gateway = rig.gateway("app")
        where = f"127.0.0.1:{rig.import_port}"
        host = rig.listeners["host"]
        ensure(
            await _connects(ctx, rig.machines["app"], gateway, rig.import_port),
            "Exec",
            f"app connects to its import at {gateway}:{rig.import_port}",
            "the connection failed",
        )
        await _settle(lambda: host.got(where))
        ensure(host.got(where), "host listener", f"app's probe line at {where}", host.received)
        before = host.count(where)
        ensure(
            not await _connects(ctx, rig.machines["off"], rig.gateway("off"), rig.import_port),
            "Exec",
            "off's connection to the import port refused (it declares no import)",
            "it connected",
        )
        other = await network_rig.connect_from(rig.namespaces["db"], rig.gateway("db"), rig.import_port)
        ensure(not other, "db (suite namespace)", "db's connection to the import port refused", "it connected")
        await asyncio.sleep(0.2)
        ensure(host.count(where) == before, "host listener", "nothing more arrives at the import's host port", host)

    return await _guarded(ctx, body)


async def check_offline(ctx: CheckContext) -> Outcome:
    """An offline Machine reaches nothing outside the Environment, even with an uplink (its declared path
    inside the Environment still connects)."""

    async def body(rig: Rig) -> None:
        await _reaches(ctx, rig, "off", rig.address("other"), OTHER_PORT, "other", "off's declared path")
        for host in (ALLOWED_HOST, UNLISTED_HOST):
            await _refused(ctx, rig, "off", host, UPSTREAM_PORT, "upstream", "egress offline")

    return await _guarded(ctx, body)


async def check_allowlist_cidr(ctx: CheckContext) -> Outcome:
    """An allowlist by CIDR reaches an address inside it and nothing outside it."""

    async def body(rig: Rig) -> None:
        await _reaches(ctx, rig, "app", ALLOWED_HOST, UPSTREAM_PORT, "upstream", "inside the allowlisted CIDR")
        await _refused(ctx, rig, "app", UNLISTED_HOST, UPSTREAM_PORT, "upstream", "outside the allowlist")

    return await _guarded(ctx, body)


async def check_allowlist_domain(ctx: CheckContext) -> Outcome:
    """An allowlisted domain name admits its address only once the Machine resolved it through its Environment's
    DNS, and only until the answer's TTL ran out; a name the allowlist does not list is refused without asking
    the upstream, and its address stays unreachable."""

    async def body(rig: Rig) -> None:
        app = rig.machines["app"]
        await _refused(ctx, rig, "app", NAMED_HOST, UPSTREAM_PORT, "upstream", f"{LISTED_NAME} not resolved yet")
        asked = len(rig.dns_upstream.asked)
        other = await ctx.run(app, lookup_argv(UNLISTED_NAME))
        ensure(
            not other.require_exit().success and UNLISTED_NAMED_HOST.encode() not in other.stdout,
            "Exec",
            f"app gets no answer for {UNLISTED_NAME} (not in its allowlist)",
            f"exit {other.require_exit().exit_code}, stdout {other.stdout!r}",
        )
        ensure(
            UNLISTED_NAME not in rig.dns_upstream.asked[asked:],
            "DNS upstream",
            f"{UNLISTED_NAME} never forwarded",
            rig.dns_upstream.asked[asked:],
        )
        await _refused(ctx, rig, "app", UNLISTED_NAMED_HOST, UPSTREAM_PORT, "upstream", "a name not allowlisted")
        resolved_at = time.monotonic()
        found = await ctx.run(app, lookup_argv(LISTED_NAME))
        ensure(
            found.require_exit().success and NAMED_HOST.encode() in found.stdout,
            "Exec",
            f"app resolves {LISTED_NAME} to {NAMED_HOST} (forwarded upstream)",
            f"exit {found.require_exit().exit_code}, stdout {found.stdout!r}, stderr {found.stderr[-300:]!r}",
        )
        await _reaches(ctx, rig, "app", NAMED_HOST, UPSTREAM_PORT, "upstream", f"resolved {LISTED_NAME}")
        await asyncio.sleep(max(0.0, resolved_at + NAME_TTL + 2 - time.monotonic()))
        await _refused(ctx, rig, "app", NAMED_HOST, UPSTREAM_PORT, "upstream", f"{LISTED_NAME}'s entry expired")

    return await _guarded(ctx, body)


async def check_cross_environment(ctx: CheckContext) -> Outcome:
    """Another Environment with the same addresses is never reached: the address is always the Machine's own
    Environment's."""

    async def body(rig: Rig) -> None:
        db = rig.address("db")
        where = f"{db}:{DB_PORT}"
        before = rig.listeners["db_b"].count(where)
        await _reaches(ctx, rig, "app", db, DB_PORT, "db", "the declared path, in its own Environment")
        await asyncio.sleep(0.2)
        ensure(
            rig.listeners["db_b"].count(where) == before,
            "test listener",
            f"nothing arrives at the other Environment's {where}",
            rig.listeners["db_b"].received,
        )

    return await _guarded(ctx, body)


async def check_after_restart(ctx: CheckContext) -> Outcome:
    """After Stop/Start the Machine is attached again: the declared path connects, an undeclared one does not."""

    async def body(rig: Rig) -> None:
        app = rig.machines["app"]
        await expect_ok("Stop", lambda: ctx.driver.stop(app), note=app)
        await expect_ok("Start", lambda: ctx.driver.start(app), note=app)
        await rig.ensure_parts()
        db = rig.address("db")
        await _reaches(ctx, rig, "app", db, DB_PORT, "db", "the declared path after Stop/Start")
        await _refused(ctx, rig, "app", db, DB_ADMIN_PORT, "db", "no path, after Stop/Start")

    return await _guarded(ctx, body)


def _case(name: str, description: str, check: Callable[[CheckContext], Awaitable[Outcome]]) -> Case:
    return Case(f"network.{name}", description, check, gated_by=(cap.TOPOLOGY,))  # type: ignore[arg-type]


CASES = (
    _case("paths", "Declared path connects; undeclared service and Machines refused, nothing arrives", check_paths),
    _case("dns", "resolv.conf names the DNS server; only names with a path resolve, no others", check_dns),
    _case("export", "Export on 127.0.0.1 reaches the Machine's service; not on other addresses", check_export),
    _case("import", "Import reaches the host's loopback port from the declaring Machine only", check_import),
    _case("offline", "Offline Machine reaches nothing through the uplink, nothing arrives", check_offline),
    _case("allowlist_cidr", "Allowlist by CIDR reaches inside the CIDR only", check_allowlist_cidr),
    _case(
        "allowlist_domain",
        "Allowlisted name's address reachable only after resolving it, until its TTL; other names refused",
        check_allowlist_domain,
    ),
    _case("cross_environment", "Same addresses in another Environment are never reached", check_cross_environment),
    _case("after_restart", "After Stop/Start the Machine is attached again, rules unchanged", check_after_restart),
)
