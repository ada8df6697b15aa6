"""The whole Machine lifecycle of the vfkit driver, on the shared layer, against a stand-in vfkit.

This host cannot run vfkit, so the test gives the backend an explicit macOS host description and a stand-in
vfkit (vfkit_standin, "agent" behaviour) that parses the real command line with the documented grammar, serves
the documented REST API, proxies the agent socket like vfkit's vsock ``connect`` mode to the real vz guest
agent running on this host, and reports readiness on the ``listen``-mode socket. What runs for real: the driver,
the layer, vfkit's private verified copy, the detached launch, readiness, the agent protocol, REST stop, the
records a relaunched driver reattaches through. What does not: Virtualization.framework and a Linux guest.
"""

from __future__ import annotations

import platform
import secrets
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
from vfkit_standin import write_executable

from vz_core import ExecExit, ExecOutput, ExecSpec, HostRequirements, Mount, MountType, RunImageRequest
from vz_core.errors import RuntimeFailureError
from vz_drivers._agent import AgentClient, AgentIdentityError
from vz_drivers._guest import write_bundle
from vz_drivers.vfkit._backend import VfkitBackend
from vz_drivers.vfkit._driver import VfkitDriver
from vz_drivers.vfkit._host import HostSupport

SECRET = "s3cr3t value, with a comma"

# The stand-in's "guest" lives in a Linux PID namespace (so it dies with the stand-in, as a VM's processes die
# with the VM). On a Mac the same lifecycle runs against real vfkit in the macOS conformance lane instead.
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the stand-in guest needs Linux PID namespaces")


@pytest.fixture(scope="module")
def agent_binary() -> str:
    from vz_drivers._agent import ensure_agent_binary

    return str(ensure_agent_binary())


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vfkit-images")


def _standins(root: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue  # exited (this host's init does not reap orphans); nothing runs
        if any(str(root) in part for part in (proc.info["cmdline"] or [])):
            found.append(proc)
    return found


def _make(root: Path, image_dir: Path, agent_binary: str) -> VfkitDriver:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), "amd64")
    mac = HostSupport(system="Darwin", macos_version=(15, 1), architecture=arch, reason="", rosetta=False, nested=False)
    bundle = write_bundle(
        root / "guest",
        {"Image": b"stand-in kernel", "initramfs.cpio": b"stand-in initramfs"},
        arch=arch,
        fmt="vfkit",
        roles={"kernel": "Image", "initrd": "initramfs.cpio"},
    )
    vfkit = write_executable(root / "brew", f"agent {agent_binary}")
    backend = VfkitBackend(
        host=mac,
        state_dir=str(root / "state"),
        image_dir=str(image_dir),
        vfkit=str(vfkit),
        guest=str(bundle.root),
        boot_timeout="60",
        stop_timeout="5",
    )
    return VfkitDriver._with_backend(backend)


@pytest.fixture
async def world(short_dir: Path, image_dir: Path, agent_binary: str) -> AsyncIterator[tuple[Path, str, str]]:
    yield short_dir, str(image_dir), agent_binary
    driver = _make(short_dir, image_dir, agent_binary)
    await driver.remove_everything()
    left = _standins(short_dir)
    for proc in left:
        proc.kill()
    assert left == [], "a stand-in vfkit or agent outlived its Machine"


async def _run(driver: VfkitDriver, workspace_id: str, *argv: str) -> tuple[bytes, bytes, int]:
    async def nothing() -> AsyncIterator[bytes]:
        return
        yield b""

    out, err, code = b"", b"", -1
    async for event in driver.exec(ExecSpec(workspace_id=workspace_id, argv=argv), nothing()):
        if isinstance(event, ExecOutput):
            if event.stream == "stdout":
                out += event.data
            else:
                err += event.data
        elif isinstance(event, ExecExit):
            code = event.exit_code
    return out, err, code


