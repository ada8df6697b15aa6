"""Driver declarations and registration: hooks validated with the culprit named, declarations checked, the
plugin command line and the unknown-key message generated from the declared options."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from importlib import metadata
from typing import Any

import pytest

from vz_core.errors import InvalidArgumentError, UserError
from vz_core.registry import (
    DRIVER_NAME_PATTERN,
    DriverDeclaration,
    DriverRegistry,
    MatrixRow,
    Option,
    RegistrationError,
    check_driver_name,
    hookimpl,
    is_driver_name,
    load_reference,
)

SHIPPED = ("fake", "hyperv", "linux_native", "macos_vm", "qemu", "vfkit")


def _declaration(**changes: Any) -> DriverDeclaration:
    fields: dict[str, Any] = {
        "name": "acme",
        "summary": "test driver",
        "factory": "vz_conformance.fake:FakeDriver",
        "options": (
            Option("state_dir", "where Machines are kept", kind="path", scope="host", default_text="<vz state>/acme"),
            Option("stop_timeout", "seconds before SIGKILL", 10.0, "float", minimum=0, maximum=3600),
            Option("faults", "fault modes", (), "list", flag="--fault", repeat=True),
            Option("verbose", "say more", False, "bool"),
        ),
        "matrix": (MatrixRow("linux", "linux", "DEV", "test"),),
    }
    fields.update(changes)
    return DriverDeclaration(**fields)


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def _hook(*declarations: DriverDeclaration) -> Any:
    @hookimpl
    def vz_builtin_drivers() -> list[DriverDeclaration]:
        return list(declarations)

    return vz_builtin_drivers


# --- names -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fake", "linux_native", "go-reference", "a", "a" * 63, "x9_-"])
def test_driver_names(name: str) -> None:
    assert is_driver_name(name) and check_driver_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a" * 64,
        "Fake",
        "9lives",
        "_x",
        "-x",
        "fake\n",
        "fake ",
        "a.b",
        "../x",
        "/abs/path",
        "a/b",
        "fa\x00ke",
        None,
        3,
    ],
)
def test_not_driver_names(name: object) -> None:
    assert not is_driver_name(name)
    with pytest.raises(UserError, match=r"machines\[0\]\.driver: .*is not a driver name"):
        check_driver_name(name, where="machines[0].driver")


def test_the_pattern_is_the_check() -> None:
    import re

    assert DRIVER_NAME_PATTERN.startswith("^") and DRIVER_NAME_PATTERN.endswith("$")
    body = DRIVER_NAME_PATTERN[1:-1]
    for candidate in ("fake", "Fake", "a" * 63, "a" * 64, "a-b_c", "1a"):
        assert (re.fullmatch(body, candidate) is not None) == is_driver_name(candidate)


# --- the shipped declarations -------------------------------------------------------------------------------


def test_shipped_declarations_are_valid_and_name_resolvable_references() -> None:
    registry = DriverRegistry(distribution="vz")
    assert registry.names() == list(SHIPPED)
    for declaration in registry.declarations():
        assert declaration.problems() == []
        assert declaration.matrix, f"{declaration.name} declares no matrix row"
        assert declaration.options is not None and declaration.declared_options
        for option in declaration.declared_options.values():
            assert option.help and option.scope in ("project", "host")
        from vz_conformance import Adapter
        from vz_conformance.adapters import load_adapter

        if declaration.adapter or declaration.name in ("fake", "linux_native", "qemu"):
            assert isinstance(load_adapter(declaration.adapter), Adapter)
        assert "vz_drivers" not in declaration.adapter
        assert registry.registered_by(declaration.name).startswith(f"plugin {declaration.name!r}")


def test_host_options_are_the_ones_choosing_binaries_paths_and_networks() -> None:
    registry = DriverRegistry(distribution="vz")
    host = {d.name: set(d.option_names("host")) for d in registry.declarations()}
    assert host["linux_native"] == {
        "state_dir",
        "image_dir",
        "subnet",
        "runc",
        "runc_sha256",
        "cgroup_parent",
        "agent_binary",
    }
    assert {"qemu", "kernel", "modules", "busybox", "state_dir", "image_dir", "agent_binary"} <= host["qemu"]
    assert host["fake"] == {"state_dir"}
    assert {"accelerator", "sessions", "stop_timeout"} <= set(registry.get("qemu").option_names("project"))


def test_registration_modules_do_not_import_driver_code() -> None:
    """Every shipped registration module is cheap: importing it loads no driver code (``_driver``/``_backend``
    modules), no pluggy, grpc, pydantic or psutil (vz imports them all on every command)."""
    registry = DriverRegistry(distribution="vz")
    modules = sorted({m for m in (registry.module_of(n) for n in registry.names()) if m})
    assert len(modules) == len(SHIPPED)
    code = (
        "import sys\n"
        f"modules = {modules!r}\n"
        "for m in modules: __import__(m)\n"
        "heavy = ('pluggy', 'grpc', 'pydantic', 'psutil')\n"
        "code = [m for m in sys.modules if m.endswith(('._driver', '._backend')) and not m.startswith('vz_core.')]\n"
        "bad = sorted(code + [m for m in sys.modules if m.split('.')[0] in heavy])\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# --- hook and declaration validation (the culprit is named) ---------------------------------------------


def test_a_misspelt_hook_is_refused_naming_the_module() -> None:
    @hookimpl
    def vz_builtin_driver() -> list[DriverDeclaration]:
        return []

    registry = DriverRegistry(load_entry_points=False)
    with pytest.raises(RegistrationError, match=r"acme_registration.*unknown hook 'vz_builtin_driver'"):
        registry.register(_module("acme_registration", vz_builtin_driver=vz_builtin_driver))
    assert registry.names() == []


def test_a_module_without_a_marked_hook_is_refused() -> None:
    def vz_builtin_drivers() -> list[DriverDeclaration]:
        return [_declaration()]

    registry = DriverRegistry(load_entry_points=False)
    with pytest.raises(RegistrationError, match=r"acme_registration implements no hook.*@vz_core.registry.hookimpl"):
        registry.register(_module("acme_registration", vz_builtin_drivers=vz_builtin_drivers))


def test_a_hook_with_the_wrong_signature_is_refused() -> None:
    @hookimpl
    def vz_builtin_drivers(config: object) -> list[DriverDeclaration]:
        return []

    registry = DriverRegistry(load_entry_points=False)
    with pytest.raises(RegistrationError, match=r"plugin acme_registration: .*Argument\(s\) \{'config'\} are declared"):
        registry.register(_module("acme_registration", vz_builtin_drivers=vz_builtin_drivers))


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        pytest.param(None, r"vz_builtin_drivers\(\) must return a list of DriverDeclaration, not NoneType", id="none"),
        pytest.param(
            _declaration(),
            r"vz_builtin_drivers\(\) must return a list of DriverDeclaration, not DriverDeclaration",
            id="bare",
        ),
        pytest.param([{"name": "acme"}], r"vz_builtin_drivers\(\)\[0\] is a dict", id="dict"),
    ],
)
def test_a_hook_returning_the_wrong_thing_is_refused(result: object, fragment: str) -> None:
    @hookimpl
    def vz_builtin_drivers() -> Any:
        return result

    registry = DriverRegistry(load_entry_points=False)
    registry.register(_module("acme_registration", vz_builtin_drivers=vz_builtin_drivers))
    with pytest.raises(RegistrationError, match=rf"plugin acme_registration: {fragment}"):
        registry.names()


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        pytest.param({"name": "Acme"}, "name: 'Acme' does not match", id="name"),
        pytest.param({"name": "../acme"}, "name: '../acme' does not match", id="path-name"),
        pytest.param({"factory": "acme.FakeDriver"}, "factory: 'acme.FakeDriver' must look like", id="factory"),
        pytest.param({"adapter": "nope"}, "adapter: 'nope' must look like", id="adapter"),
        pytest.param({"summary": " "}, "summary: must be", id="summary"),
        pytest.param({"targets": ("beos",)}, "targets:", id="targets"),
        pytest.param({"matrix": (MatrixRow("linux", "windows", "DEV"),)}, r"matrix\[0\].target_os", id="row-target"),
        pytest.param({"matrix": (MatrixRow("amiga", "linux", "DEV"),)}, r"matrix\[0\].host_os", id="row-host"),
        pytest.param({"matrix": (MatrixRow("linux", "linux", "DONE"),)}, r"matrix\[0\].status", id="row-status"),  # type: ignore[arg-type]
        pytest.param(
            {"matrix": (MatrixRow("linux", "linux", "DEV"), MatrixRow("linux", "linux", "ACTIVE"))},
            r"matrix\[1\]: host linux / target linux is listed twice",
            id="row-twice",
        ),
        pytest.param({"options": (Option("x", "x", scope="world"),)}, r"options.x.scope", id="scope"),  # type: ignore[arg-type]
        pytest.param({"options": (Option("x", ""),)}, r"options.x.help", id="help"),
        pytest.param({"options": (Option("Bad-Name", "x"),)}, r"options.Bad-Name", id="option-name"),
        pytest.param({"options": (Option("x", "x", repeat=True),)}, r"options.x.repeat", id="repeat"),
    ],
)
def test_an_invalid_declaration_is_refused_naming_plugin_and_field(changes: dict[str, Any], fragment: str) -> None:
    registry = DriverRegistry(load_entry_points=False)
    registry.register(_module("acme_registration", vz_builtin_drivers=_hook(_declaration(**changes))))
    with pytest.raises(
        RegistrationError, match=rf"plugin acme_registration: the declaration .* is invalid: .*{fragment}"
    ):
        registry.names()


def test_an_option_declared_twice_is_refused() -> None:
    with pytest.raises(RegistrationError, match="declared twice: x"):
        _declaration(options=(Option("x", "one"), Option("x", "two")))


def test_a_name_registered_twice_names_both_plugins() -> None:
    registry = DriverRegistry(load_entry_points=False)
    registry.register(_module("first_registration", vz_builtin_drivers=_hook(_declaration())))
    other = _declaration(factory="other:Driver")
    registry.register(_module("second_registration", vz_builtin_drivers=_hook(other)))
    with pytest.raises(RegistrationError, match=r"registered twice \(plugin first_registration: .*second_registration"):
        registry.names()


def test_an_entry_point_that_fails_to_import_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = metadata.EntryPoint(name="acme", value="vz_no_such_module_here.registration", group="vz.drivers")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [broken] if group == "vz.drivers" else [])
    with pytest.raises(RegistrationError, match=r"plugin 'acme' \(entry point vz_no_such_module_here.registration"):
        DriverRegistry()


def test_unknown_names_list_what_is_installed() -> None:
    registry = DriverRegistry(load_entry_points=False)
    registry.register(_module("acme_registration", vz_builtin_drivers=_hook(_declaration())))
    with pytest.raises(Exception, match=r"unknown driver 'nope'; installed built-in drivers: acme"):
        registry.get("nope")


def test_load_reference() -> None:
    assert load_reference("vz_core.registry:DriverDeclaration.create") is DriverDeclaration.create
    with pytest.raises(UserError, match="must look like 'module:attribute'"):
        load_reference("vz_core.registry")


# --- options: the unknown-key message and the plugin command line ----------------------------------------


def test_the_unknown_key_message_lists_every_valid_key() -> None:
    declaration = _declaration()
    with pytest.raises(UserError) as info:
        declaration.check_option_keys({"bogus": 1, "stop_timeout": 1}, where="machines[0].driver_options")
    assert str(info.value) == (
        "machines[0].driver_options: unknown acme option(s): bogus; valid options: faults, state_dir, stop_timeout, "
        "verbose"
    )
    with pytest.raises(InvalidArgumentError, match="unknown acme option"):  # the driver's own check, same code
        declaration.create(bogus=1)


def test_undescribed_options_pass_through() -> None:
    declaration = _declaration(options=None)
    declaration.check_option_keys({"anything": 1})
    assert declaration.option_names() == []


def test_the_plugin_help_is_generated_from_the_options() -> None:
    text = _declaration(plugin_command=("vz-driver-acme",)).plugin_parser().format_help()
    assert text.startswith("usage: vz-driver-acme")
    for fragment in ("--state-dir PATH", "where Machines are kept", "[host configuration", "--stop-timeout N"):
        assert fragment in text.replace("\n", " ").replace("  ", " ") or fragment in text
    assert "--fault NAME" in text and "repeatable" in text and "--option KEY=VALUE" in text


def _options(declaration: DriverDeclaration, argv: list[str]) -> dict[str, Any]:
    parser = declaration.plugin_parser()
    return declaration.plugin_options(parser, parser.parse_args(argv))


def test_plugin_options_from_flags_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    declaration = _declaration()
    monkeypatch.setenv("VZ_DRIVER_OPTIONS", json.dumps({"state_dir": "/from/env", "stop_timeout": 3}))
    got = _options(declaration, ["--stop-timeout", "2.5", "--fault", "a", "--fault", "b,c", "--option", "verbose=yes"])
    assert got == {"state_dir": "/from/env", "stop_timeout": 2.5, "faults": ["a", "b", "c"], "verbose": True}
    monkeypatch.delenv("VZ_DRIVER_OPTIONS")
    assert _options(declaration, ["--option", "state-dir=/x"]) == {"state_dir": "/x"}


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        pytest.param(["--option", "bogus=1"], None, "unknown acme option(s): bogus; valid options: faults", id="key"),
        pytest.param(["--option", "novalue"], None, "must look like KEY=VALUE", id="shape"),
        pytest.param(
            ["--stop-timeout", "soon"], None, 'stop_timeout: must be a number in [0, 3600], got "soon"', id="number"
        ),
        pytest.param(["--option", "verbose=maybe"], None, 'verbose: must be true or false, got "maybe"', id="bool"),
        pytest.param([], "{not json", "is not JSON", id="env-json"),
        pytest.param([], "[1]", "must be a JSON object", id="env-shape"),
        pytest.param([], '{"bogus": 1}', "unknown acme option(s): bogus", id="env-key"),
    ],
)
def test_bad_plugin_options_exit_2_naming_the_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], env: str | None, fragment: str
) -> None:
    if env is not None:
        monkeypatch.setenv("VZ_DRIVER_OPTIONS", env)
    with pytest.raises(SystemExit) as info:
        _options(_declaration(), argv)
    assert info.value.code == 2
    assert fragment in capsys.readouterr().err


# Stands in for the plugin SDK: reports what the shared plugin main imported before serving and what it serves.
STUB_SERVE = """
import sys, vz_plugins._declared
def serve(driver, *, on_serving=None):
    early = sorted(m for m in sys.modules if m.endswith("._driver") and m.startswith("vz_drivers"))
    made = driver() if callable(driver) else driver
    print(type(made).__name__, early, file=sys.stderr)
    sys.exit(0)
