"""Environment operations in-process on the reference fake driver: reconcile, refuse before mutation, isolate."""

from __future__ import annotations

import asyncio
import json
import platform
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from vz_conformance.fake import FakeDriver

from vz_core.env import Context, PlanError, Store, delete, status, stop, up
from vz_core.env._ids import looks_like_env_id
from vz_core.errors import RuntimeFailureError, UserError

HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), "amd64")
OTHER_ARCH = "arm64" if HOST_ARCH == "amd64" else "amd64"


def machine(name: str = "web", **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name,
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "workspace": {"projection": "none"},
    }
    base.update(overrides)
    return base


class Project:
    def __init__(self, root: Path, home: Path) -> None:
        self.root = root
        self.home = home
        root.mkdir(parents=True, exist_ok=True)

    def write(self, *machines: dict[str, Any], **extra: Any) -> None:
        data = {"version": 1, "project_id": "demo", "machines": list(machines) or [machine()], **extra}
        (self.root / "vz.json").write_text(json.dumps(data))

    def ctx(self, **environ: str) -> Context:
        return Context(cwd=self.root, environ=environ)

    def envs(self) -> list[str]:
        if not (self.home / "state.db").exists():
            return []
        with Store(self.home / "state.db") as store:
            return [e.name for e in store.environments()]


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    return Project(tmp_path / "proj", tmp_path / "home")


async def find_ids(env_id: str, home: Path) -> dict[str, str | None]:
    driver = FakeDriver()
    out: dict[str, str | None] = {}
    with Store(home / "state.db") as store:
        for record in store.machines(env_id):
            found = await driver.find(record.workspace_id)
            out[record.name] = found.id if found else None
    return out


async def test_up_creates_default_then_is_idempotent(proj: Project) -> None:
    proj.write(machine("web"), machine("db"), default_machine="web")
    first = await up(proj.ctx())
    env = first["environment"]
    assert env["name"] == "default" and looks_like_env_id(env["id"]) and env["state"] == "running"
    assert [(m["name"], m["state"], m["default"]) for m in first["machines"]] == [
        ("web", "running", True),
        ("db", "running", False),
    ]
    backend = await find_ids(env["id"], proj.home)
    second = await up(proj.ctx())
    assert second["environment"]["id"] == env["id"]
    assert [s["action"] for s in second["plan"]["steps"]] == ["keep", "keep"]
    assert await find_ids(env["id"], proj.home) == backend  # nothing was recreated
    report = await status(proj.ctx())
    (env_status,) = report["environments"]
    assert env_status["drift"]["status"] == "in-sync"
    assert [m["state"] for m in env_status["machines"]] == ["running", "running"]
    web = env_status["machines"][0]
    assert web["target"] == {"os": "linux", "arch": HOST_ARCH}
    assert web["driver"]["name"] == "fake" and web["driver"]["api"] == "1.3"
    assert web["driver"]["capabilities"]["recreate_mode"] == "on_run"
    assert web["driver"]["accelerator"]["name"] == "none"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            {"profile": "hardened"}, r"\$\.machines\[0\]\.profile: driver 'fake' does not offer", id="hardened"
        ),
        pytest.param({"egress": "deny"}, r"\$\.machines\[0\]\.egress: driver 'fake' cannot deny", id="egress-deny"),
        pytest.param({"target": {"os": "windows"}}, r"\.target\.os: driver 'fake' cannot run windows", id="windows"),
        pytest.param({"target": {"arch": OTHER_ARCH}}, rf"runs {HOST_ARCH} Machines on this host, not", id="arch"),
        pytest.param({"resources": {"cpus": 2}}, r"\.resources: driver 'fake' cannot enforce", id="cpus"),
        pytest.param({"resources": {"disk": "1GiB"}}, r"\.resources\.disk: driver 'fake'", id="disk"),
        pytest.param(
            {"workspace": {"projection": "read-write"}}, r"\.workspace\.projection: .*bind", id="workspace-rw"
        ),
        pytest.param({"workspace": {"projection": "snapshot"}}, r"does not support 'snapshot'", id="snapshot"),
        pytest.param({"mounts": [{"type": "tmpfs", "target": "/t"}]}, r"\.mounts\[0\]: .*tmpfs", id="tmpfs"),
        pytest.param({"volumes": [{"name": "v", "target": "/v"}]}, r"\.volumes: .*named volumes", id="volumes"),
        pytest.param({"driver": "nope"}, r"\$\.machines\[0\]\.driver: unknown driver 'nope'; .*fake", id="driver"),
        pytest.param(
            {"environment": {"T": {"from_env": "NOT_SET_ANYWHERE"}}},
            r"\$\.machines\[0\]\.environment\.T needs \$NOT_SET_ANYWHERE",
            id="missing-secret",
        ),
    ],
)
async def test_unsupported_requests_fail_before_any_mutation(
    proj: Project, overrides: dict[str, Any], message: str
) -> None:
    proj.write(machine(**overrides))
    with pytest.raises(UserError, match=message):
        await up(proj.ctx())
    assert proj.envs() == []
    assert not (proj.home / "drivers" / "fake" / "machines").exists() or not any(
        (proj.home / "drivers" / "fake" / "machines").iterdir()
    )


