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


def test_an_image_typo_is_named_before_any_drift_or_recreate(vz: Vz, running: Path) -> None:
    definition = running / "vz.json"
    before = vz.status(running)["environments"][0]
    definition.write_text(definition.read_text().replace('"vz:default"', '"vz:defualt"', 1))
    err = vz.fails(2, "up", cwd=running)
    assert "$.machines[0].image: there is no embedded image 'vz:defualt'; the embedded images are: vz:default" in err
    assert "--recreate" not in err and "creation-time settings" not in err
    assert "there is no embedded image 'vz:defualt'" in vz.fails(2, "up", "--recreate", cwd=running)
    after = vz.status(running)["environments"][0]
    assert after["state"] == before["state"] == "running"
    assert [m["id"] for m in after["machines"]] == [m["id"] for m in before["machines"]]


def test_an_image_typo_in_a_new_project_records_nothing(vz: Vz, tmp_path: Path) -> None:
    from vzcli import fake_machine, write_project

    project = write_project(tmp_path / "new", fake_machine("web", image="vz:latest"))
    assert "there is no embedded image 'vz:latest'" in vz.fails(2, "up", cwd=project)
    vz.assert_recorded_nothing()
