"""The PowerShell scripts: documented cmdlets and parameter sets only, arguments as data, JSON answers."""

from __future__ import annotations

import json
import re

import pytest
from hyperv_docs import calls, check_text

from vz_core.errors import NotFoundError, PermissionDeniedError, RuntimeFailureError, UnavailableError
from vz_drivers.hyperv import _scripts as ps
from vz_drivers.hyperv._ps import ARGS_ENV, MARKER, PowerShellRunner, Script, ScriptError, parse_answer, script_text


@pytest.mark.parametrize("script", ps.SCRIPTS, ids=lambda s: s.name)
def test_every_script_uses_documented_parameter_sets(script: Script) -> None:
    found = check_text(script_text(script))
    assert found, "the checker found no cmdlet call at all"


def test_the_checker_refuses_what_the_docs_do_not_allow() -> None:
    bad = {
        "Stop-VM -Name $a.name -Kill": "undocumented parameter",
        "Get-VM -Name $a.name -Id $a.id": "fit no documented parameter set",
        "New-VM -Name $a.name -NoVHD -VHDPath $a.disk": "fit no documented parameter set",
        "New-VM -Name $a.name -NewVHDPath $a.disk": "fit no documented parameter set",  # -NewVHDSizeBytes missing
        "Start-VM $a.name": "positional",
        "Set-VMComPort -VMName $a.name -Path $a.pipe": "fit no documented parameter set",  # -Number is mandatory
        "Restart-VM -Name $a.name": "not a documented cmdlet",
        "Set-VMProcessor -VMName $a.name -Count 2 -Count 3": "given twice",
    }
    for text, why in bad.items():
        with pytest.raises(AssertionError, match=why):
            check_text(text)
    # Words in strings and arguments are not calls; piped calls need no -InputObject.
    assert [c.cmdlet for c in calls("throw 'Stop-VM -Bogus'; Get-Module -ListAvailable -Name Hyper-V")] == [
        "Get-Module"
    ]
    check_text("$x | ConvertFrom-Json")


def test_the_cmdlets_the_driver_is_built_on_are_called_as_documented() -> None:
    used = {(c.cmdlet, p) for s in ps.SCRIPTS for c in calls(script_text(s)) for p in c.params}
    for expected in [
        ("New-VM", "Generation"),
        ("New-VM", "NoVHD"),
        ("New-VM", "MemoryStartupBytes"),
        ("Set-VMProcessor", "Count"),
        ("Set-VMMemory", "StartupBytes"),
        ("Set-VMMemory", "DynamicMemoryEnabled"),
        ("Set-VMFirmware", "EnableSecureBoot"),
        ("Set-VMFirmware", "SecureBootTemplate"),
        ("Set-VMFirmware", "FirstBootDevice"),
        ("Add-VMHardDiskDrive", "Path"),
        ("Stop-VM", "TurnOff"),
        ("Stop-VM", "Force"),
        ("Remove-VM", "Force"),
        ("Get-VM", "Id"),
    ]:
        assert expected in used, expected
    create = script_text(ps.CREATE)
    assert "-Generation 2" in create and "-EnableSecureBoot Off" in create
    assert "-SecureBootTemplate $a.secure_boot_template" in create
    assert ps.GCS_KEY in create and "ElementName" in create


@pytest.mark.parametrize("script", ps.SCRIPTS, ids=lambda s: s.name)
def test_scripts_take_user_values_only_as_data(script: Script) -> None:
    text = script_text(script)
    # Every argument the body reads is declared, and the body reads nothing else.
    read = set(re.findall(r"\$a\.([a-z_]+)", script.body))
    assert read == set(script.args)
    # The text is fixed: the same for every call (there is no way to put a value into it).
    assert text == script_text(script)
    assert f"GetEnvironmentVariable('{ARGS_ENV}') | ConvertFrom-Json" in text
    assert "ConvertTo-Json -InputObject $vzAnswer" in text and "-Compress" in text
    assert text.isascii()


