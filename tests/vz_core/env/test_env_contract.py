"""The Developer Environment contract on the Environment side, in-process on the fake driver (wrapped where a
test needs another capability): validation before teardown (a DELETE-mode recreate keeps the old Machine when
the new configuration fails), no TargetArchitecture before the workspace exists, developer vs process identity,
and the read-write workspace consistency contract."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from vz_conformance.fake import FakeDriver

import vz_core.env._drivers as env_drivers
from vz_core._types import DriverInfo, Extensions, MountType, RecreateMode, RunImageRequest
from vz_core.env import Context, Store, up
from vz_core.errors import NotFoundError, RuntimeFailureError, UnavailableError, UnsupportedError, UserError
from vz_core.paths import state_dir


class Wrapped(FakeDriver):
    """The fake with knobs: DELETE recreate mode, resource limits, a failing ProvisioningPreflight, a runtime
    that answers TargetArchitecture only for an existing workspace (or with another architecture)."""

    delete_mode = False
    resource_limits = False
    failing_provisioning = False
    strict_arch = False
    wrong_arch = False
    binds = False
    calls: list[tuple[str, Any]] = []

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        info = await super().info(supports_recreate_on_run=supports_recreate_on_run)
        assert info.capabilities is not None
        if self.delete_mode:
            info = replace(info, capabilities=replace(info.capabilities, recreate_mode=RecreateMode.DELETE))
        if self.binds:
            info = replace(info, capabilities=replace(info.capabilities, mount_types=(MountType.BIND,)))
        return info

    async def extensions(self) -> Extensions:
        ext = await super().extensions()
        return replace(ext, resource_limits=True) if self.resource_limits else ext

    async def provisioning_preflight(self) -> None:
        type(self).calls.append(("provisioning_preflight", None))
        if self.failing_provisioning:
            raise UnavailableError("provisioning is impossible right now (test)")
        await super().provisioning_preflight()

    async def target_architecture(self, workspace_id: str) -> str:
        type(self).calls.append(("target_architecture", workspace_id))
        if self.strict_arch and await self.find(workspace_id) is None:
            raise NotFoundError(f"no workspace {workspace_id!r} (this runtime answers only for existing ones)")
        arch = await super().target_architecture(workspace_id)
        if self.wrong_arch:
            return "arm64" if arch == "amd64" else "amd64"
        return arch

    async def run_image(self, request: RunImageRequest) -> None:
        type(self).calls.append(("run_image", request))
        await super().run_image(request)

    async def delete(self, workspace_id: str) -> None:
        type(self).calls.append(("delete", workspace_id))
        await super().delete(workspace_id)

    async def reuse_preflight(self, workspace_id: str, remote_user: str) -> None:
        type(self).calls.append(("reuse_preflight", remote_user))
        await super().reuse_preflight(workspace_id, remote_user)


@pytest.fixture
def knobs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[type[Wrapped]]:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    knobs = type("Knobs", (Wrapped,), {"calls": []})

    def acquire(name: str, options: Any = None, **_: Any) -> Wrapped:
        assert name == "fake"
        return knobs()

    monkeypatch.setattr(env_drivers, "acquire_driver", acquire)
    yield knobs


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


def write(root: Path, *machines: dict[str, Any], **extra: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    data = {"version": 1, "project_id": "demo", "machines": list(machines) or [machine()], **extra}
    (root / "vz.json").write_text(json.dumps(data))
    return root


def ctx(root: Path) -> Context:
    return Context(cwd=root, environ={})


def fake_state() -> dict[str, str]:
    """Digest of every file the fake driver keeps (Machines' roots and records), locks aside."""
    root = state_dir() / "drivers" / "fake"
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "locks" not in p.parts
    }


def plant_sentinels() -> None:
    for root in (state_dir() / "drivers" / "fake").rglob("root"):
        if root.is_dir():
            (root / "sentinel").write_bytes(os.urandom(512) + str(root).encode())


