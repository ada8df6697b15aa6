"""``vz guest``: build, verify and fetch vz Linux guest bundles (``python -m vz_drivers.guest``).

::

    vz guest build --arch arm64 --format vfkit --out DIR     # on a Debian/Ubuntu machine (apt-get download)
    vz guest verify DIR                                       # every file against manifest.json
    vz guest fetch SOURCE                                     # into the cache; prints the cached directory

The work is ``vz_drivers._guest``'s (``build_bundle``, ``verify_bundle``, ``open_bundle``); see the drivers' docs
(docs/drivers/vfkit.md, hyperv.md) for which bundle a host needs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from vz_drivers._guest import ARCHES, FORMATS, build_bundle, bundle_cache, open_bundle, verify_bundle

__all__ = ["main"]


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
        "fetch", help="copy a bundle (directory or https:// URL of its manifest.json) into the cache"
    )
    fetch.add_argument("source")
    fetch.add_argument("--sha256", default="", help="the SHA-256 its manifest.json must have")
    return parser


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
            bundle = open_bundle(args.source, bundle_cache(), digest=args.sha256)
    except DriverError as exc:
        sys.stderr.write(f"vz guest {args.action}: error: {exc.message}\n")
        return 1
    sys.stdout.write(f"{bundle.root}\nsha256 {bundle.digest}  {bundle.arch} {bundle.format}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
