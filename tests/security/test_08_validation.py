"""#18 item 8 (Environment side): validation gaps and late refusals.

Names and ids ending in a newline are refused; bad image references, reserved (and '//'-prefixed) targets, NUL
in environment values and driver values that are not driver names are refused at the definition, before any
Environment record exists; duplicate keys are refused with their JSON path; bind sources follow the documented
policy (refuse '/', warn for the home directory and anything outside the project).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_core" / "cli"))
from vzcli import Vz, fake_machine, write_project

from vz_core.env import Context, DefinitionError, parse_definition, up
from vz_core.env._definition import check_image_reference
from vz_core.env._discover import read_header
from vz_core.env._ids import looks_like_env_id, new_env_id
from vz_core.errors import UserError


@pytest.fixture
def vz(tmp_path: Path) -> Vz:
    return Vz(tmp_path / "home")


def _definition(**machine: Any) -> dict[str, Any]:
    base = fake_machine("web", **machine)
    return {"version": 1, "project_id": "demo", "machines": [base]}


def _no_environment_recorded(vz: Vz) -> None:
    db = vz.home / "state.db"
    if db.exists():
        con = sqlite3.connect(db)
        try:
            assert con.execute("SELECT COUNT(*) FROM environments").fetchone()[0] == 0
            assert con.execute("SELECT COUNT(*) FROM operations").fetchone()[0] == 0
        finally:
            con.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("project_id", "demo\n"), ("default_machine", "web\n")],
)
def test_ids_and_names_ending_in_a_newline_are_refused(field: str, value: str) -> None:
    data = _definition()
    data[field] = value
    with pytest.raises(DefinitionError, match=rf"\$\.{field}"):
        parse_definition(data)


def test_environment_variable_names_ending_in_a_newline_are_refused() -> None:
    with pytest.raises(DefinitionError, match="is not an environment variable name"):
        parse_definition(_definition(environment={"TOKEN\n": "x"}))
    with pytest.raises(DefinitionError, match=r"from_env"):
        parse_definition(_definition(environment={"TOKEN": {"from_env": "VAR\n"}}))


def test_the_fast_header_path_refuses_a_project_id_with_a_newline(tmp_path: Path) -> None:
    path = tmp_path / "vz.json"
    path.write_text(json.dumps({**_definition(), "project_id": "demo\n"}))
    with pytest.raises(DefinitionError, match=r"\$\.project_id"):
        read_header(path)
    assert not looks_like_env_id(new_env_id() + "\n")


@pytest.mark.parametrize(
    "machine",
    [
        {"image": "no spaces allowed"},
        {"image": "registry.local/UPPER:1"},
        {"image": "oci:relative/layout"},
        {"image": "docker-archive:/x/../y.tar"},
        {"image": "vz:Not-Lower"},
        {"image": "registry.local/app@sha256:123"},
        {"mounts": [{"type": "tmpfs", "target": "//proc"}]},
        {"mounts": [{"type": "tmpfs", "target": "/dev/shm2"}]},
        {"volumes": [{"name": "v", "target": "//.vz/run"}]},
        {"workspace": {"projection": "read-write", "target": "//sys"}},
        {"mounts": [{"type": "tmpfs", "target": "/"}]},
        {"mounts": [{"type": "tmpfs", "target": "/a/../proc"}]},
        {"environment": {"A": "x\x00y"}},
        {"driver": "../../etc/evil"},
        {"driver": "/usr/bin/evil"},
        {"driver": "Fake"},
        {"driver": "fake\n"},
        {"resources": {"memory": 2**63}},
        {"driver_options": {"n": 2**64}},
    ],
    ids=lambda m: json.dumps(m)[:40],
)
def test_refused_by_vz_up_before_any_record_exists(vz: Vz, tmp_path: Path, machine: dict[str, Any]) -> None:
    proj = write_project(tmp_path / "p", fake_machine("web", **machine))
    err = vz.fails(2, "up", cwd=proj)
    assert "$.machines[0]" in err
    _no_environment_recorded(vz)
    assert vz.fails(2, "up", "--dry-run", cwd=proj)


@pytest.mark.parametrize(
    "image",
    ["vz:default", "registry.local/app:1.2", "localhost:5000/a/b@sha256:" + "0" * 64, "oci:/x/y:tag"],
)
def test_valid_image_references_still_pass(image: str) -> None:
    assert parse_definition(_definition(image=image)).machines[0].image == image
    assert check_image_reference(image) == image


def test_only_the_embedded_vz_images_exist() -> None:
    with pytest.raises(ValueError, match=r"there is no embedded image 'vz:other'; the embedded images are: vz:default"):
        check_image_reference("vz:other")


def test_an_external_driver_may_name_its_images_its_own_way() -> None:
    # The definition refuses only what no driver could read; vz's grammar applies to built-in drivers at `vz up`.
    assert parse_definition(_definition(image="host")).machines[0].image == "host"
    for bad in ("two words", "tab\there", "nul\x00", "x" * 1025):
        with pytest.raises(DefinitionError, match=r"\$\.machines\[0\]\.image"):
            parse_definition(_definition(image=bad))


def test_a_nul_in_a_resolved_secret_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    proj = write_project(tmp_path / "p", fake_machine("web", environment={"T": {"from_env": "TOKEN"}}))
    ctx = Context(cwd=proj, environ={"TOKEN": "abc\x00defgh"}, store_path=tmp_path / "state.db")
    with pytest.raises(UserError, match=r"\$TOKEN contains a NUL character") as caught:
        asyncio.run(up(ctx))
    assert "defgh" not in str(caught.value)
    assert not (tmp_path / "state.db").exists()


def test_duplicate_keys_are_refused_with_their_path(vz: Vz, tmp_path: Path) -> None:
    proj = tmp_path / "p"
    proj.mkdir()
    text = json.dumps(_definition())
    (proj / "vz.json").write_text(text.replace('"image": "vz:default"', '"image": "vz:default", "image": "vz:x"'))
    err = vz.fails(2, "up", cwd=proj)
    assert "$.machines[0].image: duplicate key" in err
    (proj / "vz.json").write_text(text.replace('"version": 1', '"version": 1, "version": 1'))
    assert "$.version: duplicate key" in vz.fails(2, "status", cwd=proj)
    _no_environment_recorded(vz)


def test_bind_source_root_is_refused(vz: Vz, tmp_path: Path) -> None:
    for source in ("/", "/..", "//"):
        proj = write_project(
            tmp_path / "p", fake_machine("web", mounts=[{"type": "bind", "source": source, "target": "/host"}])
        )
        err = vz.fails(2, "up", cwd=proj)
        assert "$.machines[0].mounts[0].source" in err and "host root directory" in err
        _no_environment_recorded(vz)


def test_bind_sources_outside_the_project_or_home_warn(vz: Vz, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "p" / "inside").mkdir(parents=True)
    proj = write_project(
        tmp_path / "p",
        fake_machine(
            "web",
            driver="linux_native",  # a driver that offers bind mounts; --dry-run creates nothing
            mounts=[
                {"type": "bind", "source": "inside", "target": "/in"},
                {"type": "bind", "source": str(outside), "target": "/out"},
                {"type": "bind", "source": "~", "target": "/home-all"},
            ],
        ),
    )
    proc = vz.run("up", "--dry-run", cwd=proj, env={"HOME": str(tmp_path / "home-dir")})
    assert proc.returncode == 2  # the home directory does not exist in this test: refused as missing
    (tmp_path / "home-dir").mkdir()
    proc = vz.run("up", "--dry-run", cwd=proj, env={"HOME": str(tmp_path / "home-dir")})
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert f"mounts[1].source: {outside} is outside the project directory" in err
    assert "mounts[2].source: bind-mounts your whole home directory" in err
    assert "mounts[0]" not in err


def test_machines_recorded_with_host_options_by_an_earlier_vz_stay_manageable(vz: Vz, tmp_path: Path) -> None:
    # An earlier vz accepted host-scoped driver_options from vz.json; such a record must still be found and
    # deletable (the option is refused in vz.json now, never in a record).
    proj = write_project(tmp_path / "p", fake_machine("web"))
    vz.ok("up", cwd=proj)
    con = sqlite3.connect(vz.home / "state.db")
    try:
        (spec,) = con.execute("SELECT spec FROM machines").fetchone()
        data = json.loads(spec)
        data["driver_options"] = {"state_dir": str(vz.home / "drivers" / "fake")}
        con.execute("UPDATE machines SET spec = ?", (json.dumps(data),))
        con.commit()
    finally:
        con.close()
    assert vz.status(proj)["environments"][0]["machines"][0]["state"] == "running"
    assert vz.ok("exec", "--", "echo", "hi", cwd=proj) == "hi\n"
    vz.ok("delete", cwd=proj)
    assert vz.status(tmp_path, "--all")["environments"] == []