@pytest.mark.parametrize("script", ps.SCRIPTS, ids=lambda s: s.name)
def test_script_text_is_one_statement_for_command_stdin(script: Script) -> None:
    # `-Command -` reads statement by statement and ends a multi-line one at an empty line: one top-level
    # statement, no empty line inside it, and an empty line after it.
    text = script_text(script)
    lines = text.split("\n")
    assert lines[0] == "& {" and lines[-3] == "}" and lines[-2:] == ["", ""]
    assert all(line.strip() for line in lines[:-2])
    depth = 0
    for line in lines[:-3]:
        depth += line.count("{") - line.count("}")
        assert depth > 0, f"the top-level statement ends early at {line!r}"


def test_runner_command_line() -> None:
    assert PowerShellRunner().argv() == ["powershell.exe", "-NoProfile", "-NonInteractive", "-Command", "-"]


async def test_runner_passes_arguments_in_the_environment_and_reads_the_marker_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A stand-in powershell.exe: checks its command line, echoes back the JSON document it was given.
    fake = tmp_path / "powershell.exe"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        "assert sys.argv[1:] == ['-NoProfile', '-NonInteractive', '-Command', '-'], sys.argv\n"
        "text = sys.stdin.read()\n"
        "assert text.startswith('& {') and text.endswith('\\n\\n')\n"
        f"args = json.loads(os.environ['{ARGS_ENV}'])\n"
        "print('WARNING: some console noise')\n"
        f"print('{MARKER}' + json.dumps({{'ok': True, 'value': args}}))\n"
    )
    fake.chmod(0o755)
    script = Script(name="echo", body="$a.name\n$a.path", args=("name", "path"))
    tricky = {"name": "vz-'; Remove-VM * #", "path": 'C:\\Users\\dév\\"x"'}
    answer = await PowerShellRunner(str(fake)).run(script, tricky, timeout=30)
    assert answer == tricky
    with pytest.raises(RuntimeFailureError, match="wrong arguments"):
        await PowerShellRunner(str(fake)).run(script, {"name": "x"}, timeout=30)


async def test_runner_bounds_a_script_with_its_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vz_core.errors import RuntimeTimeoutError

    fake = tmp_path / "powershell.exe"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeTimeoutError, match=r"did not finish within 0\.3 s"):
        await PowerShellRunner(str(fake)).run(ps.PROBE, {}, timeout=0.3)


async def test_runner_without_powershell_says_what_is_needed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnavailableError, match="Windows PowerShell"):
        await PowerShellRunner(str(tmp_path / "missing.exe")).run(ps.PROBE, {}, timeout=5)


def _line(doc: object) -> bytes:
    return (MARKER + json.dumps(doc)).encode()


def test_answers_are_parsed_from_the_json_line_only() -> None:
    s = ps.PROBE
    assert parse_answer(s, b"Name State\n---- -----\n" + _line({"ok": True, "value": [1, 2]})) == [1, 2]
    with pytest.raises(RuntimeFailureError, match="gave no answer"):
        parse_answer(s, b"Name  State\nvz-1  Running\n", b"some error")
    with pytest.raises(RuntimeFailureError, match="malformed JSON"):
        parse_answer(s, MARKER.encode() + b"{not json")
    with pytest.raises(RuntimeFailureError, match="envelope"):
        parse_answer(s, _line([1]))


def test_powershell_errors_are_classified_by_category_not_by_message() -> None:
    def err(category: str, error_id: str = "X") -> bytes:
        return _line({"ok": False, "error": {"message": "boom", "id": error_id, "category": category}})

    with pytest.raises(PermissionDeniedError, match="Hyper-V Administrators"):
        parse_answer(ps.START, err("PermissionDenied"))
    with pytest.raises(NotFoundError):
        parse_answer(ps.START, err("ObjectNotFound"))
    with pytest.raises(UnavailableError):
        parse_answer(ps.START, err("ResourceUnavailable"))
    with pytest.raises(ScriptError) as info:
        parse_answer(ps.START, err("InvalidOperation", "InvalidState,Microsoft.HyperV.PowerShell.Commands.StartVM"))
    assert info.value.error_id.startswith("InvalidState") and info.value.details["script"] == "start"