vz_plugins._declared.serve = serve
from vz_drivers.qemu.registration import main
main(sys.argv[1:])
"""


def test_the_shared_plugin_main_builds_the_driver_only_when_serving(tmp_path: Any) -> None:
    out = subprocess.run(
        [sys.executable, "-c", STUB_SERVE, "--state-dir", str(tmp_path), "--accelerator", "tcg"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().endswith("QemuDriver []"), out.stderr


def test_declarations_are_immutable_values() -> None:
    a, b = _declaration(), _declaration()
    assert a == b and a != _declaration(name="other")
    assert Option("x", "y") == Option("x", "y") and hash(Option("x", "y")) == hash(Option("x", "y"))
    shown = "MatrixRow(host_os='linux', target_os='linux', status='DEV', note='')"
    assert repr(MatrixRow("linux", "linux", "DEV")) == shown
    with pytest.raises(AttributeError, match="immutable"):
        a.name = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        Option("x", "y", colour="blue")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="missing required argument 'help'"):
        Option("x")  # type: ignore[call-arg]
    assert dict(a.declared_options)["state_dir"].scope == "host"


# How the host launches a built-in: options in the environment only, the registration module named.
HOST_LAUNCH = """
import sys, vz_plugins._declared
def serve(driver, *, on_serving=None):
    made = driver()
    print(type(made).__name__, "argparse" in sys.modules, file=sys.stderr)
    sys.exit(0)
