"""#31: an upgrade never changes a plugin that is running. With the daemon's session pool serving version 1 and
an exec in flight on it, `vz driver upgrade` installs version 2 into its own directory and records it; the
running plugin keeps serving the exec from the bytes it was verified with, and the next command gets a new
session on version 2 (its binary verified again at launch)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import psutil
from driverhub import Provider, plugin_binary, publish

from vz_core import ExecOutput, ExecSpec
from vz_core._install import add_url, upgrade
from vz_core.daemon._sessions import SessionPool, SharedDriver, running_pool
from vz_core.env import acquire_driver as open_machine_driver


def acquire_driver(name: str) -> object:
    """The driver as a command in the daemon gets it: through the running pool."""
    return open_machine_driver(name, {}, source=running_pool())


async def _no_stdin() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()
    yield b""


async def test_an_upgrade_leaves_the_running_plugin_alone(provider: Provider) -> None:
    p = provider
    v1, v2 = plugin_binary("1"), plugin_binary("2")
    url = publish(p.hub, v1, p.key, version="1.0.0")
    await asyncio.to_thread(add_url, url, store=p.store, roots=p.roots)
    pool = SessionPool(plugin_idle=0)
    await pool.start()
    try:
        one = acquire_driver("acme")
        assert isinstance(one, SharedDriver)
        events = one.exec(ExecSpec("ws", ("wait",)), _no_stdin())
        first = await anext(events)
        assert isinstance(first, ExecOutput) and first.data == b"waiting"
        old = one.session
        assert old.pid is not None and old.describe()["sha256"] == hashlib.sha256(v1).hexdigest()

        publish(p.hub, v2, p.key, version="2.0.0")
        row = await asyncio.to_thread(upgrade, "acme", store=p.store, roots=p.roots)
        assert row["status"] == "upgraded" and row["version"] == "2.0.0"

        assert psutil.pid_exists(old.pid) and old.in_flight == 1  # still serving the exec it started
        two = acquire_driver("acme")
        assert isinstance(two, SharedDriver) and two.session is not old
        assert await two.find("ws") is None
        assert two.session.describe()["sha256"] == hashlib.sha256(v2).hexdigest()
        assert two.session.describe()["provenance"]["version"] == "2.0.0"
        await events.aclose()  # the exec ends; the old session retires
    finally:
        await pool.aclose()
