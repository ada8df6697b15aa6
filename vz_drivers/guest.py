"""``vz guest``: build, verify and fetch vz Linux guest bundles (``python -m vz_drivers.guest``).

::

    vz guest build --arch arm64 --format vfkit --out DIR     # on a Debian/Ubuntu machine (apt-get download)
    vz guest verify DIR                                       # every file against manifest.json
    vz guest fetch SOURCE                                     # into the cache; prints the cached directory
    vz guest fetch RELEASE/SHA256SUMS --arch arm64 --format vfkit   # a release's bundle, pinned by that list

The work is ``vz_drivers._guest``'s (``build_bundle``, ``verify_bundle``, ``open_bundle``); see the drivers' docs
(docs/drivers/vfkit.md, hyperv.md) for which bundle a host needs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from vz_drivers._guest import (
    ARCHES,
    FORMATS,
    SUMS,
    Bundle,
    build_bundle,
    bundle_cache,
    create_root_disk,
    fetch_release,
    open_bundle,
    verify_bundle,
)

__all__ = ["create_root_disk", "main"]
# create_root_disk: what the VM drivers write each Machine's ext4 root disk with, from the image's layers (public
# here for tools that measure or check it: benchmarks/b12_rootdisk_ext4.py).


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vz guest",
        description="vz Linux guest bundles: the kernel, the initramfs with the guest agent, and a manifest of "
        "SHA-256 digests, built from pinned Debian packages for hosts without a Linux system (vfkit, hyperv).",
    )
    sub = parser.add_subparsers(dest="action", metavar="{build,verify,fetch}")
    sub.required = True
    build = sub.add_parser("build", help="build a bundle (on a Debian or Ubuntu machine: apt-get download)")
    build.add_argument("--arch", required=True, choices=ARCHES, help="the guest's architecture")
    build.add_argument("--format", required=True, choices=FORMATS, help="the VMM it boots under")
    build.add_argument("--out", required=True, type=Path, help="a new (or empty) directory for the bundle")
    build.add_argument(
        "--debs", type=Path, default=None, help="cache of the pinned .deb files (default: <vz cache>/guest/debs)"
    )
    verify = sub.add_parser("verify", help="check every file of a bundle against its manifest")
    verify.add_argument("path", type=Path)
    fetch = sub.add_parser(
        "fetch",
        help="copy a bundle into the cache, verified: a release's SHA256SUMS (with --arch and --format), or a "
        "bundle's directory or https:// URL of its manifest.json",
    )
    fetch.add_argument(
        "source", help="https:// URL (or absolute path) of a release's SHA256SUMS, or of a bundle's manifest.json"
    )
    fetch.add_argument("--arch", choices=ARCHES, default=None, help="with SHA256SUMS: the guest's architecture")
    fetch.add_argument("--format", choices=FORMATS, default=None, help="with SHA256SUMS: vfkit, hyperv or qemu")
    fetch.add_argument("--sha256", default="", help="without SHA256SUMS: the SHA-256 its manifest.json must have")
    return parser


_DRIVER = {"vfkit": "vfkit", "hyperv": "hyperv"}
"""The driver that boots each bundle format (``qemu`` boots the host's own kernel and takes no bundle)."""


def _fetch(args: argparse.Namespace) -> Bundle:
    from vz_core.errors import InvalidArgumentError

    if re.split(r"[/\\]", args.source.rstrip("/\\"))[-1] == SUMS:  # a URL, a POSIX or a Windows path
        if args.arch is None or args.format is None or args.sha256:
            raise InvalidArgumentError(
                "with a release's SHA256SUMS give --arch and --format (the list pins the manifest: no --sha256)"
            )
        return fetch_release(args.source, args.arch, args.format, bundle_cache())
    if args.arch is not None or args.format is not None:
        raise InvalidArgumentError("--arch and --format choose a bundle of a release's SHA256SUMS")
    return open_bundle(args.source, bundle_cache(), digest=args.sha256)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from vz_core.errors import DriverError

    try:
        if args.action == "build":
            from vz_drivers._agent import ensure_agent_binary

            agent = ensure_agent_binary(args.arch)
            debs = args.debs.absolute() if args.debs else bundle_cache().parent / "debs"
            bundle = build_bundle(args.arch, args.format, args.out.absolute(), agent=agent, debs=debs)
        elif args.action == "verify":
            bundle = verify_bundle(args.path.absolute())
        else:
            bundle = _fetch(args)
    except DriverError as exc:
        sys.stderr.write(f"vz guest {args.action}: error: {exc.message}\n")
        return 1
    sys.stdout.write(f"{bundle.root}\nsha256 {bundle.digest}  {bundle.arch} {bundle.format}\n")
    driver = _DRIVER.get(bundle.format)
    if args.action == "fetch" and driver:
        sys.stdout.write(f"vz driver configure {driver} guest={bundle.root} guest_sha256={bundle.digest}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
