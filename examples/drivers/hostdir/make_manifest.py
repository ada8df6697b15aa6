"""Build the hostdir plugin as one executable file and write its manifest, with the file's SHA-256.

    python make_manifest.py [--out DIR] [--python INTERPRETER] [--platform OS/ARCH] [--arg=ARG ...]

The plugin is a Python zip application (PEP 441): the driver package and a ``__main__`` in one file whose
``#!`` line names INTERPRETER (default: the Python running this script, which must have vz installed) with
``-I``, so PYTHONPATH and user site-packages cannot change what runs. vz hashes exactly this file before every
launch, so the checksum covers the driver's code. The archive is reproducible: fixed timestamps and order, so
the same sources and interpreter path always give the same SHA-256.

The manifest is ``manifest.json`` (the template beside this script) with one binary: this host's os/arch (or
``--platform``), pointing at the built file with its real checksum. Entries for other platforms are left out:
a manifest only lists files someone built and hashed. Each ``--arg`` is appended to the manifest's ``args`` (what
vz passes the plugin), e.g. ``--arg=--state-dir --arg=/srv/hostdir``. Then: ``vz driver add DIR/manifest.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from pathlib import Path

from vz_core.trust import host_platform, parse_manifest

HERE = Path(__file__).resolve().parent
PACKAGE = HERE / "src" / "vz_driver_hostdir"
NAME = "vz-driver-hostdir"
MAIN = b"from vz_driver_hostdir.plugin import main\n\nmain()\n"
EPOCH = (1980, 1, 1, 0, 0, 0)


def build(out: Path, interpreter: str) -> Path:
    """Write the zip application ``out/vz-driver-hostdir`` (mode 0755) and return its path."""
    files = {f"vz_driver_hostdir/{p.name}": p.read_bytes() for p in sorted(PACKAGE.iterdir()) if p.suffix == ".py"}
    files.pop("vz_driver_hostdir/adapter.py")  # only the conformance run imports it, never the plugin
    files["__main__.py"] = MAIN
    target = out / NAME
    with target.open("wb") as handle:
        handle.write(f"#!{interpreter} -I\n".encode())
        with zipfile.ZipFile(handle, "w") as archive:
            for name, data in files.items():
                archive.writestr(zipfile.ZipInfo(name, EPOCH), data, compress_type=zipfile.ZIP_DEFLATED)
    target.chmod(0o755)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "dist", help="output directory (default: ./dist)")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the #! line (default: this one)")
    parser.add_argument("--platform", default=host_platform(), help="os/arch of the binary (default: this host)")
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="ARG",
        help="append ARG to the manifest's args (repeat; write --arg=--state-dir for one starting with -)",
    )
    args = parser.parse_args()
    template = json.loads((HERE / "manifest.json").read_text())
    if args.platform not in template["binaries"]:
        parser.error(f"manifest.json has no entry for {args.platform}; it has {', '.join(template['binaries'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    binary = build(args.out, args.python)
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    entry = dict(template["binaries"][args.platform], path=binary.name, sha256=digest)
    manifest = dict(template, binaries={args.platform: entry})
    manifest["args"] = [*template.get("args", []), *args.arg]
    parse_manifest(manifest, source="the generated manifest")  # vz's own validation, before writing anything
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"{binary}  sha256 {digest}")
    print(f"next: vz driver add {args.out / 'manifest.json'}")


if __name__ == "__main__":
    main()