def test_vm_answers_are_typed() -> None:
    value = {
        "Name": "vz-k",
        "Id": "6A7351C8-59BE-51F6-8AEA-C158E159908D",
        "State": "Running",
        "Status": "ok",
        "UptimeSeconds": 3,
        "ProcessorCount": 2,
        "MemoryStartup": 1073741824,
        "Generation": 2,
    }
    state = ps.parse_state("state", value)
    assert state is not None and state.running and state.id == "6a7351c8-59be-51f6-8aea-c158e159908d"
    assert ps.parse_state("state", None) is None
    for field, bad in (("Id", "not-a-guid"), ("State", 2), ("ProcessorCount", True), ("UptimeSeconds", "3")):
        with pytest.raises(RuntimeFailureError, match=field):
            ps.parse_state("state", {**value, field: bad})


def test_probe_answers_are_typed_and_take_both_array_shapes() -> None:
    base = {
        "Module": True,
        "ModuleVersion": "2.0.0.0",
        "Elevated": False,
        "HyperVAdministrator": True,
        "User": "H\\u",
        "PSVersion": "5.1",
        "MemoryCapacity": 1 << 34,
        "LogicalProcessorCount": 8,
    }
    assert ps.parse_probe({**base, "Switches": "Default Switch"}).switches == ("Default Switch",)
    assert ps.parse_probe({**base, "Switches": ["a", "b"]}).switches == ("a", "b")
    assert ps.parse_probe({**base, "Switches": None}).switches == ()
    with pytest.raises(RuntimeFailureError, match="Elevated"):
        ps.parse_probe({**base, "Elevated": "yes", "Switches": []})


def test_vsock_service_guids() -> None:
    assert ps.service_id(0x5A56) == "00005a56-facb-11e6-bd58-64006a7986d3"
    assert ps.service_id(0x7FFFFFFF).startswith("7fffffff-")
    for bad in (0, -1, 0xFFFFFFFF):
        with pytest.raises(ValueError):
            ps.service_id(bad)


# ---------------------------------------------------------------------------------------------- SMB shares


def test_the_share_scripts_call_the_documented_smb_cmdlets() -> None:
    used = {(c.cmdlet, p) for s in (ps.SHARE, ps.UNSHARE) for c in calls(script_text(s)) for p in c.params}
    for expected in [
        ("New-SmbShare", "ReadAccess"),
        ("New-SmbShare", "ChangeAccess"),
        ("New-SmbShare", "Temporary"),
        ("New-SmbShare", "EncryptData"),
        ("Remove-SmbShare", "Force"),
        ("Get-SmbShareAccess", "Name"),
        ("New-LocalUser", "Password"),
        ("Set-LocalUser", "Password"),
        ("Disable-LocalUser", "Name"),
        ("Remove-LocalUser", "Name"),
        ("ConvertTo-SecureString", "AsPlainText"),
        ("New-NetFirewallRule", "InterfaceAlias"),
        ("New-NetFirewallRule", "RemoteAddress"),
        ("Remove-NetFirewallRule", "Name"),
    ]:
        assert expected in used, expected
    share = script_text(ps.SHARE)
    # Read-only is a share with Read access alone: no script ever grants Full, nor to anyone but the account.
    assert "-FullAccess" not in share and "-ReadAccess $qualified" in share and "-ChangeAccess $qualified" in share
    # The password is read once, into a SecureString; the answer never carries it.
    assert ps.SHARE.body.count("$a.password") == 1
    assert "ConvertTo-SecureString -String $a.password -AsPlainText -Force" in share
    # Every name the scripts act on is checked against vz's patterns before anything is touched.
    for script in (ps.SHARE, ps.UNSHARE):
        text = script_text(script)
        assert text.index("-notmatch '^vz-[0-9a-f]{16}$'") < text.index("Get-LocalUser")


