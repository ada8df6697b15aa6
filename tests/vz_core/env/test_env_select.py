"""Selection rules: flag → VZ_ENVIRONMENT_ID → binding → sole bound → default; wrong selectors fail at their level."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from vz_core.env import (
    AmbiguousSelectionError,
    EnvironmentRecord,
    MachineRecord,
    SelectionNotFoundError,
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
    bound: str | None = None,
    bound_ids: Sequence[str] = (),
    for_up: bool = False,
) -> tuple[str | None, str | None, str]:
    choice = select_environment(
        project_id="p",
        environments=envs,
        explicit=explicit,
        env_var=env_var,
        bound_env_id=bound,
        bound_env_ids=set(bound_ids),
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
            {"explicit": "beta", "env_var": A.env_id, "bound": A.env_id}, ("beta", None, "flag"), id="flag-wins"
        ),
        pytest.param({"env_var": B.env_id, "bound": A.env_id}, ("beta", None, "env-var"), id="env-var-beats-binding"),
        pytest.param({"bound": B.env_id, "bound_ids": [A.env_id]}, ("beta", None, "binding"), id="binding"),
        pytest.param({"bound_ids": [A.env_id]}, ("alpha", None, "sole"), id="sole-bound"),
        pytest.param({"envs": [B]}, ("beta", None, "sole"), id="sole-unbound"),
        pytest.param({"envs": [], "for_up": True}, (None, "default", "new"), id="up-creates-default"),
        pytest.param({"explicit": "gamma", "for_up": True}, (None, "gamma", "new"), id="up-creates-named"),
    ],
)
def test_selection_order(kwargs: dict[str, object], expected: tuple[str | None, str | None, str]) -> None:
    assert choose(**kwargs) == expected  # type: ignore[arg-type]


def test_unknown_name_fails_without_up() -> None:
    with pytest.raises(SelectionNotFoundError, match=r"--environment gamma: project 'p' has no Environment") as info:
        choose(explicit="gamma", bound=A.env_id)
    assert "alpha (env_aaaaaaaaaaaa)" in str(info.value)


def test_unknown_id_fails_even_for_up_and_says_where_it_belongs() -> None:
    with pytest.raises(SelectionNotFoundError, match="belongs to project 'q'"):
        choose(explicit=OTHER.env_id, for_up=True)


def test_wrong_env_var_fails_at_its_level_instead_of_falling_back() -> None:
    with pytest.raises(SelectionNotFoundError, match="VZ_ENVIRONMENT_ID=env_zzzzzzzzzzzz names no Environment"):
        choose(env_var="env_zzzzzzzzzzzz", bound=A.env_id)


def test_ambiguity_lists_candidates() -> None:
    with pytest.raises(AmbiguousSelectionError) as info:
        choose(bound_ids=[A.env_id, B.env_id])
    assert info.value.candidates == (A.label(), B.label())
    assert "--environment" in str(info.value)


def test_ambiguity_among_unbound_environments_too() -> None:
    with pytest.raises(AmbiguousSelectionError):
        choose()


def test_default_is_only_created_when_the_project_has_none() -> None:
    assert choose([A], for_up=True) == ("alpha", None, "sole")
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