def machine_ids() -> dict[str, str]:
    with Store(state_dir() / "state.db") as store:
        return {f"{e.name}/{m.name}": m.machine_id for e in store.environments() for m in store.machines(e.env_id)}


async def two_worktrees(tmp_path: Path, *machines: dict[str, Any]) -> tuple[Path, Path]:
    """Environment "default" from worktree a, "sibling" from worktree b, sentinels in every Machine."""
    a = write(tmp_path / "a", *machines)
    b = write(tmp_path / "b", *machines)
    await up(ctx(a))
    await up(ctx(b), environment="sibling")
    plant_sentinels()
    return a, b


BAD_CONFIGS = [
    pytest.param({"resources": {"cpus": 64}}, r"resources\.cpus: 64 CPUs asked for, this host has", id="cpus-64"),
    pytest.param(
        {"resources": {"memory": "64TiB"}}, r"resources\.memory: .* asked for, this host has", id="memory-64TiB"
    ),
    pytest.param({"image": "oci:/nonexistent/layout:1"}, r"not an OCI image layout directory", id="image-oci"),
    pytest.param(
        {"image": "docker-archive:/nonexistent.tar"}, r"docker-archive file .* does not exist", id="image-tar"
    ),
    pytest.param({"profile": "hardened"}, r"does not offer the 'hardened' profile", id="profile"),
    pytest.param({"profile": "nope"}, r"\$\.machines\[0\]\.profile", id="schema"),
]