def test_share_answers_are_typed_and_take_both_array_shapes() -> None:
    access = {"AccountName": "DEVBOX\\vz-0123456789abcdef", "AccessRight": "Read", "AccessControlType": "Allow"}
    one = {
        "Account": "DEVBOX\\vz-0123456789abcdef",
        "User": "vz-0123456789abcdef",
        "Domain": "DEVBOX",
        "HostAddress": "172.20.96.1",
        "Shares": {"Name": "vz-" + "a" * 32 + "-0$", "Path": "C:\\src", "Access": access},
        "Replaced": None,
    }
    made = ps.parse_shares(one)
    assert made.shares[0].access == (ps.ShareAccess("DEVBOX\\vz-0123456789abcdef", "Read", "Allow"),)
    assert made.replaced == () and made.host_address == "172.20.96.1"
    two = ps.parse_shares({**one, "Shares": [one["Shares"], one["Shares"]], "Replaced": "vz-x-0$"})
    assert len(two.shares) == 2 and two.replaced == ("vz-x-0$",)
    for bad in ({**one, "HostAddress": "fe80::1"}, {**one, "HostAddress": ""}, {**one, "Shares": [1]}):
        with pytest.raises(RuntimeFailureError, match="unexpected"):
            ps.parse_shares(bad)
    assert ps.parse_unshare({"RemovedShares": None, "RemovedRule": False, "Account": "absent"}).removed_shares == ()
    with pytest.raises(RuntimeFailureError, match="Account"):
        ps.parse_unshare({"RemovedShares": [], "RemovedRule": False, "Account": "deleted"})
    listing = ps.parse_share_listing(
        {"Shares": None, "Accounts": {"Name": "vz-1", "Description": "d", "Enabled": True}}
    )
    assert listing.shares == () and listing.accounts == (("vz-1", "d"),)


def test_share_names_access_checks_and_orphans(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vz_drivers._machine import MountRecord
    from vz_drivers.hyperv import _shares as sh

    key = "0123456789abcdef" * 2
    mounts = [
        MountRecord("bind", "/src", "/w", False, "/src", ()),
        MountRecord("tmpfs", "", "/t", False, "", ()),
        MountRecord("volume", "cache", "/c", True, "/state/volumes/cache/data", ()),
    ]
    names = sh.machine_shares(key, mounts, tmp_path)
    assert [(s.name, s.path, s.read_only) for s in names.shares] == [
        (f"vz-{key}-0$", "/src", False),
        (f"vz-{key}-1$", "/state/volumes/cache/data", True),
    ]
    assert names.account == "vz-0123456789abcdef" and len(names.account) <= 20  # a Windows account name's limit
    with pytest.raises(ValueError):
        sh.machine_shares("../x", mounts, tmp_path)

    def made(*rights: tuple[str, str]) -> ps.SharesMade:
        shares = tuple(
            ps.SharedDir(s.name, s.path, (ps.ShareAccess(acct, right, "Allow"),))
            for s, (acct, right) in zip(names.shares, rights, strict=True)
        )
        return ps.SharesMade("DEVBOX\\" + names.account, names.account, "DEVBOX", "10.0.0.1", shares, ())

    me = "devbox\\" + names.account  # Windows compares account names without case
    sh.check_access(made((me, "Change"), (me, "Read")), names)
    for wrong in [
        ((me, "Change"), (me, "Change")),
        ((me, "Full"), (me, "Read")),
        ((me, "Change"), ("Everyone", "Read")),
    ]:
        with pytest.raises(RuntimeFailureError, match="refusing to boot"):
            sh.check_access(made(*wrong), names)

    tag = sh.state_tag(tmp_path)
    desc = sh.describe(key, tag)
    assert len(desc) == sh.DESCRIPTION_MAX == len(names.description)
    other = "f" * 32
    found = sh.orphans(
        [(f"vz-{key}-0$", "/src", desc), (f"vz-{other}-0$", "/x", sh.describe(other, "000000000000"))],
        [(names.account, desc), ("vz-ffffffffffffffff", "someone else's account")],
        tag,
        exists=set(),
    )
    assert found == {key}  # another vz home's share and an account vz did not describe are left alone
    assert sh.orphans([(f"vz-{key}-0$", "/src", desc)], [], tag, exists={key}) == set()

    password = sh.generate_password()
    assert len(password) == 32 and password.isalnum() and password != sh.generate_password()
    options = sh.mount_options(made((me, "Change"), (me, "Read")), names.shares[1], uid=1000, gid=1000)
    assert options.startswith("ro,vers=3.1.1,seal,") and "password" not in options and "uid=1000" in options
    assert sh.redact(f"failed for {password} twice: {password}", password) == "failed for *** twice: ***"
