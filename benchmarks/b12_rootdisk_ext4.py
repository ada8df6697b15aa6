"""B12: writing an ext4 root disk from image layers (``write_ext4`` in ``vz_drivers/_images/_ext4.py``).

The writer is the one the VM drivers use (``vz_drivers.guest.create_root_disk``). The layers are made here
(one uncompressed tar, files of a few bytes): ``flat`` puts N files in one directory, ``spread`` the same N files
in N/100 directories of 100, ``image`` a tree shaped like a large Debian image (about 78k entries: many
directories of tens of files and a few of several thousand). A case is timed end to end (merge of the layers,
mke2fs, debugfs and, with large directories, e2fsck) and its CPU time is the processes' own (this one's plus
its children's user + system), which the shared machine's load moves less than the wall clock; both are
reported. The scaling figure is ``flat`` at N and 2N: linear is a ratio of about 2, a writer quadratic per
directory about 4.

Run alone: ``python -m benchmarks.b12_rootdisk_ext4 [--smoke]``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import resource
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ID = "B12"
TITLE = "ext4 root disk written from image layers (flat vs spread directories, an image-sized tree)"

_MTIME = 1_700_000_000


def _layer(where: Path, dirs: dict[str, int]) -> list[tuple[str, Path]]:
    """One layer with ``count`` small files in each directory of ``dirs``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        made: set[str] = set()
        for directory, count in dirs.items():
            parts = directory.split("/")
            for depth in range(1, len(parts) + 1):
                name = "/".join(parts[:depth])
                if name not in made:
                    made.add(name)
                    info = tarfile.TarInfo(name)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, _MTIME
                    tf.addfile(info)
            for i in range(count):
                data = b"%d\n" % i
                info = tarfile.TarInfo(f"{directory}/file-{i:06d}.txt")
                info.size, info.mode, info.mtime = len(data), 0o644, _MTIME
                tf.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    path = where / "layer.tar"
    path.write_bytes(blob)
    return [(f"sha256:{hashlib.sha256(blob).hexdigest()}", path)]


def _image_shape(scale: int) -> dict[str, int]:
    """About 76k entries at scale 1: 2000 directories of 30 files, 4 of 2500, one of 6000."""
    shape = {f"usr/share/d{d // 50:02d}/p{d:04d}": 30 // scale for d in range(2000 // scale)}
    for d in range(4):
        shape[f"usr/lib/big{d}"] = 2500 // scale
    shape["usr/share/zoneinfo-like"] = 6000 // scale
    return shape


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _case(workdir: Path, name: str, dirs: dict[str, int]) -> dict[str, Any]:
    from vz_drivers.guest import create_root_disk

    where = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    layers = _layer(where, dirs)
    entries = sum(dirs.values()) + len(dirs)
    size = max(256 << 20, entries * 8192)
    load = os.getloadavg()[0]
    c0, t0 = _cpu(), time.perf_counter()
    asyncio.run(create_root_disk(layers, where / "disk.img", size, image=name))
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    for path in where.iterdir():
        path.unlink()
    where.rmdir()
    return {"entries": entries, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "load_before": round(load, 1)}


async def run(ctx: Any) -> dict[str, Any]:
    n = 2000 if ctx.smoke else 8000
    scale = 20 if ctx.smoke else 1
    cases: dict[str, dict[str, Any]] = {}
    cases[f"flat_{n}"] = await asyncio.to_thread(_case, ctx.workdir, "flat", {"d": n})
    cases[f"flat_{2 * n}"] = await asyncio.to_thread(_case, ctx.workdir, "flat2", {"d": 2 * n})
    cases[f"spread_{2 * n}"] = await asyncio.to_thread(
        _case, ctx.workdir, "spread", {f"d{d:03d}": 100 for d in range(2 * n // 100)}
    )
    cases["image"] = await asyncio.to_thread(_case, ctx.workdir, "image", _image_shape(scale))
    ratio = cases[f"flat_{2 * n}"]["cpu_s"] / max(cases[f"flat_{n}"]["cpu_s"], 0.01)
    return {
        "headline": (
            f"flat {n}: {cases[f'flat_{n}']['cpu_s']} s CPU, flat {2 * n}: {cases[f'flat_{2 * n}']['cpu_s']} s "
            f"(x{ratio:.1f}), spread {2 * n}: {cases[f'spread_{2 * n}']['cpu_s']} s, image "
            f"({cases['image']['entries']} entries): {cases['image']['cpu_s']} s CPU / {cases['image']['wall_s']} s"
        ),
        "flat_doubling_ratio": round(ratio, 2),
        "cases": cases,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.b12_rootdisk_ext4", description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vz-bench-B12-") as tmp:

        class _Ctx:
            smoke = args.smoke
            workdir = Path(tmp)

        print(json.dumps(asyncio.run(run(_Ctx())), indent=2))


if __name__ == "__main__":
    main()