vz_plugins._declared.serve = serve
from vz_plugins import plugin_main
plugin_main(sys.argv[1:])
"""


def test_a_host_launch_reads_options_from_the_environment_without_argparse(tmp_path: Any) -> None:
    import os

    env = {**os.environ, "VZ_DRIVER_OPTIONS": json.dumps({"state_dir": str(tmp_path), "accelerator": "tcg"})}
    argv = [sys.executable, "-c", HOST_LAUNCH, "--module", "vz_drivers.qemu.registration", "qemu"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert (out.returncode, out.stderr.strip().splitlines()[-1]) == (0, "QemuDriver False"), out.stderr
    env["VZ_DRIVER_OPTIONS"] = '{"bogus": 1}'
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert out.returncode == 2 and "unknown qemu option(s): bogus; valid options: accelerator" in out.stderr
    wrong = [sys.executable, "-c", HOST_LAUNCH, "--module", "vz_drivers.qemu.registration", "fake"]
    out = subprocess.run(wrong, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert out.returncode == 2 and "declares no driver 'fake'" in out.stderr


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "fake"])
def test_a_driver_accepts_exactly_the_options_its_declaration_describes(name: str) -> None:
    """The declaration is where options are described; a driver taking an undeclared one (or dropping one) fails."""
    import re

    declaration = DriverRegistry(distribution="vz").get(name)
    with pytest.raises(Exception) as info:
        declaration.load()(not_an_option_of_any_driver=1)
    message = str(info.value)
    listed = re.search(r"(?:known|valid options): ([a-z0-9_, ]+)", message)
    assert listed is not None, message
    assert sorted(listed.group(1).replace(" ", "").split(",")) == declaration.option_names(), message


def test_the_macos_adapter_finds_processes_without_proc() -> None:
    """Its ps-based scan runs on any POSIX ps (procps here, BSD ps in a macOS guest) and prints what the suite
    parses: "<pid> <start>" per live pid and "marker <pid>" per process carrying the marker."""
    import os
    import time

    from vz_conformance.adapters.macos_vm import ADAPTER

    marker = f"vz-marker-{os.getpid()}-{time.monotonic_ns()}"
    holder = subprocess.Popen(["sh", "-c", "sleep 30; true", marker])  # "; true": sh cannot exec sleep
    try:
        out = subprocess.run(
            list(ADAPTER.find_processes([holder.pid, 999_999_999], marker)),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.splitlines()
    finally:
        holder.kill()
        holder.wait()
    lines = [line.split() for line in out]
    assert all(len(parts) == 2 for parts in lines), out
    assert [p[0] for p in lines if p[0].isdigit()] == [str(holder.pid)]
    assert ["marker", str(holder.pid)] in lines