async def test_create_exec_reattach_stop_start_delete(world: tuple[Path, str, str]) -> None:
    root, image_dir, agent_binary = world
    workspace, read_only = root / "ws", root / "ro"
    workspace.mkdir()
    read_only.mkdir()
    request = RunImageRequest(
        workspace_id="vfkit machine/ü",
        image="vz:default",
        workspace_mount=Mount(MountType.BIND, str(workspace), "/workspace"),
        mounts=(
            Mount(MountType.BIND, str(read_only), "/mnt/ro", read_only=True),
            Mount(MountType.VOLUME, "vfkit-test-volume", "/mnt/volume"),
            Mount(MountType.TMPFS, "", "/mnt/scratch"),
        ),
        host_requirements=HostRequirements(cpus=1, memory_bytes=512 * 1024 * 1024),
        environment={"VZ_TEST_SECRET": SECRET},
        entrypoint="sh",
        args=("-c", "echo main says hello; exec sleep 1000000"),
    )
    driver = _make(root, Path(image_dir), agent_binary)
    await driver.run_image(request)
    wid = request.workspace_id

    details = await driver.find(wid)
    assert details is not None and details.state.status == "running"
    assert await driver.vm_state(wid) == "VirtualMachineStateRunning"
    assert await _run(driver, wid, "sh", "-c", "echo hi; echo oops >&2; exit 3") == (b"hi\n", b"oops\n", 3)
    # The booting handshake handed the boot's identity key to the agent (over vfkit's vsock socket): the agent
    # proves that key on a new connection, and a host expecting another key refuses it.
    backend = driver._backend
    (record,) = list(backend.book.records())
    agent_sock = str(Path(record.socket_dir) / "agent.sock")
    async with await AgentClient.connect_unix(agent_sock, identity_key=backend.identity_key(record)) as client:
        assert await client.ping() >= 0
    with pytest.raises(AgentIdentityError):
        await AgentClient.connect_unix(agent_sock, identity_key=secrets.token_bytes(32))

    state = root / "state" / "machines"
    (machine,) = list(state.iterdir())
    config = machine / "cfg" / "config.sh"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    text = config.read_text()
    assert "vz_virtiofs vzm0 /workspace rw" in text and "vz_virtiofs vzm1 /mnt/ro ro" in text
    assert "vz_tmpfs /mnt/scratch rw" in text and "vz_agent_vsock 1024 1025" in text
    log = (machine / "run" / "vfkit.log").read_text()
    assert SECRET not in log  # secrets travel in the 0600 config, never on vfkit's command line
    vfkits = [p for p in _standins(root) if any(part.endswith("/vfkit") for part in p.cmdline()[:2])]
    assert len(vfkits) == 1
    # The stand-in's agent plays the guest (its arguments would be inside the VM); vfkit's own never hold it.
    assert SECRET not in " ".join(vfkits[0].cmdline())

    # A relaunched plugin: a new driver object finds the Machine through its record and sockets.
    await driver.close()
    again = _make(root, Path(image_dir), agent_binary)
    assert (await _run(again, wid, "echo", "reattached"))[0] == b"reattached\n"

    await again.stop(wid)
    stopped = await again.find(wid)
    assert stopped is not None and stopped.state.status == "stopped"
    assert _standins(root) == []  # vfkit ended with the guest; nothing else remains
    kept = b"".join([chunk async for chunk in again.logs(wid)])
    assert b"main says hello" in kept

    await again.start(wid)
    assert (await _run(again, wid, "true"))[2] == 0
    await again.delete(wid)
    assert await again.find(wid) is None
    assert _standins(root) == []
    await again.close()


async def test_a_boot_failure_reports_vfkits_output_and_leaves_nothing(world: tuple[Path, str, str]) -> None:
    root, image_dir, agent_binary = world
    driver = _make(root, Path(image_dir), agent_binary)
    (root / "brew" / "behaviour").write_text("crash")
    with pytest.raises(RuntimeFailureError) as info:
        await driver.run_image(RunImageRequest(workspace_id="x", image="vz:default"))
    assert "storage device attachment is invalid" in info.value.message
    assert "Kernel panic - not syncing: stand-in" in info.value.runtime_message
    assert await driver.find("x") is None
    await driver.close()


async def test_a_path_vfkit_cannot_carry_is_refused_before_anything_is_created(world: tuple[Path, str, str]) -> None:
    from vz_core.errors import InvalidArgumentError

    root, image_dir, agent_binary = world
    awkward = root / "a,b"
    awkward.mkdir()
    driver = _make(root, Path(image_dir), agent_binary)
    request = RunImageRequest(
        workspace_id="comma", image="vz:default", workspace_mount=Mount(MountType.BIND, str(awkward), "/workspace")
    )
    with pytest.raises(InvalidArgumentError, match="comma"):
        await driver.run_image(request)
    assert await driver.find("comma") is None
    machines = root / "state" / "machines"
    assert not machines.exists() or list(machines.iterdir()) == []
    assert _standins(root) == []
    await driver.close()
