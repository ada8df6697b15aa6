"""``vz-conformance``: run the conformance suite, verify a report, list the catalogue, print the report schema.

Exit codes: 0 = success (run: every case passed or is not applicable; verify-report: the gate passed);
1 = cases failed / the gate rejected the report; 2 = usage error or an unreadable report (one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vz_conformance import _catalogue
from vz_conformance._adapter import Adapter
from vz_conformance._gate import expected_count, verify
from vz_conformance._providers import (
    DaemonProvider,
    DriverProvider,
    ExternalProvider,
    InProcessProvider,
    sha256_of,
)
from vz_conformance._report import CaseEntry, Report, load_report, schema
from vz_conformance._runner import DEFAULT_CASE_TIMEOUT, run_suite
from vz_conformance.adapters import adapter_for, load_adapter
from vz_core.errors import VzError

__all__ = ["build_parser", "main"]

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")

PROG = "vz-conformance"


class UsageError(Exception):
    """Bad flags or an unusable input: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="The vz driver conformance suite.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the suite against a driver and write a JSON report")
    source = run.add_argument_group("driver under test")
    source.add_argument(
        "--driver",
        metavar="NAME",
        help="a registered (built-in) driver, built in-process; its "
        "plugin command serves the external side of a parity run",
    )
    source.add_argument("--plugin", metavar="PATH", help="a plugin binary, launched through the supervisor")
    source.add_argument("--sha256", metavar="HEX", help="the plugin binary's SHA-256 (required with --plugin)")
    source.add_argument(
        "--plugin-arg", metavar="ARG", action="append", default=[], help="an extra argument for the plugin (repeatable)"
    )
    source.add_argument(
        "--driver-option",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="an option for the in-process driver factory (repeatable)",
    )
    source.add_argument(
        "--adapter",
        metavar="MODULE:ATTR",
        help="your Adapter (default: the suite's adapter for --driver, else POSIX defaults)",
    )
    source.add_argument("--image", help="image of every Machine the suite creates (overrides the adapter)")
    run.add_argument(
        "--provider-mode",
        choices=("in-process", "external", "parity"),
        help="default: in-process with --driver, external with --plugin",
    )
    run.add_argument(
        "--through-daemon",
        action="store_true",
        help="run the external side against the vz daemon's own plugin of --driver (its warm, checksum-verified "
        "session, through Drivers.Connect; the daemon of VZ_HOME, started if none runs)",
    )
    run.add_argument("--label", action="append", choices=_catalogue.LABELS, help="run only this label (repeatable)")
    run.add_argument(
        "--case",
        metavar="ID",
        action="append",
        help="run only cases matching this id or pattern (debugging: such a report never passes)",
    )
    run.add_argument("--dry-run", action="store_true", help="list what would run (such a report never passes)")
    run.add_argument("--report", metavar="FILE", type=Path, help="write the JSON report here")
    run.add_argument("--handshake-timeout", type=float, default=15.0, metavar="S")
    run.add_argument("--case-timeout", type=float, default=DEFAULT_CASE_TIMEOUT, metavar="S")

    gate = sub.add_parser(
        "verify-report",
        help="apply the gate to a report (or an in-process and an external report together in parity mode)",
    )
    gate.add_argument("reports", nargs="+", type=Path, metavar="REPORT")
    gate.add_argument(
        "--label",
        action="append",
        choices=_catalogue.LABELS,
        help="the labels the run must hold exactly (repeatable; default: every label)",
    )
    gate.add_argument(
        "--expect-count",
        type=int,
        required=True,
        metavar="N",
        help="the exact number of cases (parity: the external run's count, see `list --count`)",
    )
    gate.add_argument("--provider-mode", choices=("in-process", "external", "parity"), default="external")

    lst = sub.add_parser("list", help="print the case catalogue")
    lst.add_argument("--label", action="append", choices=_catalogue.LABELS)
    lst.add_argument("--provider-mode", choices=("in-process", "external", "parity"), default="external")
    lst.add_argument("--count", action="store_true", help="print only the count verify-report expects")
    lst.add_argument("--json", action="store_true")

    sch = sub.add_parser("schema", help="print the JSON Schema of a report")
    sch.add_argument("--output", type=Path, metavar="FILE")
    return parser


