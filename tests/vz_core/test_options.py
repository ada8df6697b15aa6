"""vz_core.options: each kind's parser, its bounds, the refusal of NaN and infinities, the typed Options object,
the declaration checks of an Option, and the host-side check of a DriverDeclaration."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from vz_core.errors import InvalidArgumentError, UserError
from vz_core.options import Option, OptionError, Options, parse_options
from vz_core.registry import DriverDeclaration
from vz_core.transport import StderrTail

STOP = Option("stop_timeout", "seconds", 10.0, "duration", minimum=0, exclusive_minimum=True, maximum=3600)
SESSIONS = Option("sessions", "ports", 3, "int", minimum=1, maximum=7)
DISK = Option("disk_size", "bytes", 64 << 30, "size", minimum=32 << 30, maximum=16 << 40)
FLAG = Option("nested", "on or off", False, "bool")
MODE = Option("mode", "which", "auto", "choice", choices=("auto", "on", "off"))
BIN = Option("vfkit", "the binary", kind="path", absolute=True)
REGISTRIES = Option("insecure_registries", "hosts", (), "list")


@pytest.mark.parametrize(
    ("given", "parsed"),
    [(5, 5.0), (2.5, 2.5), ("2.5", 2.5), (" 10 ", 10.0), ("1e3", 1000.0), (3600, 3600.0), (1e-3, 0.001)],
)
def test_a_duration_takes_finite_seconds_within_its_bounds(given: Any, parsed: float) -> None:
    value = STOP.parse(given)
    assert value == parsed and isinstance(value, float)
    assert STOP.parse(value) == value  # idempotent


@pytest.mark.parametrize(
    "given",
    [
        0,
        -1,
        -0.0,
        3600.5,
        1e308,
        float("inf"),
        float("-inf"),
        float("nan"),
        "inf",
        "Infinity",
        "nan",
        "NaN",
        "1e999",
        "0x10",
        "1_0",
        "",
        "soon",
        True,
        False,
        None,
        [1],
        {"s": 1},
        10**400,
    ],
)
def test_a_duration_refuses_everything_else_naming_the_bounds(given: Any) -> None:
    with pytest.raises(OptionError) as info:
        STOP.parse(given)
    assert info.value.option == "stop_timeout"
    assert info.value.problem.startswith("must be a number of seconds in (0, 3600], got ")
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


def test_the_refusal_shows_the_value_as_json() -> None:
    for given, shown in ((-1, "-1"), ("inf", '"inf"'), (1e308, "1e+308"), (True, "true"), (None, "null")):
        with pytest.raises(OptionError, match=f"got {shown.replace('+', '[+]')}$"):
            STOP.parse(given)
    with pytest.raises(OptionError, match=r'got "a{76}\.\.\.$'):
        STOP.parse("a" * 5000)


def test_an_int_takes_integers_only() -> None:
    assert SESSIONS.parse(1) == 1 and SESSIONS.parse("7") == 7 and SESSIONS.parse(3.0) == 3
    for bad in (0, 8, -1, 2.5, "3.5", "inf", "nan", float("nan"), True, "", "three", 1e308):
        with pytest.raises(OptionError, match=r"must be an integer in \[1, 7\]"):
            SESSIONS.parse(bad)


def test_a_size_takes_bytes_or_text_with_a_binary_unit() -> None:
    assert DISK.parse(64 << 30) == 64 << 30
    assert DISK.parse("64GiB") == DISK.parse("64G") == DISK.parse("64 gib") == 64 << 30
    assert DISK.parse("1TiB") == 1 << 40 and DISK.parse("40960MiB") == 40 << 30
    for bad in ("1GiB", 1 << 30, "17TiB", "64 GB per disk", "-64GiB", "1.5GiB", "inf", True, 2.5):
        with pytest.raises(OptionError, match=r"must be a size in bytes .* in \[32 GiB, 16 TiB\]"):
            DISK.parse(bad)


def test_a_bool_takes_true_false_and_their_words() -> None:
    for text in (True, "1", "true", "Yes", "on"):
        assert FLAG.parse(text) is True
    for text in (False, "0", "false", "no", "OFF"):
        assert FLAG.parse(text) is False
    for bad in (1, 0, "maybe", "", None, 1.0):
        with pytest.raises(OptionError, match="must be true or false"):
            FLAG.parse(bad)


def test_a_choice_takes_one_of_its_choices_exactly() -> None:
    assert MODE.parse("on") == "on"
    for bad in ("ON", "maybe", 1, True, ""):
        with pytest.raises(OptionError, match=r'must be one of "auto", "on", "off"'):
            MODE.parse(bad)


def test_paths_text_and_lists() -> None:
    assert BIN.parse("/opt/vfkit") == "/opt/vfkit" and BIN.parse("") == ""
    assert BIN.parse(Path("/opt/vfkit")) == "/opt/vfkit"
    for bad in ("vfkit", "./vfkit", "/a\0b", 5, "/" + "a" * 5000):
        with pytest.raises(OptionError, match="must be an absolute path"):
            BIN.parse(bad)
    assert REGISTRIES.parse("a:5000, b ,") == ("a:5000", "b")
    assert REGISTRIES.parse(["a", "b"]) == ("a", "b")
    wrong: tuple[Any, ...] = (5, True, [1], ["a\0"])
    for item in wrong:
        with pytest.raises(OptionError, match="must be a list of strings"):
            REGISTRIES.parse(item)


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        (Option("t", "t", 10.0, "duration"), "needs a finite minimum"),
        (Option("t", "t", 10.0, "duration", minimum=0), "needs a finite maximum"),
        (Option("t", "t", 10.0, "duration", minimum=0, maximum=math.inf), "needs a finite maximum"),
        (Option("t", "t", 10.0, "duration", minimum=math.nan, maximum=5), "needs a finite minimum"),
        (Option("t", "t", 1.0, "duration", minimum=5, maximum=5), "is not below the maximum"),
        (Option("t", "t", 0.0, "duration", minimum=0, exclusive_minimum=True, maximum=9), "default: must be"),
        (Option("t", "t", "10", "duration", minimum=0, maximum=60), "is not a duration value itself"),
        (Option("t", "t", "x", minimum=0), "only a numeric option"),
        (Option("t", "t", "a", "choice"), "lists its choices"),
        (Option("t", "t", "b", "choice", choices=("a",)), "default: must be one of"),
        (Option("t", "t", kind="str", absolute=True), "only a 'path' option"),
        (Option("t", "t", kind="weird"), "is not one of"),  # type: ignore[arg-type]
    ],
)
def test_an_unsound_declaration_is_named(option: Option, problem: str) -> None:
    assert any(problem in found for found in option.problems()), option.problems()


def test_the_shipped_declarations_are_sound() -> None:
    from vz_core.registry import DriverRegistry

    for declaration in DriverRegistry(distribution="vz").declarations():
        for option in declaration.declared_options.values():
            assert option.problems() == [], (declaration.name, option.name)
            if option.name.endswith("_timeout"):
                assert option.kind == "duration" and option.exclusive_minimum and option.minimum == 0
                assert option.maximum == 3600


def test_options_are_frozen_typed_and_complete() -> None:
    declared = {o.name: o for o in (STOP, SESSIONS, FLAG, REGISTRIES)}
    options = parse_options("acme", declared, {"stop_timeout": "2.5", "nested": "on"})
    assert isinstance(options, Options)
    assert (options.stop_timeout, options.sessions, options.nested, options.insecure_registries) == (2.5, 3, True, ())
    assert options.given == {"stop_timeout", "nested"}
    assert options.raw() == {"stop_timeout": 2.5, "nested": True}
    with pytest.raises(AttributeError):
        options.stop_timeout = 1
    with pytest.raises(AttributeError, match="declares no option 'boot_timeout'"):
        _ = options.boot_timeout
    assert parse_options("acme", declared, options) is options


def _declaration() -> DriverDeclaration:
    return DriverDeclaration(
        name="acme", summary="s", factory="types:SimpleNamespace", options=(STOP, SESSIONS, FLAG, REGISTRIES)
    )


def test_the_host_check_names_the_path_and_the_fix() -> None:
    declaration = _declaration()
    with pytest.raises(UserError) as info:
        declaration.check_options(
            {"stop_timeout": -1}, where="$.machines[0].driver_options", fix="fix it (default {default}, key {key})"
        )
    assert str(info.value) == (
        "$.machines[0].driver_options.stop_timeout: must be a number of seconds in (0, 3600], got -1; "
        "fix it (default 10, key stop_timeout)"
    )
    with pytest.raises(UserError, match="unknown acme option"):
        declaration.check_options({"bogus": 1}, where="x")


def test_the_plugin_check_is_the_same_code_as_an_invalid_argument() -> None:
    declaration = _declaration()
    with pytest.raises(InvalidArgumentError, match=r"option sessions: must be an integer in \[1, 7\], got 9") as info:
        declaration.options_of({"sessions": 9})
    assert info.value.details == {"option": "sessions"}
    options = declaration.options_of(None, {"sessions": "2"})
    assert options.sessions == 2 and declaration.options_of(options) is options


def test_the_json_schema_of_the_options_carries_types_defaults_and_bounds() -> None:
    schema = _declaration().options_schema()
    assert schema["additionalProperties"] is False
    stop = schema["properties"]["stop_timeout"]
    assert (stop["type"], stop["exclusiveMinimum"], stop["maximum"], stop["default"]) == ("number", 0, 3600, 10.0)
    assert schema["properties"]["sessions"]["type"] == "integer"
    assert schema["properties"]["insecure_registries"] == {
        "description": "hosts",
        "type": "array",
        "items": {"type": "string"},
        "default": [],
        "x-vz-kind": "list",
        "x-vz-scope": "project",
    }


def test_a_plugin_traceback_never_reaches_the_quoted_stderr() -> None:
    from vz_core.transport import without_tracebacks

    lines = [
        "INFO starting",
        "ERROR vz.plugin: internal error in the plugin: KeyError: 'missing'",
        "Traceback (most recent call last):",
        '  File "/srv/plugin/x.py", line 3, in build',
        "    raise KeyError(secret['missing'])",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^",
        "KeyError: 'missing'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/srv/plugin/y.py", line 9, in main',
        "RuntimeError: boom",
        "INFO after",
    ]
    kept = without_tracebacks(lines)
    assert kept[:2] == lines[:2]
    assert "RuntimeError: boom" in kept and kept[-1] == "INFO after"
    assert not any('File "' in line or "Traceback" in line or "^^^" in line for line in kept)
    assert "KeyError: 'missing'" not in kept  # the summary line above already said it
    assert StderrTail.text.__doc__ is not None and "tracebacks left out" in StderrTail.text.__doc__


def test_recorded_values_today_refused_fall_back_to_their_default_so_the_machine_stays_reachable() -> None:
    from vz_core.drivers import validate_project_options

    recorded = {"stop_timeout": "inf", "sessions": 2}
    assert validate_project_options("qemu", recorded, recorded=True) == {"sessions": 2}
    with pytest.raises(UserError, match=r"\$\.machines\[0\]\.driver_options\.stop_timeout: must be"):
        validate_project_options("qemu", recorded, where="$.machines[0].driver_options")
    with pytest.raises(UserError, match="unknown qemu option"):  # unknown keys stay refused, recorded or not
        validate_project_options("qemu", {"bogus": 1}, recorded=True)