async def test_secret_values_are_never_stored(proj: Project) -> None:
    secret = "s3cr3t-value-that-must-not-leak"
    proj.write(machine(environment={"PLAIN": "visible", "TOKEN": {"from_env": "MY_TOKEN"}}))
    await up(proj.ctx(MY_TOKEN=secret))
    blobs = b"".join(p.read_bytes() for p in proj.home.glob("state.db*"))
    assert b"visible" in blobs  # the literal value is in vz.json anyway
    assert secret.encode() not in blobs
    assert b"MY_TOKEN" in blobs  # the reference is kept


async def test_creation_time_change_is_refused_then_recreated_keeping_identity(proj: Project) -> None:
    proj.write(machine("web"))
    env_id = (await up(proj.ctx()))["environment"]["id"]
    with Store(proj.home / "state.db") as store:
        (before,) = store.machines(env_id)
    backend_before = await find_ids(env_id, proj.home)
    proj.write(machine("web", image="registry.local/other:1"))
    with pytest.raises(PlanError, match=r"image \"vz:default\" → \"registry.local/other:1\"[\s\S]*vz up --recreate"):
        await up(proj.ctx())
    assert await find_ids(env_id, proj.home) == backend_before
    report = await status(proj.ctx())
    drift = report["environments"][0]["machines"][0]["drift"]
    assert drift["status"] == "drifted"
    change = {"field": "image", "kind": "creation", "recorded": "vz:default", "desired": "registry.local/other:1"}
    assert drift["changes"] == [change]
    result = await up(proj.ctx(), recreate=True)
    assert [s["action"] for s in result["plan"]["steps"]] == ["recreate"]
    with Store(proj.home / "state.db") as store:
        (after,) = store.machines(env_id)
    assert (after.machine_id, after.workspace_id) == (before.machine_id, before.workspace_id)
    assert after.spec["image"] == "registry.local/other:1"
    assert (await find_ids(env_id, proj.home))["web"] != backend_before["web"]


async def test_adding_a_machine_and_changing_the_default_keep_identity(proj: Project) -> None:
    proj.write(machine("web"))
    env_id = (await up(proj.ctx()))["environment"]["id"]
    backend = await find_ids(env_id, proj.home)
    proj.write(machine("web"), machine("db"), default_machine="db")
    result = await up(proj.ctx())
    assert [(s["action"], s["machine"]) for s in result["plan"]["steps"]] == [("keep", "web"), ("create", "db")]
    assert result["plan"]["default_machine"] == {"recorded": "web", "desired": "db"}
    assert (await find_ids(env_id, proj.home))["web"] == backend["web"]
    assert [m["name"] for m in result["machines"] if m["default"]] == ["db"]


async def test_removing_a_machine_needs_recreate(proj: Project) -> None:
    proj.write(machine("web"), machine("db"), default_machine="web")
    env_id = (await up(proj.ctx()))["environment"]["id"]
    proj.write(machine("web"))
    with pytest.raises(PlanError, match=r"machine db: recorded in the Environment but no longer in vz\.json"):
        await up(proj.ctx())
    await up(proj.ctx(), recreate=True)
    assert list(await find_ids(env_id, proj.home)) == ["web"]


