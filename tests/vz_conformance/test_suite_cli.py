"""vz-conformance: run writes a report, verify-report applies the gate, list/schema print the catalogue and schema.

Exit codes: 0 success, 1 failed cases / rejected report, 2 usage error (one line on stderr).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from suite_testlib import fake_plugin, passing_report
from vz_conformance._providers import sha256_of
from vz_conformance._report import load_report, schema
from vz_conformance.cli import main

SCHEMA_FILES = [
    Path(__file__).resolve().parents[2]
    / "conformance"
    / "vz_conformance"
    / "schema"
    / "conformance-report.schema.json",
    Path(__file__).resolve().parents[2] / "docs" / "conformance-report.schema.json",
]


def test_list_count_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--count"]) == 0
    assert capsys.readouterr().out.strip() == "105"
    assert main(["list", "--count", "--provider-mode", "in-process"]) == 0
    assert capsys.readouterr().out.strip() == "96"
    assert main(["list", "--count", "--label", "exec", "--label", "cancel"]) == 0
    assert capsys.readouterr().out.strip() == "25"
    assert main(["list", "--label", "crash"]) == 0
    out = capsys.readouterr().out
    assert "crash.mid_exec" in out and "[external only]" in out
    assert main(["list", "--json", "--label", "logs"]) == 0
    assert [c["id"] for c in json.loads(capsys.readouterr().out)] == [
        "logs.merged_exact",
        "logs.chunk_sizes",
        "logs.kept_after_stop",
    ]


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=["package", "docs"])
def test_published_schema_is_current(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == schema() == json.loads(path.read_text())


def test_dry_run_report_never_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "dry.json"
    assert main(["run", "--driver", "fake", "--dry-run", "--label", "discovery", "--report", str(report)]) == 0
    loaded = load_report(report)
    assert loaded.selection.dry_run and {c.outcome for c in loaded.runs[0].cases} == {"skipped"}
    capsys.readouterr()
    code = main(
        ["verify-report", str(report), "--provider-mode", "in-process", "--label", "discovery", "--expect-count", "4"]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "a dry run (no case ran) can never pass" in out and "discovery.info_valid skipped" in out


def test_run_and_verify_a_label_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.json"
    assert main(["run", "--driver", "fake", "--label", "lifecycle", "--report", str(report)]) == 0
    err = capsys.readouterr().err
    assert "PASS [in-process] lifecycle.odd_ids" in err and "in-process: 10 cases: 10 passed" in err
    args = ["verify-report", str(report), "--provider-mode", "in-process", "--expect-count", "10"]
    assert main([*args, "--label", "lifecycle"]) == 0
    assert "PASS: in-process report verified (10 cases)" in capsys.readouterr().out
    assert main(args) == 1  # verified against the whole catalogue: the labels differ
    assert "labels ['lifecycle'] differ" in capsys.readouterr().out


def test_a_filtered_run_never_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.json"
    assert (
        main(["run", "--driver", "fake", "--label", "discovery", "--case", "discovery.info*", "--report", str(report)])
        == 0
    )
    assert [c.id for c in load_report(report).runs[0].cases] == ["discovery.info_valid"]
    capsys.readouterr()
    code = main(
        ["verify-report", str(report), "--provider-mode", "in-process", "--label", "discovery", "--expect-count", "1"]
    )
    assert code == 1
    assert "a filtered run (['discovery.info*']) can never pass" in capsys.readouterr().out


def test_failing_driver_exits_1_and_reports_the_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.json"
    code = main(
        [
            "run",
            "--driver",
            "fake",
            "--driver-option",
            "faults=failing-preflight",
            "--label",
            "discovery",
            "--report",
            str(report),
        ]
    )
    assert code == 1
    assert "FAIL [in-process] discovery.preflight" in capsys.readouterr().err
    failed = [c for c in load_report(report).runs[0].cases if c.outcome == "failed"]
    assert [c.id for c in failed] == ["discovery.preflight"]
    assert failed[0].failure is not None and "Preflight: expected success" in failed[0].failure


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--plugin", "/bin/true"], "--plugin needs --sha256"),
        (
            ["run", "--plugin", "/bin/true", "--sha256", "0123456789ab"],
            "64 hexadecimal digits (`sha256sum FILE`); got 12",
        ),
        (["run"], "give --driver NAME or --plugin PATH"),
        (["run", "--driver", "nope"], "unknown driver 'nope'"),
        (["run", "--plugin", "/bin/true", "--sha256", "0" * 64, "--provider-mode", "in-process"], "needs --driver"),
        (["run", "--driver", "fake", "--driver-option", "novalue"], "must look like KEY=VALUE"),
        (["run", "--driver", "fake", "--adapter", "nowhere:Nothing"], "--adapter 'nowhere:Nothing'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("vz-conformance: error:") and err.count("\n") == 1


def test_unreadable_reports_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["verify-report", str(tmp_path / "missing.json"), "--expect-count", "1"]) == 2
    assert main(["verify-report", str(bad), "--expect-count", "1"]) == 2
    bad.write_text(json.dumps({"schema_version": 1}))
    assert main(["verify-report", str(bad), "--expect-count", "1"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "is not a valid conformance report" in err


def test_verify_two_files_as_parity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "in.json", tmp_path / "ext.json"
    passing_report("in-process").dump(first)
    passing_report("external").dump(second)
    assert main(["verify-report", str(first), str(second), "--provider-mode", "parity", "--expect-count", "105"]) == 0
    assert "96 shared cases identical in both modes, 9 external-only" in capsys.readouterr().out


@pytest.mark.slow
def test_plugin_run_through_the_console_script(tmp_path: Path) -> None:
    plugin = fake_plugin()
    report = tmp_path / "r.json"
    done = subprocess.run(
        [
            "vz-conformance",
            "run",
            "--plugin",
            str(plugin),
            "--sha256",
            sha256_of(plugin),
            "--plugin-arg=--state-dir",  # an argument starting with "-" needs the "=" form
            f"--plugin-arg={tmp_path / 'state'}",
            "--adapter",
            "vz_conformance.adapters:FakeAdapter",
            "--label",
            "lifecycle",
            "--label",
            "logs",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    verify = subprocess.run(
        [
            "vz-conformance",
            "verify-report",
            str(report),
            "--label",
            "lifecycle",
            "--label",
            "logs",
            "--expect-count",
            "13",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0, verify.stdout
    run = load_report(report).runs[0]
    assert run.provider_mode == "external" and run.driver.sha256 == sha256_of(plugin)


def test_a_plugin_with_the_wrong_checksum_is_refused(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    code = main(
        ["run", "--plugin", str(fake_plugin()), "--sha256", "0" * 64, "--label", "discovery", "--report", str(report)]
    )
    assert code == 1
    run = load_report(report).runs[0]
    assert run.info is None and run.info_error is not None and "SHA-256 mismatch" in run.info_error
    assert {c.outcome for c in run.cases} == {"failed"}
    assert all("SHA-256 mismatch" in (c.failure or "") for c in run.cases)


def test_a_driver_added_with_vz_driver_add_runs_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vz-conformance run --driver NAME` for an external driver: its recorded binary, checksum and args."""
    import json

    from vz_core.drivers import add_manifest
    from vz_core.trust import host_platform

    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    plugin = fake_plugin()
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "name": "fakeext",
                "version": "1",
                "api_version": "1.3",
                "binaries": {host_platform(): {"path": str(plugin), "sha256": sha256_of(plugin)}},
                "args": ["--state-dir", str(tmp_path / "state")],
            }
        )
    )
    add_manifest(manifest)
    report = tmp_path / "r.json"
    argv = ["run", "--driver", "fakeext", "--adapter", "vz_conformance.adapters:FakeAdapter", "--label", "discovery"]
    assert main([*argv, "--report", str(report)]) == 0, capsys.readouterr().err
    run = load_report(report).runs[0]
    assert run.provider_mode == "external" and run.driver.sha256 == sha256_of(plugin)
    assert {c.outcome for c in run.cases} == {"passed"}
    capsys.readouterr()
    assert main([*argv, "--provider-mode", "parity"]) == 2
    assert "was added with `vz driver add`: it runs as its plugin only" in capsys.readouterr().err
