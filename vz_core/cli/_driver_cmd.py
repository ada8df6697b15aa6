"""`vz driver list | add MANIFEST|URL | upgrade | rollback | remove | verify | configure | keygen | sign | trust`.

The work is done by ``vz_core.drivers`` (built-in registry + external manifests, checksums, host configuration),
``vz_core._install`` (URL installs, upgrade, rollback, removal, provenance), ``vz_core._trustroots`` (trusted
keys and the signature policy) and ``vz_core._signing`` (keys and signatures).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vz_core._download import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT
from vz_core._trustroots import POLICIES
from vz_core.errors import TrustError, UserError

__all__ = ["add_driver_arguments", "run_driver_command"]


def add_driver_arguments(parser: argparse.ArgumentParser) -> None:
    """The sub-commands of `vz driver` on ``parser``."""
    sub = parser.add_subparsers(
        dest="action", metavar="{list,add,upgrade,rollback,remove,verify,configure,keygen,sign,trust}"
    )
    sub.required = True
    listing = sub.add_parser("list", help="installed drivers, with where each came from and who signed it")
    listing.add_argument("--json", action="store_true")
    add = sub.add_parser(
        "add",
        help="add an external driver from a manifest file, or install one from an https:// manifest URL",
        description="A URL is downloaded with its binary for this os/arch; the manifest's signature is checked "
        "against your trust roots (`vz driver trust`) and the binary's SHA-256 before anything is recorded.",
    )
    add.add_argument("manifest", metavar="MANIFEST|URL")
    _download_arguments(add)
    add.add_argument("--json", action="store_true")
    upgrade = sub.add_parser("upgrade", help="install a newer version from where a driver was installed")
    upgrade.add_argument("name", metavar="NAME")
    upgrade.add_argument("--url", help="the manifest URL to upgrade from (default: where it was installed from)")
    _download_arguments(upgrade)
    upgrade.add_argument("--json", action="store_true")
    rollback = sub.add_parser("rollback", help="make the previous version of an external driver current again")
    rollback.add_argument("name", metavar="NAME")
    rollback.add_argument("--json", action="store_true")
    remove = sub.add_parser("remove", help="forget an external driver and delete what was installed for it")
    remove.add_argument("name", metavar="NAME")
    remove.add_argument("--json", action="store_true")
    keygen = sub.add_parser("keygen", help="write a new Ed25519 signing key pair (PATH and PATH.pub)")
    keygen.add_argument("path", type=Path, metavar="PATH")
    keygen.add_argument("--json", action="store_true")
    sign = sub.add_parser("sign", help="sign a manifest with your private key (in place, or to --output)")
    sign.add_argument("manifest", type=Path, metavar="MANIFEST")
    sign.add_argument("--key", type=Path, required=True, metavar="PRIVATE_KEY")
    sign.add_argument(
        "--endorsed-by",
        type=Path,
        metavar="OLD_PRIVATE_KEY",
        help="rotating keys: the old key endorses the new one, so users who trust the old key accept it",
    )
    sign.add_argument("--output", type=Path, metavar="FILE")
    sign.add_argument("--json", action="store_true")
    trust = sub.add_parser("trust", help="the keys you trust to sign drivers, and the signature policy")
    trust_sub = trust.add_subparsers(dest="trust_action", metavar="{add,list,remove,revoke,policy}")
    trust_sub.required = True
    trust_add = trust_sub.add_parser("add", help="trust a provider's public key")
    trust_add.add_argument("keyfile", type=Path, metavar="KEYFILE")
    trust_add.add_argument("--name", required=True, help="whose key it is (shown in `vz driver list`)")
    trust_sub.add_parser("list", help="trusted keys and the policy")
    trust_remove = trust_sub.add_parser("remove", help="forget a key (id or name)")
    trust_remove.add_argument("key", metavar="KEY_ID|NAME")
    trust_revoke = trust_sub.add_parser("revoke", help="refuse everything a key signs or endorses from now on")
    trust_revoke.add_argument("key", metavar="KEY_ID|NAME")
    policy = trust_sub.add_parser("policy", help="show or set whether a signature is required")
    policy.add_argument("--url", choices=POLICIES, help="drivers installed from a URL (default require-signature)")
    policy.add_argument("--file", choices=POLICIES, help="manifests added from a local file (default optional)")
    for verb in (trust_add, trust_remove, trust_revoke, policy):
        verb.add_argument("--json", action="store_true")
    trust_sub.choices["list"].add_argument("--json", action="store_true")
    verify = sub.add_parser("verify", help="re-hash driver binaries against their manifests")
    verify.add_argument("name", nargs="?")
    verify.add_argument("--json", action="store_true")
    configure = sub.add_parser(
        "configure",
        help="show or change a built-in driver's host configuration (<VZ_HOME>/config/drivers.json)",
        description="Options of scope 'host' (binaries, host paths, host networks) can only be set here, never "
        "in vz.json; project-scoped options set here are defaults a vz.json may override.",
    )
    configure.add_argument("name", metavar="NAME")
    configure.add_argument("assignments", nargs="*", metavar="KEY=VALUE", help="options to set")
    configure.add_argument("--unset", action="append", default=[], metavar="KEY", help="remove an option")
    configure.add_argument("--json", action="store_true")


def _download_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-downgrade", action="store_true", help="install an older version than installed")
    parser.add_argument(
        "--max-size", type=int, default=DEFAULT_MAX_BYTES, metavar="BYTES", help="largest binary to download"
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS", help="give up after this long without data"
    )


def _signer(provenance: dict[str, Any]) -> str:
    if not provenance:
        return ""
    who = (
        f"signed by {provenance.get('key_name')} ({provenance.get('key_id')})"
        if provenance.get("signed")
        else "unsigned"
    )
    return f"  {who}, from {provenance.get('source', '?')}"


def _describe(row: dict[str, Any]) -> str:
    if row.get("origin") == "external":
        detail = f"{row.get('version', '?')} API {row.get('api_version', '?')} {row.get('binary', '(no binary here)')}"
        if row.get("sha256"):
            detail += f" sha256:{row['sha256'][:12]}"
        detail += _signer(row.get("provenance", {}))
    else:
        detail = f"{','.join(row.get('targets', []))}  {row.get('summary', '')}"
    return f"{row['name']:<16} {row.get('origin', ''):<9} {detail}".rstrip()


def run_driver_command(args: argparse.Namespace) -> int:
    """Run one `vz driver` action; the exit status."""
    from vz_core import drivers

    if args.action == "list":
        rows = drivers.list_drivers()
        if args.json:
            sys.stdout.write(json.dumps({"drivers": rows}, indent=2) + "\n")
        else:
            sys.stdout.write("".join(_describe(row) + "\n" for row in rows))
        return 0
    if args.action in ("add", "upgrade", "rollback", "remove"):
        return _install_command(args)
    if args.action in ("keygen", "sign", "trust"):
        return _trust_command(args)
    if args.action == "configure":
        result = drivers.configure(args.name, args.assignments, args.unset)
        if args.json:
            sys.stdout.write(json.dumps(result, indent=2) + "\n")
        else:
            sys.stdout.write(f"{result['name']} host configuration ({result['path']}):\n")
            options = result["options"]
            sys.stdout.write("".join(f"  {k} = {json.dumps(v)}\n" for k, v in sorted(options.items())) or "  (none)\n")
        return 0
    rows = drivers.verify(args.name)
    if args.json:
        sys.stdout.write(json.dumps({"drivers": rows}, indent=2) + "\n")
    else:
        for row in rows:
            sys.stdout.write(f"{row['name']:<16} {'ok' if row['ok'] else 'FAILED':<6} {row['detail']}\n")
    failed = [row["name"] for row in rows if not row["ok"]]
    if failed:
        raise TrustError(f"verification failed for {', '.join(failed)}; re-add a trusted manifest (vz driver add)")
    return 0


def _emit(args: argparse.Namespace, row: dict[str, Any], text: str) -> int:
    sys.stdout.write(json.dumps(row, indent=2) + "\n" if args.json else text)
    return 0


def _install_command(args: argparse.Namespace) -> int:
    from vz_core import _install, drivers

    if args.action == "add":
        source = str(args.manifest)
        if source.startswith(("https://", "http://")):
            if args.max_size <= 0 or args.timeout <= 0:
                raise UserError("--max-size and --timeout must be positive")
            row = _install.add_url(
                source, allow_downgrade=args.allow_downgrade, max_bytes=args.max_size, timeout=args.timeout
            )
        else:
            if "://" in source:
                raise UserError(f"{source[:200]!r}: vz installs drivers from https:// URLs or local manifest files")
            row = drivers.add_manifest(Path(source))
        text = f"{row.get('status', 'added')} driver {row['name']} ({row.get('binary', '')})"
        text += f" version {row.get('version', '?')}"
        return _emit(args, row, text + _signer(row.get("provenance", {})) + "\n" + _changes(row))
    if args.action == "upgrade":
        row = _install.upgrade(
            args.name, url=args.url, allow_downgrade=args.allow_downgrade, max_bytes=args.max_size, timeout=args.timeout
        )
        return _emit(args, row, f"{row['status']} driver {row['name']} {row.get('version', '')}\n" + _changes(row))
    if args.action == "rollback":
        row = _install.rollback(args.name)
        return _emit(args, row, f"rolled back driver {row['name']} from {row['from_version']} to {row['version']}\n")
    row = _install.remove(args.name)
    return _emit(args, row, f"removed driver {row['name']} {row['version']}\n")


def _changes(row: dict[str, Any]) -> str:
    return "".join(
        f"  {key}: {change['from'] if change['from'] is not None else '-'} -> {change['to']}\n"
        for key, change in row.get("changes", {}).items()
    )


def _trust_command(args: argparse.Namespace) -> int:
    from vz_core import _signing
    from vz_core._trustroots import TrustRoots

    if args.action == "keygen":
        private, public, kid = _signing.generate_keypair(args.path)
        row = {"private_key": str(private), "public_key": str(public), "key_id": kid}
        return _emit(args, row, f"key {kid}: private {private} (keep it secret), public {public} (publish it)\n")
    if args.action == "sign":
        from vz_core.trust import load_manifest

        load_manifest(args.manifest)  # a manifest vz would accept, before it is signed
        raw = json.loads(args.manifest.read_bytes())
        old = _signing.load_private_key(args.endorsed_by) if args.endorsed_by else None
        signed = _signing.sign_manifest(raw, _signing.load_private_key(args.key), endorsed_by=old)
        out: Path = args.output or args.manifest
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(signed, indent=2) + "\n")
        tmp.replace(out)
        row = {"manifest": str(out), "key_id": signed["signature"]["key_id"]}
        return _emit(args, row, f"signed {out} with key {row['key_id']}\n")
    roots = TrustRoots()
    if args.trust_action == "add":
        row = roots.add(args.keyfile, args.name)
        return _emit(args, row, f"{row['status']} trusted key {row['key_id']} ({row['name']})\n")
    if args.trust_action == "remove":
        row = roots.remove(args.key)
        return _emit(args, row, f"removed key {row['key_id']} ({row['name']})\n")
    if args.trust_action == "revoke":
        row = roots.revoke(args.key)
        return _emit(args, row, f"revoked key {row['key_id']} ({row['name']}) at {row['revoked_at']}\n")
    if args.trust_action == "policy":
        policy = roots.set_policy(url=args.url, file=args.file)
        text = "".join(f"{origin}: {value}\n" for origin, value in sorted(policy.items()))
        return _emit(args, {"policy": policy}, text)
    listing = roots.listing()
    lines = [f"policy: url {listing['policy']['url']}, file {listing['policy']['file']} ({listing['path']})\n"]
    for key in listing["keys"]:
        state = f"revoked {key['revoked_at']}" if key.get("revoked_at") else "trusted"
        endorsed = f", endorsed by {key['endorsed_by']}" if key.get("endorsed_by") else ""
        lines.append(f"{key['key_id']}  {state:<8} {key['name']}{endorsed}\n")
    return _emit(args, listing, "".join(lines))