async def test_dry_run_changes_nothing(proj: Project) -> None:
    proj.write(machine("web"))
    result = await up(proj.ctx(), dry_run=True)
    assert result["dry_run"] and result["environment"] == {"id": None, "name": "default", "state": "absent"}
    assert proj.envs() == []


async def test_stop_then_up_starts_the_same_machines(proj: Project) -> None:
    proj.write(machine("web"))
    env_id = (await up(proj.ctx()))["environment"]["id"]
    backend = await find_ids(env_id, proj.home)
    stopped = await stop(proj.ctx())
    assert stopped["machines"] == [{"id": stopped["machines"][0]["id"], "name": "web", "state": "stopped"}]
    assert (await status(proj.ctx()))["environments"][0]["machines"][0]["state"] == "stopped"
    result = await up(proj.ctx())
    assert [s["action"] for s in result["plan"]["steps"]] == ["start"]
    assert await find_ids(env_id, proj.home) == backend


async def test_delete_leaves_sibling_environments_alone(proj: Project) -> None:
    proj.write(machine("web"))
    one = (await up(proj.ctx()))["environment"]["id"]
    two = (await up(proj.ctx(), environment="two"))["environment"]["id"]
    backend_two = await find_ids(two, proj.home)
    await delete(proj.ctx(), environment="default")
    assert proj.envs() == ["two"]
    assert await find_ids(two, proj.home) == backend_two
    with Store(proj.home / "state.db") as store:
        assert store.environment(one) is None
        assert store.operations(one) == []  # nothing of the deleted Environment stays in the store
        assert [o.kind for o in store.operations(two)] == ["up"]


async def test_backend_failure_is_recorded_and_the_next_up_converges(proj: Project) -> None:
    proj.write(machine("web", driver_options={"faults": "failing-run"}))
    with pytest.raises(RuntimeFailureError, match="failing-run"):
        await up(proj.ctx())
    with Store(proj.home / "state.db") as store:
        (env,) = store.environments()
        assert env.state == "failed"
        assert [(o.kind, o.status) for o in store.operations(env.env_id)] == [("up", "failed")]
        (record,) = store.machines(env.env_id)
        assert record.state == "creating"
    proj.write(machine("web"))  # fixed: the never-created Machine is simply created, same id
    result = await up(proj.ctx())
    assert [(s["action"], s["machine_id"]) for s in result["plan"]["steps"]] == [("create", record.machine_id)]
    assert result["environment"]["state"] == "running"


async def test_concurrent_up_on_one_environment_serializes(proj: Project) -> None:
    proj.write(machine("web"), machine("db"), default_machine="web")
    await up(proj.ctx())  # create first so both runs target the same existing Environment
    results = await asyncio.gather(up(proj.ctx()), up(proj.ctx()))
    assert results[0]["environment"]["id"] == results[1]["environment"]["id"]
    with Store(proj.home / "state.db") as store:
        (env,) = store.environments()
        assert [o.status for o in store.operations(env.env_id)] == ["succeeded"] * 3
        assert len(store.machines(env.env_id)) == 2


async def test_concurrent_first_up_creates_one_default(proj: Project) -> None:
    proj.write(machine("web"))
    results = await asyncio.gather(up(proj.ctx()), up(proj.ctx()))
    assert results[0]["environment"]["id"] == results[1]["environment"]["id"]
    assert proj.envs() == ["default"]


async def test_status_of_a_project_without_environments_is_an_error(proj: Project) -> None:
    proj.write(machine("web"))
    with pytest.raises(UserError, match="has no Environment yet"):
        await status(proj.ctx())
    assert (await status(proj.ctx(), all_environments=True))["environments"] == []


def test_store_records_operations_with_pids(proj: Project) -> None:
    proj.write(machine("web"))
    asyncio.run(up(proj.ctx()))
    db = sqlite3.connect(proj.home / "state.db")
    rows = db.execute("SELECT kind, status, pid FROM operations").fetchall()
    db.close()
    assert rows and all(r[2] > 0 for r in rows)