def _options(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--driver-option {pair!r} must look like KEY=VALUE")
        out[key] = value
    return out


def _adapter(args: argparse.Namespace) -> Adapter:
    try:
        adapter = load_adapter(args.adapter) if args.adapter else adapter_for(args.driver or "")
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        raise UsageError(f"--adapter {args.adapter!r}: {exc}") from None
    if args.image:
        adapter.image = args.image
    return adapter


def _plugin_side(args: argparse.Namespace, adapter: Adapter, state: Path) -> ExternalProvider:
    if args.through_daemon:
        return _daemon_side(args, adapter, state)
    external = _external_record(args.driver) if args.driver and not args.plugin else None
    if args.plugin:
        if not args.sha256:
            raise UsageError("--plugin needs --sha256 HEX (the binary's SHA-256; it is verified before every launch)")
        executable, digest, name = Path(args.plugin).absolute(), args.sha256, Path(args.plugin).name
    elif external is not None:
        # A driver added with `vz driver add`: its recorded binary, checksum and arguments.
        executable = external.manifest.binary_path(external.driver_dir)
        digest, name = external.manifest.entry_for().sha256, args.driver
        args.plugin_arg = [*external.manifest.args, *args.plugin_arg]
    else:
        from vz_core.registry import DriverRegistry

        spec = DriverRegistry().get(args.driver)
        if not spec.plugin_command:
            raise UsageError(f"driver {args.driver!r} declares no plugin command; pass --plugin PATH --sha256 HEX")
        found = shutil.which(spec.plugin_command[0])
        if found is None:
            raise UsageError(f"the plugin command {spec.plugin_command[0]!r} of driver {args.driver!r} is not on PATH")
        # A built-in's installed script: the suite takes its checksum now and verifies it before every launch.
        executable, digest, name = Path(found), sha256_of(Path(found)), args.driver
        args.plugin_arg = [*spec.plugin_command[1:], *args.plugin_arg]
    return ExternalProvider(
        executable,
        digest,
        args=[*adapter.plugin_args(state), *args.plugin_arg],
        env=adapter.plugin_env(),
        handshake_timeout=args.handshake_timeout,
        name=name,
    )


def _daemon_side(args: argparse.Namespace, adapter: Adapter, state: Path) -> DaemonProvider:
    """The daemon's own session of --driver: a built-in (its options are the in-process ones, which the daemon
    passes to the plugin, so both sides of a parity run build the driver the same way) or an external driver
    added with `vz driver add` (external runs only; it takes no options)."""
    if args.plugin or not args.driver:
        raise UsageError(
            "--through-daemon runs a driver the daemon knows (--driver NAME: built in, or added with "
            "`vz driver add`) as the vz daemon's plugin; a plugin binary (--plugin) is launched by the suite itself"
        )
    from vz_core.drivers import pin_builtin, resolve

    resolved = resolve(args.driver)
    if resolved.external is not None:
        record = resolved.external
        return DaemonProvider(
            args.driver,
            record.manifest.binary_path(record.driver_dir),
            record.manifest.entry_for().sha256,
            args=record.manifest.args,
            handshake_timeout=args.handshake_timeout,
        )
    pinned = pin_builtin(args.driver).pinned
    assert pinned is not None
    options: dict[str, Any] = {**adapter.driver_options(state), **_options(args.driver_option)}
    return DaemonProvider(
        args.driver,
        pinned.script,
        pinned.sha256,
        options=options,
        args=pinned.args,
        handshake_timeout=args.handshake_timeout,
    )


def _external_record(name: str) -> Any:
    """The record of ``name`` when it is an external driver added with `vz driver add` (else None)."""
    from vz_core.drivers import ManifestStore
    from vz_core.registry import DriverRegistry

    if name in DriverRegistry().names():
        return None
    return ManifestStore().get(name)


def _providers(args: argparse.Namespace, adapter: Adapter, root: Path) -> list[DriverProvider]:
    if bool(args.driver) == bool(args.plugin) and not (args.driver and args.plugin and args.provider_mode == "parity"):
        raise UsageError("give --driver NAME or --plugin PATH --sha256 HEX (both only for a parity run)")
    if args.sha256 is not None and not _HEX64.fullmatch(args.sha256):
        raise UsageError(
            f"--sha256 must be the binary's whole SHA-256, 64 hexadecimal digits (`sha256sum FILE`); got "
            f"{len(args.sha256)} characters"
        )
    external = args.driver and not args.plugin and _external_record(args.driver) is not None
    if external and args.provider_mode in ("in-process", "parity"):
        raise UsageError(
            f"driver {args.driver!r} was added with `vz driver add`: it runs as its plugin only; use "
            "--provider-mode external (the default for it)"
        )
    mode = args.provider_mode or ("in-process" if args.driver and not external else "external")
    if args.through_daemon and mode == "in-process":
        raise UsageError("--through-daemon is for the external side: add --provider-mode external or parity")
    providers: list[DriverProvider] = []
    if mode in ("in-process", "parity"):
        if not args.driver:
            raise UsageError(f"--provider-mode {mode} needs --driver NAME (a driver that can be built in-process)")
        options: dict[str, Any] = {**adapter.driver_options(root / "state-in-process"), **_options(args.driver_option)}
        providers.append(InProcessProvider(args.driver, options=options))
    if mode in ("external", "parity"):
        providers.append(_plugin_side(args, adapter, root / "state-external"))
    return providers


class _Progress:
    """Rich progress on a terminal, one plain line per case otherwise (stderr either way)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self.failed = 0
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("conformance", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)

    def __call__(self, mode: str, entry: CaseEntry) -> None:
        mark = {"passed": "PASS", "failed": "FAIL", "not-applicable": "N/A ", "skipped": "SKIP"}[entry.outcome]
        if entry.outcome == "failed":
            self.failed += 1
        line = f"{mark} [{mode}] {entry.id}"
        if entry.outcome == "failed" and entry.failure:
            line += f"\n     {entry.failure.splitlines()[0]}"
        elif entry.outcome == "not-applicable":
            line += f"  ({entry.capability}: {entry.refusal})"
        if self._progress is not None:
            if entry.outcome != "passed":
                style = {"FAIL": "red", "N/A ": "yellow", "SKIP": "yellow"}[mark]
                self._progress.console.print(line, style=style, markup=False, highlight=False)
            self._progress.update(self._task, advance=1, description=f"{mode} {entry.id}")
        else:
            print(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    adapter = _adapter(args)
    with tempfile.TemporaryDirectory(prefix="vz-conformance-") as tmp:
        root = Path(tmp)
        providers = _providers(args, adapter, root)
        total = sum(len(_catalogue.select(p.mode, args.label)) for p in providers)
        with _Progress(total) as progress:
            scratch = root / "scratch"
            scratch.mkdir()
            report = asyncio.run(
                run_suite(
                    providers,
                    adapter,
                    labels=args.label,
                    case_filter=args.case,
                    dry_run=args.dry_run,
                    progress=progress,
                    case_timeout=args.case_timeout,
                    scratch=scratch,
                )
            )
    if args.report:
        report.dump(args.report)
    _summarize(report)
    failed = sum(1 for run in report.runs for c in run.cases if c.outcome == "failed")
    return 1 if failed or any(run.cleanup_problems for run in report.runs) else 0


def _summarize(report: Report) -> None:
    for run in report.runs:
        counts: dict[str, int] = {}
        for case in run.cases:
            counts[case.outcome] = counts.get(case.outcome, 0) + 1
        shown = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        print(f"{run.provider_mode}: {len(run.cases)} cases: {shown}", file=sys.stderr)
        for problem in run.cleanup_problems:
            print(f"{run.provider_mode}: left behind: {problem}", file=sys.stderr)


def _verify(args: argparse.Namespace) -> int:
    reports = []
    for path in args.reports:
        try:
            reports.append(load_report(path))
        except FileNotFoundError:
            raise UsageError(f"report {path} does not exist") from None
        except Exception as exc:  # invalid JSON or a document that does not follow the schema
            raise UsageError(f"report {path} is not a valid conformance report: {str(exc).splitlines()[0]}") from None
    result = verify(reports, mode=args.provider_mode, expect_count=args.expect_count, labels=args.label)
    if result.passed:
        for line in result.summary:
            print(f"ok: {line}")
        print(f"PASS: {args.provider_mode} report verified ({args.expect_count} cases)")
        return 0
    for problem in result.problems:
        print(f"FAIL: {problem}")
    print(f"FAIL: the report does not satisfy the gate ({len(result.problems)} problem(s))")
    return 1


def _list(args: argparse.Namespace) -> int:
    if args.count:
        print(expected_count(args.provider_mode, args.label))
        return 0
    cases = _catalogue.select("in-process" if args.provider_mode == "in-process" else "external", args.label)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": c.id,
                        "label": c.label,
                        "description": c.description,
                        "gated_by": list(c.gated_by),
                        "modes": list(c.modes),
                    }
                    for c in cases
                ],
                indent=2,
            )
        )
        return 0
    for case in cases:
        extra = " [external only]" if case.modes == ("external",) else ""
        print(f"{case.id:40} {case.description}{extra}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    text = json.dumps(schema(), indent=2, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"run": _run, "verify-report": _verify, "list": _list, "schema": _schema}
    try:
        return handlers[args.command](args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except VzError as exc:  # an unknown driver name, a binary that fails verification, ...
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