@pytest.mark.parametrize(("change", "message"), BAD_CONFIGS)
async def test_delete_mode_recreate_keeps_the_old_machine_when_the_new_configuration_fails(
    knobs: type[Wrapped], tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    knobs.delete_mode = True
    knobs.resource_limits = True
    a, _ = await two_worktrees(tmp_path, machine(environment={"A": "1"}))
    before, ids = fake_state(), machine_ids()
    assert any(k.endswith("sentinel") for k in before)
    knobs.calls.clear()
    write(a, machine(environment={"A": "2"}, **change))  # a creation-time change: a recreate is planned
    with pytest.raises(UserError, match=message):
        await up(ctx(a), recreate=True)
    assert not [c for c in knobs.calls if c[0] in ("run_image", "delete")]
    assert fake_state() == before and machine_ids() == ids


async def test_failing_provisioning_preflight_comes_before_a_delete_mode_teardown(
    knobs: type[Wrapped], tmp_path: Path
) -> None:
    knobs.delete_mode = True
    a, _ = await two_worktrees(tmp_path, machine(environment={"A": "1"}))
    before, ids = fake_state(), machine_ids()
    knobs.failing_provisioning = True
    knobs.calls.clear()
    write(a, machine(environment={"A": "2"}))
    with pytest.raises(UnavailableError, match="provisioning is impossible"):
        await up(ctx(a), recreate=True)
    assert [c[0] for c in knobs.calls if c[0] != "target_architecture"] == ["provisioning_preflight"]
    assert fake_state() == before and machine_ids() == ids
    knobs.failing_provisioning = False  # the same recreate then goes through, DELETE then RunImage
    await up(ctx(a), recreate=True)
    kinds = [c[0] for c in knobs.calls]
    assert kinds.index("delete") < kinds.index("run_image")


async def test_no_target_architecture_before_the_workspace_exists(knobs: type[Wrapped], tmp_path: Path) -> None:
    knobs.strict_arch = True
    a = write(tmp_path / "a", machine("web"), machine("db"), default_machine="web")
    result = await up(ctx(a))
    assert [m["state"] for m in result["machines"]] == ["running", "running"]
    asked = [c[1] for c in knobs.calls if c[0] == "target_architecture"]
    assert sorted(asked) == sorted(m["workspace_id"] for m in result["machines"])  # after creation, each once
    runs = [c[1] for c in knobs.calls if c[0] == "run_image"]
    assert all(r.platform.startswith("linux/") for r in runs)


async def test_a_machine_created_for_another_architecture_is_reported(knobs: type[Wrapped], tmp_path: Path) -> None:
    knobs.wrong_arch = True
    a = write(tmp_path / "a")
    with pytest.raises(RuntimeFailureError, match=r"created machine web for (amd64|arm64), not (amd64|arm64)"):
        await up(ctx(a))


async def test_remote_user_and_user_are_forwarded_and_reuse_checks_the_developer_identity(
    knobs: type[Wrapped], tmp_path: Path
) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    a = write(tmp_path / "a", machine(remote_user=me, user=me))
    await up(ctx(a))
    (request,) = [c[1] for c in knobs.calls if c[0] == "run_image"]
    assert (request.remote_user, request.user) == (me, me)
    knobs.calls.clear()
    await up(ctx(a))
    assert [c for c in knobs.calls if c[0] == "reuse_preflight"] == [("reuse_preflight", me)]


async def test_developer_identity_falls_back_to_user_then_root(knobs: type[Wrapped], tmp_path: Path) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    a = write(tmp_path / "a", machine("web", user=me), machine("db"), default_machine="web")
    await up(ctx(a))
    requests = {c[1].workspace_id: c[1] for c in knobs.calls if c[0] == "run_image"}
    assert sorted((r.user, r.remote_user, r.developer_identity()) for r in requests.values()) == sorted(
        [(me, "", me), ("", "", "root")]
    )
    knobs.calls.clear()
    await up(ctx(a))
    assert sorted(c[1] for c in knobs.calls if c[0] == "reuse_preflight") == sorted([me, "root"])


def test_identity_fields_of_a_machine_recorded_before_them_stay_in_sync() -> None:
    from vz_core.env._definition import parse_definition

    plain = parse_definition({"version": 1, "project_id": "p", "machines": [machine()]}).machines[0]
    assert "remote_user" not in plain.recorded() and "user" not in plain.recorded()
    assert "sharing" not in plain.recorded()["workspace"]
    set_ = parse_definition({"version": 1, "project_id": "p", "machines": [machine(remote_user="dev")]}).machines[0]
    assert set_.recorded()["remote_user"] == "dev" and set_.developer_identity() == "dev"


async def test_two_read_write_projections_need_the_shared_contract(knobs: type[Wrapped], tmp_path: Path) -> None:
    rw = {"projection": "read-write"}
    a = write(tmp_path / "a", machine("web", workspace=rw), machine("db", workspace=rw), default_machine="web")
    with pytest.raises(UserError, match=r"machines web, db all project the worktree read-write.*sharing"):
        await up(ctx(a))
    assert knobs.calls == [] and machine_ids() == {}  # refused before any driver was asked anything
    shared = {"projection": "read-write", "sharing": "shared"}
    write(a, machine("web", workspace=shared), machine("db", workspace=rw), default_machine="web")
    with pytest.raises(UserError, match=r"and db declare\(s\) no consistency contract"):
        await up(ctx(a))
    # Declared on both: this check passes and the driver's own capabilities decide (the fake projects nothing).
    write(a, machine("web", workspace=shared), machine("db", workspace=shared), default_machine="web")
    with pytest.raises(UserError, match=r"driver 'fake' cannot project the workspace read-write"):
        await up(ctx(a))


async def test_snapshot_projection_is_refused_before_mutation_naming_the_driver(
    knobs: type[Wrapped], tmp_path: Path
) -> None:
    a = write(tmp_path / "a", machine(workspace={"projection": "snapshot"}))
    with pytest.raises(UserError, match=r"workspace\.projection: driver 'fake' does not support 'snapshot'"):
        await up(ctx(a))
    assert not [c for c in knobs.calls if c[0] == "run_image"] and machine_ids() == {}


async def test_a_second_environment_writing_the_same_worktree_needs_the_shared_contract(
    knobs: type[Wrapped], tmp_path: Path
) -> None:
    knobs.binds = True
    a = write(tmp_path / "a", machine(workspace={"projection": "read-write"}))
    with Store(state_dir() / "state.db") as store, store.transaction() as db:
        store.touch_project(db, "demo", str(a / "vz.json"))
        store.create_environment(
            db, env_id="env_000000000001", project_id="demo", name="first", worktree=str(a), default_machine="web"
        )
        store.bind(db, "demo", str(a), "env_000000000001")
        spec = {"name": "web", "driver": "fake", "workspace": {"projection": "read-write", "target": "/workspace"}}
        store.put_machine(
            db,
            env_id="env_000000000001",
            machine_id="mch_000000000001",
            name="web",
            workspace_id="w1",
            driver="fake",
            spec=spec,
            state="running",
        )
    with pytest.raises(UserError, match=r"machine web of Environment first \(env_000000000001\) already projects"):
        await up(ctx(a), environment="second")
    assert not [c for c in knobs.calls if c[0] == "run_image"]
    with Store(state_dir() / "state.db") as store:
        assert [e.name for e in store.environments()] == ["first"]


# --- delete traverses the ownership graph -------------------------------------------------------------------


class VolumeKnobs(Wrapped):
    """The fake plus named volumes kept in a directory of their own, with or without a removal operation."""

    removable = True

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        info = await super().info(supports_recreate_on_run=supports_recreate_on_run)
        assert info.capabilities is not None
        return replace(info, capabilities=replace(info.capabilities, mount_types=(MountType.VOLUME,)))

    async def run_image(self, request: RunImageRequest) -> None:
        for mount in request.mounts:
            assert mount.type == MountType.VOLUME
            where = volume_dir() / mount.source
            where.mkdir(parents=True, exist_ok=True)
            (where / "data").write_bytes(os.urandom(64))
        await super().run_image(replace(request, mounts=()))

    async def extensions(self) -> Extensions:
        ext = await super().extensions()
        return replace(ext, volume_removal=type(self).removable)  # declared: checked by the host before a call

    async def delete_volume(self, name: str) -> None:
        if not type(self).removable:
            raise AssertionError("delete_volume called although extensions.volume_removal is false")
        type(self).calls.append(("delete_volume", name))
        path = volume_dir() / name
        if not path.exists():
            raise NotFoundError(f"no volume {name}")
        for item in path.iterdir():
            item.unlink()
        path.rmdir()


def volume_dir() -> Path:
    return state_dir() / "test-volumes"


@pytest.fixture
def vknobs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[type[VolumeKnobs]]:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    knobs = type("VKnobs", (VolumeKnobs,), {"calls": []})
    monkeypatch.setattr(env_drivers, "acquire_driver", lambda name, options=None, **_: knobs())
    yield knobs


def with_volumes() -> dict[str, Any]:
    return machine(volumes=[{"name": "data", "target": "/data"}, {"name": "cache", "target": "/cache"}])


def everything_recorded(env_id: str) -> dict[str, Any]:
    with Store(state_dir() / "state.db") as store:
        return {
            "environment": store.environment(env_id),
            "machines": store.machines(env_id),
            "volumes": store.volumes(env_id),
            "bindings": store.bindings_of(env_id),
            "operations": store.operations(env_id),
        }


async def test_delete_removes_volumes_bindings_records_and_lock_and_says_so(
    vknobs: type[VolumeKnobs], tmp_path: Path
) -> None:
    from vz_core.env import delete
    from vz_core.env._locks import env_lock_path

    a, b = await two_worktrees(tmp_path, with_volumes())
    assert len(list(volume_dir().iterdir())) == 4
    sibling = everything_recorded(_env_id("sibling"))
    sibling_disk = {p.name for p in volume_dir().iterdir() if _env_id("sibling") in p.name}
    env_id = _env_id("default")
    result = await delete(ctx(a))
    assert sorted((v["volume"], v["state"]) for v in result["volumes"]) == [("cache", "removed"), ("data", "removed")]
    assert result["bindings"] == [str(a)] and result["operations_removed"] >= 2
    assert [m["state"] for m in result["machines"]] == ["deleted"]
    assert everything_recorded(env_id) == {
        "environment": None,
        "machines": [],
        "volumes": [],
        "bindings": [],
        "operations": [],
    }
    assert not env_lock_path(env_id).exists()
    assert {p.name for p in volume_dir().iterdir()} == sibling_disk  # only the sibling's volumes stay
    assert not any(env_id in str(p) for p in state_dir().rglob("*"))
    assert everything_recorded(_env_id("sibling")) == sibling
    del b


async def test_keep_volumes_keeps_them_listed_and_removable(vknobs: type[VolumeKnobs], tmp_path: Path) -> None:
    from vz_core.env import delete, list_volumes, remove_volume

    a = write(tmp_path / "a", with_volumes())
    await up(ctx(a))
    result = await delete(ctx(a), keep_volumes=True)
    assert sorted((v["volume"], v["state"]) for v in result["volumes"]) == [("cache", "kept"), ("data", "kept")]
    assert not [c for c in vknobs.calls if c[0] == "delete_volume"]
    listed = (await list_volumes(ctx(a)))["volumes"]
    assert sorted(v["volume"] for v in listed) == ["cache", "data"] and len(list(volume_dir().iterdir())) == 2
    removed = await remove_volume(ctx(a), listed[0]["name"])
    assert removed["volumes"][0]["state"] == "removed"
    assert [v["name"] for v in (await list_volumes(ctx(a)))["volumes"]] == [listed[1]["name"]]
    assert [p.name for p in volume_dir().iterdir()] == [listed[1]["name"]]
    from vz_core.env import SelectionNotFoundError

    with pytest.raises(SelectionNotFoundError, match="no kept volume named"):
        await remove_volume(ctx(a), listed[0]["name"])


async def test_a_driver_without_volume_removal_is_named_and_its_volumes_stay_listed(
    vknobs: type[VolumeKnobs], tmp_path: Path
) -> None:
    from vz_core.env import delete, list_volumes, remove_volume

    vknobs.removable = False
    a = write(tmp_path / "a", with_volumes())
    await up(ctx(a))
    result = await delete(ctx(a))
    assert {v["state"] for v in result["volumes"]} == {"kept"}
    assert all("driver 'fake' has no volume-removal operation" in v["reason"] for v in result["volumes"])
    listed = (await list_volumes(ctx(a)))["volumes"]
    assert len(listed) == 2
    with pytest.raises(UnsupportedError, match="no volume-removal operation"):
        await remove_volume(ctx(a), listed[0]["name"])
    vknobs.removable = True  # a driver that gained the operation removes them later
    await remove_volume(ctx(a), listed[0]["name"])
    assert len((await list_volumes(ctx(a)))["volumes"]) == 1


def _env_id(name: str) -> str:
    with Store(state_dir() / "state.db") as store:
        (env,) = [e for e in store.environments() if e.name == name]
        return env.env_id


@pytest.mark.parametrize(
    "ref", ["alpine", "ubuntu:24.04", "library/debian:12", "docker.io/library/alpine:3", "localhost:5000/app:1"]
)
def test_image_names_as_docker_users_write_them_are_accepted(ref: str) -> None:
    from vz_core.env._definition import check_image_reference

    assert check_image_reference(ref) == ref


@pytest.mark.parametrize(("ref", "message"), [("Alpine", "repository component"), ("x@sha256:0", "digest")])
def test_malformed_docker_names_are_still_refused(ref: str, message: str) -> None:
    from vz_core.env._definition import check_image_reference

    with pytest.raises(ValueError, match=message):
        check_image_reference(ref)
