"""Messages that say what happened, through the real console script and daemon (fake driver)."""

from __future__ import annotations

from pathlib import Path

from vzcli import Vz

from vz_core.redact import Redactor


def test_vz_own_ids_are_not_masked_as_secrets(vz: Vz, running: Path) -> None:
    machine = next(m for m in vz.status(running)["environments"][0]["machines"] if m["name"] == "web")
    vz.ok("stop", cwd=running)
    err = vz.fails(125, "exec", "--", "true", cwd=running)
    assert machine["workspace_id"] in err and "vz-***" not in err  # the driver's message names the workspace
    err = vz.fails(125, "exec", "-e", f"VZ_MACHINE_ID={machine['id']}", "--", "true", cwd=running)
    assert machine["workspace_id"] in err


def test_add_environment_keeps_everything_else_secret() -> None:
    redactor = Redactor()
    redactor.add_environment({"VZ_MACHINE_ID": "mch_abcdefghijkl", "TOKEN": "s3cr3t-value"})
    assert redactor.redact("mch_abcdefghijkl s3cr3t-value") == "mch_abcdefghijkl ***"
