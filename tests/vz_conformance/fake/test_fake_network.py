"""The fake driver's model of route-domain attachment (label vz.network): a namespace per Machine, joined to
the domain with vz_core.network, resolv.conf from the plan; released at Stop/Delete; bad labels refused first.

Root only (namespaces, nft); everything the tests create is removed (domain, Machine namespaces, /etc/netns)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from fake_network_testlib import domain, labelled, leftovers, machine, namespaces, plan_of
from fake_testlib import run_exec, unique_id
from vz_conformance.fake import FakeDriver
from vz_conformance.fake._network import namespace_for

from vz_core import ExecOutput, ExecSpec
from vz_core.errors import FailedPreconditionError, InvalidArgumentError
from vz_core.network.label import LABEL

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="route domains need root (namespaces, nft)")

LISTEN = "import socket,sys; s=socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print('up', flush=True); c,_=s.accept(); print(c.recv(100).decode(), flush=True)"  # noqa: E501


async def no_input() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover


CONNECT = "import socket,sys; c=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); c.sendall(b'hi')"


async def test_machines_join_the_domain_and_only_the_declared_path_connects(tmp_path: Path) -> None:
    driver = FakeDriver(tmp_path / "state")
    app, db = unique_id("app"), unique_id("db")
    async with domain() as plan:
        try:
            await driver.run_image(labelled(app, plan, "app"))
            await driver.run_image(labelled(db, plan, "db"))
            links = (await run_exec(driver, app, ["ip", "-o", "link", "show"])).stdout.decode()
            names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
            assert names == ["eth0", "lo"]
            address = machine(plan, "app")["attachments"][0]["address"]
            assert address in (await run_exec(driver, app, ["ip", "-4", "addr", "show", "eth0"])).stdout.decode()
            resolv = (await run_exec(driver, app, ["cat", "/etc/resolv.conf"])).stdout.decode()
            assert resolv == f"nameserver {machine(plan, 'app')['dns_server']}\nsearch vz.internal\n"

            db_address = machine(plan, "db")["attachments"][0]["address"]
            for port, works in ((5432, True), (8081, False)):
                events = driver.exec(ExecSpec(db, (sys.executable, "-c", LISTEN, db_address, str(port))), no_input())
                first = await asyncio.wait_for(anext(events), 10)
                assert isinstance(first, ExecOutput) and b"up" in first.data
                connected = await run_exec(driver, app, [sys.executable, "-c", CONNECT, db_address, str(port)])
                assert (connected.exit.exit_code == 0) is works, (port, connected.stderr)
                if works:
                    rest = [e async for e in events]
                    assert any(isinstance(e, ExecOutput) and b"hi" in e.data for e in rest)
                else:
                    await events.aclose()

            # Stop releases the namespace and the domain end; Start attaches it again.
            await driver.stop(app)
            assert namespace_for(driver._store.key(app)) not in namespaces()
            await driver.start(app)
            links = (await run_exec(driver, app, ["ip", "-o", "link", "show"])).stdout.decode()
            assert "eth0" in links
        finally:
            await driver.delete(app)
            await driver.delete(db)
        ours = {namespace_for(driver._store.key(w)) for w in (app, db)}
        assert leftovers(ours) == set()


async def test_bad_labels_and_a_missing_domain_are_refused_before_anything_exists(tmp_path: Path) -> None:
    driver = FakeDriver(tmp_path / "state")
    ws = unique_id()
    plan = plan_of("env_0000000000zz")  # no domain for it
    with pytest.raises(FailedPreconditionError, match="does not exist"):
        await driver.run_image(labelled(ws, plan, "app"))
    assert await driver.find(ws) is None
    bad = replace(labelled(ws, plan, "app"), labels=(f"{LABEL}={{not json",))
    with pytest.raises(InvalidArgumentError, match="not JSON"):
        await driver.run_image(bad)
    assert await driver.find(ws) is None
    assert namespace_for(driver._store.key(ws)) not in namespaces()
    facts = (await driver.extensions()).facts
    assert "topology" in facts


async def test_a_start_attaches_the_slice_vz_up_recorded_and_notes_it(tmp_path: Path) -> None:
    from fake_network_testlib import definition, environment_id

    from vz_core.env import compile_topology, parse_definition
    from vz_core.network import ensure_domain, remove_domain
    from vz_core.network.label import machine_slice, needs_reattach, remove_slices, write_slices

    driver = FakeDriver(tmp_path / "state")
    env, machine_id, ws = environment_id(), "mch_0123456789ab", unique_id("app")
    created = plan_of(env)
    moved_definition = {
        **definition(),
        "networks": [{"name": "n", "machines": ["app", "db"], "subnet": "10.89.7.0/24"}],
    }
    moved = compile_topology(parse_definition(moved_definition), env).to_json()
    identity = ("dev.vz.environment=" + env, "dev.vz.machine=" + machine_id)
    await ensure_domain(created)
    try:
        req = labelled(ws, created, "app")
        await driver.run_image(replace(req, labels=(*req.labels, *identity)))
        old = machine(created, "app")["attachments"][0]["address"]
        assert old in (await run_exec(driver, ws, ["ip", "-4", "addr", "show", "eth0"])).stdout.decode()
        await ensure_domain(moved)
        new_slice = machine_slice(moved, "app")
        write_slices(env, {machine_id: new_slice})
        assert needs_reattach(env, machine_id, new_slice, machine_slice(created, "app"))
        await driver.stop(ws)
        await driver.start(ws)
        new = machine(moved, "app")["attachments"][0]["address"]
        shown = (await run_exec(driver, ws, ["ip", "-4", "addr", "show", "eth0"])).stdout.decode()
        assert new in shown and old not in shown
        assert not needs_reattach(env, machine_id, new_slice, machine_slice(created, "app"))
    finally:
        await driver.delete(ws)
        await remove_domain(env)
        remove_slices(env)
