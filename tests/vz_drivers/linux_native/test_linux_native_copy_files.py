"""Files in and out of a linux_native Machine with the documented one-liners (docs/user-guide.md, "Files in and
out"), through the real `vz` (CLI, daemon, plugin): a tar stream piped through `vz exec`, both directions, byte
for byte (binary data, an empty file, modes, a symbolic link kept as a link)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from topology_testlib import ProjectVz, vz_project

pytestmark = pytest.mark.root

DEFINITION = {
    "version": 2,
    "project_id": "copy-files",
    "machines": [
        {
            "name": "m",
            "profile": "developer",
            "driver": "linux_native",
            "image": "vz:default",
            "workspace": {"projection": "none"},
        }
    ],
}


def _pipe(left: list[str], right: list[str], vz: ProjectVz, cwd: Path) -> None:
    """``left | right`` (each a command line; "vz" is the real vz of ``vz``), both must exit 0."""
    argv = [[vz.exe if a == "vz" else a for a in side] for side in (left, right)]
    first = subprocess.Popen(argv[0], cwd=cwd, env=vz.environ, stdout=subprocess.PIPE)
    assert first.stdout is not None
    second = subprocess.run(argv[1], cwd=cwd, env=vz.environ, stdin=first.stdout, capture_output=True, timeout=120)
    first.stdout.close()
    assert first.wait(120) == 0 and second.returncode == 0, second.stderr.decode()


def _tree(root: Path) -> dict[str, tuple[str, bytes, int]]:
    out: dict[str, tuple[str, bytes, int]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path).encode(), 0)
        elif path.is_file():
            out[rel] = ("file", path.read_bytes(), path.stat().st_mode & 0o777)
        else:
            out[rel] = ("dir", b"", 0)
    return out


def test_tar_through_vz_exec_copies_a_tree_in_and_out_exactly(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "data.bin").write_bytes(bytes(range(256)) * 400)
    (src / "empty").write_bytes(b"")
    (src / "sub" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "sub" / "run.sh").chmod(0o755)
    (src / "link").symlink_to("sub/run.sh")
    out = tmp_path / "out"
    out.mkdir()
    with vz_project(tmp_path, DEFINITION) as vz:
        vz.ok("up")
        # In: the host's tree to /srv/in in the Machine.
        _pipe(
            ["tar", "-C", str(src), "-c", "."],
            ["vz", "exec", "--", "sh", "-c", "mkdir -p /srv/in && tar -x -C /srv/in"],
            vz,
            vz.cwd,
        )
        assert vz.sh("m", "cat /srv/in/link") == "#!/bin/sh\necho hi"
        # Out: the Machine's tree back to the host.
        _pipe(["vz", "exec", "--", "tar", "-C", "/srv/in", "-c", "."], ["tar", "-x", "-C", str(out)], vz, vz.cwd)
        # One file in and out through stdin / stdout.
        _pipe(["cat", str(src / "data.bin")], ["vz", "exec", "--", "sh", "-c", "cat > /srv/one"], vz, vz.cwd)
        one = subprocess.run([vz.exe, "exec", "--", "cat", "/srv/one"], cwd=vz.cwd, env=vz.environ, capture_output=True)
        assert one.returncode == 0 and one.stdout == (src / "data.bin").read_bytes()
    assert _tree(out) == _tree(src)
