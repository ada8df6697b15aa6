"""#18 item 2: a Machine cannot redirect the host's exec into another Machine.

The attack that worked: inside Machine A, replace the agent socket the host connects to (``/.vz/run/agent.sock``,
a directory A can write) with a symlink to Machine B's socket; the next exec into A ran in B. Now the host side
of the channel lives in a directory no Machine can see, is opened without following links, and is used only
when the Machine's own process listens on it (peer credentials). Each test shows that an exec into A runs in A
or fails clearly, and never reaches B.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_drivers"))
from machine_testlib import request, run, sh

from vz_core.errors import UnavailableError
from vz_drivers._machine import machine_key
from vz_drivers.linux_native import LinuxNativeDriver, cleanup_state


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sec02-images")


@pytest.fixture(scope="module")
def agent_binary() -> str:
    from vz_drivers._agent import ensure_agent_binary

    return str(ensure_agent_binary())


@pytest.fixture
async def machines(tmp_path: Path, image_dir: Path, agent_binary: str) -> AsyncIterator[tuple[LinuxNativeDriver, Path]]:
    """Machines A and B, each holding its own secret in /secret."""
    if os.geteuid() != 0:
        pytest.fail("linux_native needs root")
    state = tmp_path / "state"
    options = {"image_dir": str(image_dir), "agent_binary": agent_binary, "stop_timeout": 2}
    driver = LinuxNativeDriver(state_dir=state, **options)
    try:
        for name in ("a", "b"):
            await driver.run_image(request(name))
            assert (await sh(driver, name, 'printf "secret of %s" "$1" > /secret', name.upper())).exit.success
        yield driver, state
    finally:
        await driver.close()
        await cleanup_state(str(state), **options)


async def _exec_into_a(state: Path, driver: LinuxNativeDriver) -> bytes | UnavailableError:
    other = LinuxNativeDriver(state_dir=state, image_dir=driver._backend.images._dir, agent_binary=await _agent(driver))
    try:
        result = await run(other, "a", "cat", "/secret")
        assert result.exit.success
        return result.stdout
    except UnavailableError as exc:
        return exc
    finally:
        await other.close()


async def _agent(driver: LinuxNativeDriver) -> str:
    return str(await driver._backend.agent_binary())


async def test_a_symlink_planted_inside_a_never_reaches_b(machines: tuple[LinuxNativeDriver, Path]) -> None:
    driver, state = machines
    b_socket = driver._store.paths(machine_key("b")).socket
    # What the attack did: from inside A, point A's socket path (as A sees it) at B's socket.
    planted = await sh(driver, "a", 'rm -f /.vz/run/agent.sock; ln -s "$1" /.vz/run/agent.sock', str(b_socket))
    assert planted.exit.success
    assert await _exec_into_a(state, driver) == b"secret of A"


async def test_the_host_side_is_out_of_the_machines_reach(machines: tuple[LinuxNativeDriver, Path]) -> None:
    driver, _ = machines
    inside = await sh(driver, "a", "ls -A /.vz/run; find / -xdev -type s 2>/dev/null; true")
    assert b"agent.sock" not in inside.stdout
    paths = driver._store.paths(machine_key("a"))
    assert paths.socket.is_socket() and paths.socket.parent == paths.chan
    assert oct(paths.chan.stat().st_mode & 0o777) == oct(0o700)


async def test_a_link_at_the_host_side_is_refused_not_followed(machines: tuple[LinuxNativeDriver, Path]) -> None:
    driver, state = machines
    a, b = (driver._store.paths(machine_key(n)).socket for n in ("a", "b"))
    a.unlink()
    a.symlink_to(b)
    outcome = await _exec_into_a(state, driver)
    assert isinstance(outcome, UnavailableError), outcome
    assert "symbolic link" in outcome.message


async def test_another_machines_socket_is_refused_by_its_peer(machines: tuple[LinuxNativeDriver, Path]) -> None:
    driver, state = machines
    a, b = (driver._store.paths(machine_key(n)).socket for n in ("a", "b"))
    # A hard link is no link to follow: the same socket inode as B's, reached by A's path.
    a.unlink()
    os.link(b, a)
    outcome = await _exec_into_a(state, driver)
    assert isinstance(outcome, UnavailableError), outcome
    assert "not by the Machine's process" in outcome.message


async def test_an_impostor_listening_where_the_host_looks_is_refused(
    machines: tuple[LinuxNativeDriver, Path], tmp_path: Path
) -> None:
    driver, state = machines
    paths = driver._store.paths(machine_key("a"))
    # Any other process serving a socket at the channel's path (here: this test) is not the Machine's agent.
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        impostor.bind(str(tmp_path / "impostor.sock"))
        impostor.listen()
        paths.socket.unlink()
        os.link(tmp_path / "impostor.sock", paths.socket)
        outcome = await _exec_into_a(state, driver)
        assert isinstance(outcome, UnavailableError), outcome
        assert f"served by process {os.getpid()}" in outcome.message
    finally:
        impostor.close()
