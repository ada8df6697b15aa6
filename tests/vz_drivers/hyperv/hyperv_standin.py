"""A stand-in for Windows PowerShell + Hyper-V: checks every script it is given, answers like the real host.

``StandInHyperV.run`` first checks the complete text the real runner would send (``script_text``): every cmdlet
call must be documented and fit one of its documented parameter sets (``hyperv_docs``), the arguments must be
exactly the ones the script reads, and they must survive a JSON round trip (they travel as a JSON document in
an environment variable). Then it applies the script's documented effect to a model of one Hyper-V host (VMs
with Id/State/ProcessorCount/MemoryStartup/Generation, the GuestCommunicationServices registry keys) and answers
the envelope the script's own code would print, decoded the way ``parse_answer`` decodes the real line.

Knobs: ``elevated``/``hyperv_admin``/``module`` (the probe), ``switches``, ``guest_shuts_down`` (whether the guest
honours a graceful Stop-VM; if not, Stop-VM blocks until the runner's timeout, like the real cmdlet waiting for
the guest), ``fail`` (script name -> PowerShell error to raise once), and ``calls`` (what ran, in order).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hyperv_docs import check_text

from vz_core.errors import RuntimeTimeoutError
from vz_drivers.hyperv._host import HostSupport
from vz_drivers.hyperv._ps import MARKER, Script, check_args, parse_answer, script_text
from vz_drivers.hyperv._scripts import GCS_KEY

_ARG_TYPES: dict[str, type] = {"memory_bytes": int, "cpus": int, "paths": list, "shares": list, "remove_account": bool}
"""Arguments that are not strings: numbers the scripts cast ([int64]), lists they iterate, flags."""
_PREFIX_RE = re.compile(r"^vz-[0-9a-f]{32}-\Z")
_ACCOUNT_RE = re.compile(r"^vz-[0-9a-f]{16}\Z")
_RULE_RE = re.compile(r"^vz-[0-9a-f]{32}-smb\Z")
_SHARE_RE = re.compile(r"^vz-[0-9a-f]{32}-[0-9]+\$\Z")
COMPUTER = "DEVBOX"
WINDOWS = HostSupport(system="Windows", architecture="amd64", reason="")
"""What the backend believes about the host in these tests: Windows on amd64, with Hyper-V."""
_SERVICE_RE = re.compile(r"^[0-9a-f]{8}-facb-11e6-bd58-64006a7986d3\Z")


@dataclass
class FakeVm:
    name: str
    id: str
    path: str
    memory: int
    switch: str
    state: str = "Off"
    cpus: int = 1
    dynamic_memory: bool = True
    secure_boot: str = "On"
    template: str = "MicrosoftWindows"
    disks: list[str] = field(default_factory=list)
    com1: str = ""
    first_boot: str = ""
    notes: str = ""
    automatic_checkpoints: bool = True


@dataclass
class FakeAccount:
    password: str
    description: str
    sid: str
    enabled: bool = True


@dataclass
class FakeShare:
    path: str
    description: str
    access: list[tuple[str, str, str]]
    """Get-SmbShareAccess: (AccountName, AccessRight, AccessControlType)."""
    temporary: bool
    encrypt: bool


@dataclass
class PsError(Exception):
    message: str
    category: str = "InvalidOperation"
    error_id: str = "Microsoft.HyperV.PowerShell.Commands.Fake"


class StandInHyperV:
    def __init__(
        self,
        *,
        elevated: bool = True,
        hyperv_admin: bool = True,
        module: bool = True,
        switches: tuple[str, ...] = ("Default Switch",),
        guest_shuts_down: bool = True,
    ) -> None:
        self.elevated = elevated
        self.hyperv_admin = hyperv_admin
        self.module = module
        self.switches = switches
        self.guest_shuts_down = guest_shuts_down
        self.vms: dict[str, FakeVm] = {}
        self.registry: dict[str, str] = {}
        self.fail: dict[str, PsError] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.forced: list[str] = []
        """VMs turned off while running (TURN_OFF, or REMOVE of a running VM)."""
        self.checked: dict[str, int] = {}
        # SMB: local accounts, shares, directory ACEs (path -> sid -> rights), firewall rules, host addresses.
        self.accounts: dict[str, FakeAccount] = {}
        self.shares: dict[str, FakeShare] = {}
        self.aces: dict[str, dict[str, str]] = {}
        self.firewall: dict[str, dict[str, str]] = {}
        self.addresses: dict[str, str] = {"vEthernet (Default Switch)": "172.20.96.1"}
        self.smb_events: list[str] = []
        self.extra_access: tuple[str, str, str] | None = None
        """An access entry Windows would add to every new share (a host policy): the driver must refuse it."""
        self.echo_password = False
        """Fail SHARE with a message that quotes the password (a cmdlet echoing its input): it must be redacted."""

    # ------------------------------------------------------------------ the runner protocol

    async def run(self, script: Script, args: Mapping[str, Any], *, timeout: float) -> Any:  # noqa: ASYNC109
        check_args(script, args)
        text = script_text(script)
        self.checked[script.name] = len(check_text(text))
        for name, value in args.items():
            kind = _ARG_TYPES.get(name, str)
            assert type(value) is kind, f"{script.name}: argument {name} is {type(value).__name__}, not {kind.__name__}"
        decoded = json.loads(json.dumps(dict(args), ensure_ascii=True))
        assert decoded == dict(args), f"arguments of {script.name} do not survive JSON: {args!r}"
        self.calls.append((script.name, decoded))
        await asyncio.sleep(0)
        try:
            failure = self.fail.pop(script.name, None)
            if failure is not None:
                raise failure
            value = await getattr(self, "_" + script.name.replace("-", "_"))(decoded, timeout)
            envelope: dict[str, Any] = {"ok": True, "value": value}
        except PsError as exc:
            envelope = {
                "ok": False,
                "error": {"message": exc.message, "id": exc.error_id, "category": exc.category, "type": "Fake"},
            }
        line = MARKER + json.dumps(envelope, separators=(",", ":"), ensure_ascii=True)
        return parse_answer(script, b"noise before the answer\r\n" + line.encode() + b"\r\n", b"")

    # ------------------------------------------------------------------ model

    def _find(self, args: Mapping[str, Any]) -> FakeVm | None:
        if args.get("id"):
            return next((vm for vm in self.vms.values() if vm.id == args["id"]), None)
        return self.vms.get(args["name"])

    @staticmethod
    def _value(vm: FakeVm | None) -> dict[str, Any] | None:
        if vm is None:
            return None
        return {
            "Name": vm.name,
            "Id": vm.id,
            "State": vm.state,
            "Status": "Operating normally",
            "UptimeSeconds": 12.5 if vm.state == "Running" else 0,
            "ProcessorCount": vm.cpus,
            "MemoryStartup": vm.memory,
            "Generation": 2,
        }

    async def _probe(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        allowed = self.module and (self.elevated or self.hyperv_admin)
        return {
            "Module": self.module,
            "ModuleVersion": "2.0.0.0" if self.module else "",
            "Elevated": self.elevated,
            "HyperVAdministrator": self.hyperv_admin,
            "User": "HOST\\developer",
            # PowerShell 5.1 unrolls one-element arrays in ConvertTo-Json: the parser must take both shapes.
            "Switches": (self.switches[0] if len(self.switches) == 1 else list(self.switches)) if allowed else [],
            "PSVersion": "5.1.22621.4249",
            "MemoryCapacity": 16 * 1024**3 if allowed else 0,
            "LogicalProcessorCount": 8 if allowed else 0,
        }

    async def _state(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        return self._value(self._find(args))

    def _require_admin(self) -> None:
        if not (self.elevated or self.hyperv_admin):
            raise PsError("You do not have the required permission to complete this task.", "PermissionDenied")

    async def _create(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        self._require_admin()
        if not _SERVICE_RE.match(args["service_id"]):
            raise PsError(f"not a vsock service GUID: {args['service_id']}")
        if args["name"] in self.vms:
            raise PsError(f"a VM named {args['name']} already exists")
        if args["memory_bytes"] % (2 * 1024 * 1024):
            raise PsError("Startup memory must be a multiple of 2 MB", "InvalidArgument")
        if args["switch"] and args["switch"] not in self.switches:
            raise PsError(f'Unable to find a virtual switch with name "{args["switch"]}".', "ObjectNotFound")
        vm = FakeVm(args["name"], str(uuid.uuid4()), args["path"], args["memory_bytes"], args["switch"])
        self.vms[vm.name] = vm
        vm.cpus = int(args["cpus"])
        vm.dynamic_memory = False
        if args["secure_boot_template"]:
            vm.secure_boot, vm.template = "On", args["secure_boot_template"]
        else:
            vm.secure_boot = "Off"
        vm.automatic_checkpoints = False
        vm.notes = args["notes"]
        vm.com1 = args["com_pipe"]
        vm.disks.append(args["disk"])
        vm.first_boot = args["disk"]
        if not self.elevated:
            # Hyper-V Administrators may create VMs, but HKLM is for elevated processes only.
            raise PsError(
                f"Requested registry access is not allowed. ({GCS_KEY})",
                "PermissionDenied",
                "System.Security.SecurityException",
            )
        self.registry[args["service_id"]] = args["service_name"]
        return self._value(vm)

    async def _start(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is None:
            raise PsError(f"VM {args['name']} does not exist")
        vm.state = "Running"
        return self._value(vm)

    async def _stop(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None and vm.state != "Off":
            if not self.guest_shuts_down:
                # Stop-VM waits for the guest; the runner kills PowerShell at its timeout.
                await asyncio.sleep(timeout)
                raise RuntimeTimeoutError(f"Hyper-V script 'stop' did not finish within {timeout:g} s")
            vm.state = "Off"
        return self._value(vm)

    async def _turn_off(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None:
            if vm.state != "Off":
                self.forced.append(vm.name)
            vm.state = "Off"
        return self._value(vm)

    async def _remove(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        removed_vm = removed_service = False
        if vm is not None:
            self._require_admin()
            if vm.state != "Off":
                self.forced.append(vm.name)
            vm.state = "Off"
            del self.vms[vm.name]
            removed_vm = True
        if _SERVICE_RE.match(args["service_id"]) and args["service_id"] in self.registry:
            if not self.elevated:
                raise PsError("Requested registry access is not allowed.", "PermissionDenied")
            del self.registry[args["service_id"]]
            removed_service = True
        return {"RemovedVm": removed_vm, "RemovedService": removed_service}

    # ------------------------------------------------------------------ SMB shares

    def _share_checks(self, args: Mapping[str, Any]) -> tuple[FakeAccount | None, list[str], bool]:
        """The common head of SHARE and UNSHARE: name checks, then this Machine's leftovers removed."""
        if not _PREFIX_RE.match(args["prefix"]):
            raise PsError(f"not a vz share prefix: {args['prefix']}")
        if not _ACCOUNT_RE.match(args["account"]):
            raise PsError(f"not a vz share account: {args['account']}")
        if not _RULE_RE.match(args["rule"]):
            raise PsError(f"not a vz firewall rule name: {args['rule']}")
        if not self.elevated:
            raise PsError("Access is denied.", "PermissionDenied", "Windows System Error 5,Get-SmbShare")
        user = self.accounts.get(args["account"])
        removed = []
        for name in [n for n in self.shares if n.startswith(args["prefix"])]:
            share = self.shares.pop(name)
            if user is not None:
                self.aces.get(share.path, {}).pop(user.sid, None)
            removed.append(name)
            self.smb_events.append(f"remove-share {name}")
        for path in args["paths"]:
            if user is not None:
                self.aces.get(path, {}).pop(user.sid, None)
        removed_rule = self.firewall.pop(args["rule"], None) is not None
        return user, removed, removed_rule

    async def _share(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        user, removed, _ = self._share_checks(args)
        password = args["password"]
        if self.echo_password:
            raise PsError(f"Set-LocalUser: the value {password} was refused", "InvalidArgument")
        if len(password) < 14 or not (any(c.isupper() for c in password) and any(c.isdigit() for c in password)):
            raise PsError("The password does not meet the password policy requirements.", "InvalidArgument")
        if len(args["description"]) > 48:  # New-LocalUser -Description: at most 48 characters
            raise PsError("Cannot validate argument on parameter 'Description'.", "InvalidData")
        if user is None:
            user = FakeAccount(password, args["description"], f"S-1-5-21-1-2-3-{1000 + len(self.accounts)}")
            self.accounts[args["account"]] = user
        else:
            user.password, user.enabled = password, True
        qualified = f"{COMPUTER}\\{args['account']}"
        alias = f"vEthernet ({args['switch']})"
        if alias not in self.addresses:
            raise PsError(f"the host has no IPv4 address on {alias}, the switch the guest reaches the shares on")
        self.firewall[args["rule"]] = {"alias": alias, "port": "445", "remote": "LocalSubnet"}
        made = []
        for item in args["shares"]:
            name = item["name"]
            if not (name.startswith(args["prefix"]) and _SHARE_RE.match(name)):
                raise PsError(f"not a vz share name: {name}")
            if not os.path.isdir(item["path"]):  # noqa: ASYNC240 - a model, not I/O worth a thread
                raise PsError(f"the shared directory {item['path']} does not exist")
            right = "Read" if item["read_only"] else "Change"
            access_list = [(qualified, right, "Allow")] + ([self.extra_access] if self.extra_access else [])
            self.shares[name] = FakeShare(item["path"], args["description"], access_list, True, True)
            self.aces.setdefault(item["path"], {})[user.sid] = "ReadAndExecute" if item["read_only"] else "Modify"
            self.smb_events.append(f"new-share {name}")
            access = [
                {"AccountName": a, "AccessRight": r, "AccessControlType": t} for a, r, t in self.shares[name].access
            ]
            # ConvertTo-Json writes a one-element array as its element: the parser must take both shapes.
            made.append({"Name": name, "Path": item["path"], "Access": access[0] if len(access) == 1 else access})
        return {
            "Account": qualified,
            "User": args["account"],
            "Domain": COMPUTER,
            "HostAddress": self.addresses[alias],
            "Shares": made[0] if len(made) == 1 else made,
            "Replaced": removed,
        }

    async def _unshare(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        user, removed, removed_rule = self._share_checks(args)
        state = "absent"
        if user is not None:
            if args["remove_account"]:
                del self.accounts[args["account"]]
                state = "removed"
            else:
                user.enabled = False
                state = "disabled"
        return {"RemovedShares": removed, "RemovedRule": removed_rule, "Account": state}

    async def _list_shares(self, args: Mapping[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        shares = [
            {"Name": n, "Path": sh.path, "Description": sh.description}
            for n, sh in self.shares.items()
            if _SHARE_RE.match(n)
        ]
        accounts = [
            {"Name": n, "Description": u.description, "Enabled": u.enabled}
            for n, u in self.accounts.items()
            if _ACCOUNT_RE.match(n)
        ]
        return {"Shares": shares or None, "Accounts": accounts[0] if len(accounts) == 1 else accounts}
