"""Selection rules (the contract's table): flag → VZ_ENVIRONMENT_ID → this worktree's binding(s) → `default` only
when the project has none; wrong selectors fail at their level; an unbound worktree fails closed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from vz_core.env import (
    AmbiguousSelectionError,
    EnvironmentRecord,
    MachineRecord,
    SelectionNotFoundError,
    UnboundWorktreeError,
    select_environment,
    select_machine,
)
from vz_core.env._ids import looks_like_env_id, new_env_id, new_machine_id, workspace_id

A = EnvironmentRecord("env_aaaaaaaaaaaa", "p", "alpha", "running", "/w/a", None, "t1", "t1")
B = EnvironmentRecord("env_bbbbbbbbbbbb", "p", "beta", "running", "/w/b", None, "t2", "t2")
OTHER = EnvironmentRecord("env_cccccccccccc", "q", "alpha", "running", "/w/q", None, "t3", "t3")


def choose(
    envs: Sequence[EnvironmentRecord] = (A, B),
    *,
    explicit: str | None = None,
    env_var: str | None = None,
    here: Sequence[str] = (),
    bindings: dict[str, list[str]] | None = None,
    for_up: bool = False,
) -> tuple[str | None, str | None, str]:
    choice = select_environment(
        project_id="p",
        environments=envs,
        explicit=explicit,
        env_var=env_var,
        bound_here=set(here),
        bindings=bindings,
        worktree="/w/new",
        for_up=for_up,
        all_environments=[*envs, OTHER],
    )
    return (choice.environment.name if choice.environment else None, choice.create_name, choice.via)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"explicit": "beta"}, ("beta", None, "flag"), id="flag-name"),
        pytest.param({"explicit": B.env_id}, ("beta", None, "flag"), id="flag-id"),
        pytest.param(
            {"explicit": "beta", "env_var": A.env_id, "here": [A.env_id]}, ("beta", None, "flag"), id="flag-wins"
        ),
        pytest.param(
            {"explicit": "beta", "here": [A.env_id, B.env_id]}, ("beta", None, "flag"), id="flag-resolves-ambiguity"
        ),
        pytest.param({"env_var": B.env_id, "here": [A.env_id]}, ("beta", None, "env-var"), id="env-var-beats-binding"),
        pytest.param({"env_var": B.env_id}, ("beta", None, "env-var"), id="env-var-in-unbound-worktree"),
        pytest.param({"here": [B.env_id]}, ("beta", None, "binding"), id="binding"),
        pytest.param({"envs": [], "for_up": True}, (None, "default", "new"), id="up-creates-default"),
        pytest.param({"explicit": "gamma", "for_up": True}, (None, "gamma", "new"), id="up-creates-named"),
        pytest.param(
            {"explicit": "gamma", "for_up": True, "here": [A.env_id]}, (None, "gamma", "new"), id="up-creates-beside"
        ),
    ],
)
def test_selection_order(kwargs: dict[str, object], expected: tuple[str | None, str | None, str]) -> None:
    assert choose(**kwargs) == expected  # type: ignore[arg-type]


def test_unknown_name_fails_without_up() -> None:
    with pytest.raises(SelectionNotFoundError, match=r"--environment gamma: project 'p' has no Environment") as info:
        choose(explicit="gamma", here=[A.env_id])
    assert "alpha (env_aaaaaaaaaaaa)" in str(info.value)


def test_unknown_id_fails_even_for_up_and_says_where_it_belongs() -> None:
    with pytest.raises(SelectionNotFoundError, match="belongs to project 'q'"):
        choose(explicit=OTHER.env_id, for_up=True)


def test_wrong_env_var_fails_at_its_level_instead_of_falling_back() -> None:
    with pytest.raises(SelectionNotFoundError, match="VZ_ENVIRONMENT_ID=env_zzzzzzzzzzzz names no Environment"):
        choose(env_var="env_zzzzzzzzzzzz", here=[A.env_id])


def test_several_bound_here_and_none_selected_fails_listing_them() -> None:
    for for_up in (False, True):
        with pytest.raises(AmbiguousSelectionError) as info:
            choose(here=[A.env_id, B.env_id], for_up=for_up)
        assert not isinstance(info.value, UnboundWorktreeError)
        assert info.value.candidates == (A.label(), B.label())
        assert "--environment" in str(info.value)


@pytest.mark.parametrize("for_up", [False, True], ids=["exec-status-stop-delete", "up"])
def test_unbound_worktree_of_a_project_with_environments_fails_closed(for_up: bool) -> None:
    """Never adopt the sole Environment another worktree uses, never create `default` beside it."""
    for envs in ([A], [A, B]):
        with pytest.raises(UnboundWorktreeError) as info:
            choose(envs, bindings={A.env_id: ["/w/a"]}, for_up=for_up)
        message = str(info.value)
        assert info.value.candidates == tuple(e.label() for e in envs)
        assert "alpha (env_aaaaaaaaaaaa), bound to /w/a" in message
        if len(envs) == 2:
            assert "beta (env_bbbbbbbbbbbb), bound to no worktree" in message
        assert "/w/new" in message
        assert "vz up --environment NAME" in message and "vz up --environment NEW-NAME" in message


def test_default_is_only_created_when_the_project_has_none() -> None:
    assert choose([], for_up=True) == (None, "default", "new")
    with pytest.raises(UnboundWorktreeError):
        choose([A], for_up=True)
    with pytest.raises(SelectionNotFoundError, match="has no Environment yet"):
        choose([], for_up=False)


def test_invalid_new_name_is_refused() -> None:
    with pytest.raises(SelectionNotFoundError, match="not a valid Environment name"):
        choose(explicit="Bad_Name", for_up=True)


def _machines(env: EnvironmentRecord, *names: str) -> list[MachineRecord]:
    out = []
    for index, name in enumerate(names):
        mid = f"mch_{str(index) * 12}"
        out.append(
            MachineRecord(env.env_id, mid, name, workspace_id("p", env.env_id, mid), "fake", {}, "running", "t", "t")
        )
    return out


def test_machine_selection_order() -> None:
    web, db = _machines(A, "web", "db")
    env = EnvironmentRecord(**{**A.__dict__, "default_machine": "db"})
    assert select_machine(environment=env, machines=[web, db], explicit="web", env_var=db.machine_id) is web
    assert select_machine(environment=env, machines=[web, db], explicit=web.machine_id, env_var=None) is web
    assert select_machine(environment=env, machines=[web, db], explicit=None, env_var=web.machine_id) is web
    assert select_machine(environment=env, machines=[web, db], explicit=None, env_var=None) is db
    assert select_machine(environment=A, machines=[web], explicit=None, env_var=None) is web


def test_machine_errors() -> None:
    web, db = _machines(A, "web", "db")
    with pytest.raises(AmbiguousSelectionError, match="several Machines and no default_machine") as info:
        select_machine(environment=A, machines=[web, db], explicit=None, env_var=None)
    assert len(info.value.candidates) == 2
    with pytest.raises(SelectionNotFoundError, match="--machine cache"):
        select_machine(environment=A, machines=[web, db], explicit="cache", env_var=None)
    with pytest.raises(SelectionNotFoundError, match="VZ_MACHINE_ID=mch_x"):
        select_machine(environment=A, machines=[web, db], explicit=None, env_var="mch_x")


def test_ids_are_immutable_shapes_that_names_cannot_take() -> None:
    env_id = new_env_id()
    assert looks_like_env_id(env_id) and "_" in env_id
    assert new_machine_id() != new_machine_id()
    assert workspace_id("p", env_id, "mch_1") == f"vz-p-{env_id}-mch_1"
