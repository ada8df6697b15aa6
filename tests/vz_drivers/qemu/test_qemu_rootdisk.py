"""A Machine's root disk holds the image's files as its layers say, seen from inside a booted guest (QEMU, TCG).

The image: vz:default's busybox layer plus a layer with a setuid-root program (static C: it prints its real and
effective uid), a file owned by 1000:1000, a setgid directory, a device node, two names differing only in case
and a whiteout of ``/etc/hosts``; its user is ``dev``. ``/srv`` also holds 600 more files, so it is written
as a large directory (indexed first, its other entries linked in by hash). The tests themselves run as root
here, but nothing of the host's view of the files reaches the disk (``vz_drivers._images._ext4``;
tests/vz_drivers/_images/test_images_ext4.py writes a disk as ``nobody`` and reads it back entry by entry).
"""

from __future__ import annotations

import asyncio
import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine_testlib import run
from qemu_testlib import make_driver, qemu_processes

from vz_core import HostRequirements, RunImageRequest
from vz_drivers._images._build import build_oci_layout
from vz_drivers._images._default import default_layer, find_busybox
from vz_drivers._images._model import ImageConfig
from vz_drivers.qemu import cleanup_state

pytestmark = pytest.mark.slow

_EUID_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("%d %d\n", (int)getuid(), (int)geteuid()); return 0; }
"""


def _entry(name: str, kind: bytes, data: bytes = b"", **kw: object) -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.size = len(data)
    ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti, data


def _upper_layer(euid: bytes) -> bytes:
    entries = [
        _entry("usr/local", tarfile.DIRTYPE),
        _entry("usr/local/bin", tarfile.DIRTYPE),
        _entry("usr/local/bin/euid", tarfile.REGTYPE, euid, mode=0o4755),
        _entry("home/dev/owned", tarfile.REGTYPE, b"mine\n", uid=1000, gid=1000, mode=0o600),
        _entry("srv", tarfile.DIRTYPE, mode=0o2775, gid=1000),
        _entry("srv/Readme", tarfile.REGTYPE, b"upper\n"),
        _entry("srv/README", tarfile.REGTYPE, b"UPPER\n"),
        _entry("srv/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3),
        _entry("etc/.wh.hosts", tarfile.REGTYPE),
        # 600 names sorting first: /srv is large, so its own entries above are linked in after its htree
        *(_entry(f"srv/0000-pad-{i:04d}", tarfile.REGTYPE, b"p") for i in range(600)),
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for ti, data in entries:
            tf.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return buf.getvalue()


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory, image_dir: Path, agent_binary: str) -> Iterator[tuple[str, Path]]:
    for tool in ("qemu-system-x86_64", "mke2fs", "debugfs", "gcc"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing on this host")
    root = tmp_path_factory.mktemp("qemu-rootdisk")
    (root / "euid.c").write_text(_EUID_C)
    subprocess.run(["gcc", "-static", "-O1", "-o", str(root / "euid"), str(root / "euid.c")], check=True)
    layout = root / "layout"
    build_oci_layout(
        layout,
        [default_layer(find_busybox().path), _upper_layer((root / "euid").read_bytes())],
        config=ImageConfig(cmd=("/bin/sh",), user="dev", working_dir="/"),
        tag="v1",
    )
    state = root / "state"
    request = RunImageRequest(
        workspace_id="rootdisk",
        image=f"oci:{layout}:v1",
        host_requirements=HostRequirements(cpus=1, memory_bytes=256 * 1024 * 1024),
        entrypoint="sleep",
        args=("1000000",),
    )

    async def create() -> None:
        drv = make_driver(state, image_dir, agent_binary)
        try:
            await drv.run_image(request)
        finally:
            await drv.close()

    try:
        asyncio.run(create())
        yield request.workspace_id, state
    finally:
        asyncio.run(cleanup_state(str(state), image_dir=str(image_dir), agent_binary=agent_binary))
        left = qemu_processes(state)
        for proc in left:
            proc.kill()
        assert left == [], "a QEMU process outlived the Machine"


async def _sh(state: Path, image_dir: Path, agent_binary: str, wid: str, script: str, **spec: object) -> bytes:
    driver = make_driver(state, image_dir, agent_binary)
    try:
        result = await run(driver, wid, "sh", "-c", script, **spec)
    finally:
        await driver.close()
    assert result.exit is not None and result.exit.success, result.stderr
    return result.stdout


async def test_the_image_user_runs_id_and_a_setuid_root_binary_runs_as_root(
    machine: tuple[str, Path], image_dir: Path, agent_binary: str
) -> None:
    wid, state = machine
    out = await _sh(state, image_dir, agent_binary, wid, "id -u; id -g; id -un; /usr/local/bin/euid")
    assert out == b"1000\n1000\ndev\n1000 0\n"  # real uid dev, effective uid root: the setuid bit held


async def test_owners_modes_devices_case_and_whiteouts_are_the_layers(
    machine: tuple[str, Path], image_dir: Path, agent_binary: str
) -> None:
    wid, state = machine
    script = (
        "stat -c '%n %u %g %a %F' /usr/local/bin/euid /home/dev/owned /home/dev /srv /tmp; "
        "stat -c '%n %t:%T %F' /srv/null; cat /srv/Readme /srv/README /home/dev/owned; "
        "test -e /etc/hosts && echo hosts present || echo hosts whited out; ls /srv | wc -l"
    )
    out = await _sh(state, image_dir, agent_binary, wid, script, user="root")
    assert out.decode().splitlines() == [
        "/usr/local/bin/euid 0 0 4755 regular file",
        "/home/dev/owned 1000 1000 600 regular file",
        "/home/dev 1000 1000 755 directory",
        "/srv 0 1000 2775 directory",
        "/tmp 0 0 1777 directory",
        "/srv/null 1:3 character special file",
        "upper",
        "UPPER",
        "mine",
        "hosts whited out",
        "603",
    ]
