"""Reconciliation plans: deterministic, identity-keeping for mutable changes, blocked for unsafe ones."""

from __future__ import annotations

from typing import Any

from vz_core.env import Plan, compute_plan
from vz_core.env._plan import RecordedMachine, diff_specs


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "web",
        "driver": "fake",
        "target": {"os": "linux", "arch": None},
        "profile": "developer",
        "image": "img:1",
        "environment": {"A": "1"},
    }
    base.update(overrides)
    return base


WEB = RecordedMachine("web", "mch_000000000000", spec(), "running")
DB = RecordedMachine("db", "mch_111111111111", spec(name="db"), "running")


def plan(
    desired: list[tuple[str, dict[str, Any]]], recorded: list[RecordedMachine], observed: dict[str, Any], **kw: Any
) -> Plan:
    kw.setdefault("recorded_default", None)
    kw.setdefault("desired_default", None)
    kw.setdefault("recreate", False)
    return compute_plan(desired, recorded, observed, **kw)


def actions(p: Any) -> list[tuple[str, str, str | None]]:
    return [(s.action, s.machine, s.machine_id) for s in p.steps]


def test_new_environment_creates_everything_in_definition_order() -> None:
    p = plan([("web", spec()), ("db", spec(name="db"))], [], {})
    assert actions(p) == [("create", "web", None), ("create", "db", None)]
    assert not p.blocked and p.changes_anything


def test_unchanged_running_environment_is_a_no_op() -> None:
    p = plan([("web", spec())], [WEB], {WEB.machine_id: "running"})
    assert actions(p) == [("keep", "web", WEB.machine_id)]
    assert not p.changes_anything


def test_stopped_machines_are_started_and_missing_ones_recreated_with_the_same_id() -> None:
    p = plan([("web", spec()), ("db", spec(name="db"))], [WEB, DB], {WEB.machine_id: "stopped"})
    assert actions(p) == [("start", "web", WEB.machine_id), ("create", "db", DB.machine_id)]
    assert "missing from its driver" in p.steps[1].reason


def test_adding_a_machine_keeps_the_others_identity() -> None:
    p = plan([("web", spec()), ("db", spec(name="db"))], [WEB], {WEB.machine_id: "running"})
    assert actions(p) == [("keep", "web", WEB.machine_id), ("create", "db", None)]
    assert not p.blocked


def test_default_machine_change_is_mutable() -> None:
    p = plan([("web", spec())], [WEB], {WEB.machine_id: "running"}, recorded_default="web", desired_default="db")
    assert p.default_machine == ("web", "db") and not p.blocked
    assert p.lines()[-1] == "* default machine web → db"


def test_creation_time_change_is_blocked_without_recreate() -> None:
    p = plan([("web", spec(image="img:2"))], [WEB], {WEB.machine_id: "running"})
    assert [s.machine for s in p.blocked] == ["web"]
    assert p.blocked[0].action == "recreate"
    assert p.blocked[0].reason == 'image "img:1" → "img:2"'
    p = plan([("web", spec(image="img:2"))], [WEB], {WEB.machine_id: "running"}, recreate=True)
    assert not p.blocked and actions(p) == [("recreate", "web", WEB.machine_id)]


def test_identity_changes_come_first_and_environment_values_are_not_shown() -> None:
    changes = diff_specs(spec(), spec(driver="linux_native", environment={"A": "secret-ish"}, image="img:2"))
    assert [c.field for c in changes] == ["driver", "environment", "image"]
    assert changes[0].kind == "identity" and changes[1].kind == "creation"
    assert changes[1].describe() == "environment changed (A)"
    assert "secret-ish" not in str(changes[1].to_json())


def test_removal_is_blocked_without_recreate() -> None:
    p = plan([("web", spec())], [WEB, DB], {WEB.machine_id: "running", DB.machine_id: "running"})
    assert [(s.action, s.machine) for s in p.blocked] == [("remove", "db")]
    p = plan([("web", spec())], [WEB, DB], {WEB.machine_id: "running"}, recreate=True)
    assert actions(p)[-1] == ("remove", "db", DB.machine_id) and not p.blocked


def test_interrupted_creation_is_adopted_when_running() -> None:
    creating = RecordedMachine("web", WEB.machine_id, spec(), "creating")
    p = plan([("web", spec())], [creating], {WEB.machine_id: "running"})
    assert actions(p) == [("keep", "web", WEB.machine_id)]
    assert "adopting" in p.steps[0].reason


def test_plans_are_deterministic() -> None:
    args = ([("web", spec(image="x")), ("db", spec(name="db"))], [DB, WEB], {WEB.machine_id: "running"})
    first = plan(*args, recreate=True).to_json()
    for _ in range(5):
        assert plan(*args, recreate=True).to_json() == first
