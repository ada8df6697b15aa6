"""The PowerShell scripts of the hyperv driver and their typed answers.

Each script is fixed text reading its arguments from ``$a`` (see ``vz_drivers.hyperv._ps``); the cmdlets are
those of the documented Hyper-V module (``New-VM -Generation 2``, ``Set-VMProcessor -Count``,
``Set-VMMemory -StartupBytes -DynamicMemoryEnabled``, ``Set-VMFirmware -EnableSecureBoot`` /
``-SecureBootTemplate`` / ``-FirstBootDevice``, ``Add-VMHardDiskDrive``, ``Set-VMComPort``, ``Set-VM``,
``Start-VM``, ``Stop-VM`` (graceful, and ``-TurnOff``), ``Remove-VM``, ``Get-VM``) plus the registry provider for
the Hyper-V socket service of each Machine; for shares the SmbShare (``New-SmbShare``, ``Get-SmbShare``,
``Get-SmbShareAccess``, ``Remove-SmbShare``), LocalAccounts (``New-/Set-/Enable-/Disable-/Remove-LocalUser``),
NetSecurity (``New-/Get-/Remove-NetFirewallRule``) and NetTCPIP (``Get-NetIPAddress``) modules. Parameters are
always named (never positional) and never splatted, so a reader and the tests' stand-in see exactly which
parameter set each call uses.

Answers are objects built in the script with explicit string/number fields (``State`` as its name, ``Id`` as a
GUID string), never PowerShell's own serialization of a VM object, and parsed into the dataclasses below;
anything else is a ``RuntimeFailureError`` naming the script and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vz_core.errors import RuntimeFailureError
from vz_drivers.hyperv._ps import Script

__all__ = [
    "CREATE",
    "GCS_KEY",
    "LIST_SHARES",
    "PROBE",
    "REMOVE",
    "SCRIPTS",
    "SHARE",
    "SMB_PORT",
    "START",
    "STATE",
    "STOP",
    "TURN_OFF",
    "UNSHARE",
    "VSOCK_TEMPLATE",
    "HostProbe",
    "Removal",
    "ShareAccess",
    "ShareListing",
    "SharedDir",
    "SharesMade",
    "Unshared",
    "VmState",
    "parse_probe",
    "parse_removal",
    "parse_share_listing",
    "parse_shares",
    "parse_state",
    "parse_unshare",
    "service_id",
]

GCS_KEY = r"HKLM:\SOFTWARE\Microsoft\Windows NT\CurrentVersion\Virtualization\GuestCommunicationServices"
"""Where Hyper-V socket services are registered (one subkey per service GUID, value ``ElementName``)."""
SMB_PORT = 445
"""The port Windows' SMB server listens on (the guest mounts the shares there)."""
VSOCK_TEMPLATE = "-facb-11e6-bd58-64006a7986d3"
"""The tail of the service GUIDs that Linux guests reach as AF_VSOCK ports: ``<port:08x>-facb-11e6-...``."""
_SERVICE_RE = re.compile(r"^[0-9a-f]{8}-facb-11e6-bd58-64006a7986d3\Z")


def service_id(port: int) -> str:
    """The Hyper-V socket service GUID of AF_VSOCK port ``port`` in a Linux guest."""
    if not 0 < port < 0xFFFFFFFF:
        raise ValueError(f"vsock port {port} out of range")
    return f"{port:08x}{VSOCK_TEMPLATE}"


# A VM's state as the driver reads it: explicit fields, State by name (VMState enum), Id as a GUID string.
_VM_VALUE = """
function vz_vm($vm) {
  if ($null -eq $vm) { return $null }
  return @{ Name = [string]$vm.Name; Id = [string]$vm.Id; State = [string]$vm.State; Status = [string]$vm.Status;
    UptimeSeconds = [double]$vm.Uptime.TotalSeconds; ProcessorCount = [int]$vm.ProcessorCount;
    MemoryStartup = [int64]$vm.MemoryStartup; Generation = [int]$vm.Generation }
}
"""

_FIND_VM = """
if ($a.id) {
  $vm = Get-VM -Id $a.id -ErrorAction SilentlyContinue
} else {
  $vm = Get-VM -Name $a.name -ErrorAction SilentlyContinue
}
if (@($vm).Count -gt 1) {
  throw "more than one VM is named $($a.name); remove the duplicates in Hyper-V Manager"
}
"""

PROBE = Script(
    name="probe",
    body="""
$identity = [Security.Principal.WindowsIdentity]::GetCurrent()
$principal = New-Object -TypeName Security.Principal.WindowsPrincipal -ArgumentList $identity
$elevated = $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)
$hvAdmin = $principal.IsInRole([Security.Principal.SecurityIdentifier]::new('S-1-5-32-578'))
$module = @(Get-Module -ListAvailable -Name Hyper-V)
$version = ''
if ($module.Count -gt 0) { $version = [string]$module[0].Version }
$switches = @()
$memory = [int64]0
$cpus = 0
if ($module.Count -gt 0 -and ($elevated -or $hvAdmin)) {
  $switches = @(Get-VMSwitch | ForEach-Object -Process { [string]$_.Name })
  $vmHost = Get-VMHost
  $memory = [int64]$vmHost.MemoryCapacity
  $cpus = [int]$vmHost.LogicalProcessorCount
}
@{ Module = ($module.Count -gt 0); ModuleVersion = $version; Elevated = [bool]$elevated
  HyperVAdministrator = [bool]$hvAdmin; MemoryCapacity = $memory; LogicalProcessorCount = $cpus
  User = [string]$identity.Name; Switches = $switches; PSVersion = [string]$PSVersionTable.PSVersion }
""",
)

STATE = Script(name="state", args=("name", "id"), body=_VM_VALUE + _FIND_VM + "vz_vm $vm\n")

CREATE = Script(
    name="create",
    args=(
        "name",
        "path",
        "disk",
        "memory_bytes",
        "cpus",
        "switch",
        "secure_boot_template",
        "com_pipe",
        "notes",
        "service_id",
        "service_name",
    ),
    body=_VM_VALUE
    + f"""
if ($a.service_id -notmatch '^[0-9a-f]{{8}}-facb-11e6-bd58-64006a7986d3$') {{
  throw "not a vsock service GUID: $($a.service_id)"
}}
if (@(Get-VM -Name $a.name -ErrorAction SilentlyContinue).Count -gt 0) {{
  throw "a VM named $($a.name) already exists"
}}
$memory = [int64]$a.memory_bytes
if ($a.switch) {{
  $vm = New-VM -Name $a.name -Generation 2 -MemoryStartupBytes $memory -NoVHD -Path $a.path -SwitchName $a.switch
}} else {{
  $vm = New-VM -Name $a.name -Generation 2 -MemoryStartupBytes $memory -NoVHD -Path $a.path
}}
Set-VMProcessor -VMName $a.name -Count ([int64]$a.cpus)
Set-VMMemory -VMName $a.name -DynamicMemoryEnabled $false -StartupBytes $memory
if ($a.secure_boot_template) {{
  Set-VMFirmware -VMName $a.name -EnableSecureBoot On -SecureBootTemplate $a.secure_boot_template
}} else {{
  Set-VMFirmware -VMName $a.name -EnableSecureBoot Off
}}
Set-VM -Name $a.name -AutomaticCheckpointsEnabled $false -Notes $a.notes
Set-VM -Name $a.name -AutomaticStartAction Nothing -AutomaticStopAction ShutDown
Set-VMComPort -VMName $a.name -Number 1 -Path $a.com_pipe
$drive = Add-VMHardDiskDrive -VMName $a.name -ControllerType SCSI -Path $a.disk -Passthru
Set-VMFirmware -VMName $a.name -FirstBootDevice $drive
$key = Join-Path -Path '{GCS_KEY}' -ChildPath $a.service_id
New-Item -Path $key -Force | Out-Null
New-ItemProperty -Path $key -Name ElementName -Value $a.service_name -PropertyType String -Force | Out-Null
vz_vm (Get-VM -Id $vm.Id)
""",
)

START = Script(
    name="start",
    args=("name", "id"),
    body=_VM_VALUE
    + _FIND_VM
    + """
if ($null -eq $vm) { throw "VM $($a.name) does not exist" }
if ([string]$vm.State -ne 'Running') { Start-VM -Name $vm.Name }
vz_vm (Get-VM -Id $vm.Id)
""",
)


def _stop(name: str, flags: str) -> Script:
    return Script(
        name=name,
        args=("name", "id"),
        body=_VM_VALUE
        + _FIND_VM
        + f"""
if ($null -ne $vm -and [string]$vm.State -ne 'Off') {{ Stop-VM -Name $vm.Name {flags} }}
if ($null -ne $vm) {{ vz_vm (Get-VM -Id $vm.Id) }} else {{ $null }}
""",
    )


STOP = _stop("stop", "-Force")
"""Graceful: the guest's shutdown integration service powers it off (the host bounds the wait, then TURN_OFF)."""
TURN_OFF = _stop("turn-off", "-TurnOff -Force")

REMOVE = Script(
    name="remove",
    args=("name", "id", "service_id"),
    body=_FIND_VM
    + f"""
$removedVm = $false
if ($null -ne $vm) {{
  if ([string]$vm.State -ne 'Off') {{ Stop-VM -Name $vm.Name -TurnOff -Force }}
  Remove-VM -Name $vm.Name -Force
  $removedVm = $true
}}
$removedService = $false
if ($a.service_id -match '^[0-9a-f]{{8}}-facb-11e6-bd58-64006a7986d3$') {{
  $key = Join-Path -Path '{GCS_KEY}' -ChildPath $a.service_id
  if (Test-Path -Path $key) {{ Remove-Item -Path $key -Recurse -Force; $removedService = $true }}
}}
@{{ RemovedVm = $removedVm; RemovedService = $removedService }}
""",
)

# ------------------------------------------------------------------------------------------ SMB shares
#
# A Machine's shares are named ``vz-<key>-<n>$`` (hidden: no browse list shows them), open to one local account
# per Machine, ``vz-<key[:16]>`` (a Windows account name has at most 20 characters). Its password is new at
# every boot and travels only as data (VZ_HYPERV_ARGS -> ConvertTo-SecureString). A read-only mount is a share
# with Read access only (and a ReadAndExecute ACE on the directory): the SMB server refuses writes, whatever
# the guest mounts. Every script checks the names it is given against these patterns before touching anything.


def _joined(text: str) -> str:
    """Script text whose lines ending in `` ^`` continue on the next one (PowerShell gets one line)."""
    return re.sub(r" \^\n[ \t]*", " ", text)


_SHARE_CHECKS = r"""
if ($a.prefix -notmatch '^vz-[0-9a-f]{32}-$') { throw "not a vz share prefix: $($a.prefix)" }
if ($a.account -notmatch '^vz-[0-9a-f]{16}$') { throw "not a vz share account: $($a.account)" }
if ($a.rule -notmatch '^vz-[0-9a-f]{32}-smb$') { throw "not a vz firewall rule name: $($a.rule)" }
function vz_purge($path, $sid) {
  if ($null -eq $sid -or -not $path) { return $false }
  if (-not (Test-Path -LiteralPath $path -PathType Container)) { return $false }
  $dir = Get-Item -LiteralPath $path
  $acl = $dir.GetAccessControl('Access')
  $acl.PurgeAccessRules($sid)
  $dir.SetAccessControl($acl)
  return $true
}
$user = Get-LocalUser -Name $a.account -ErrorAction SilentlyContinue
$sid = $null
if ($null -ne $user) { $sid = $user.SID }
$removed = @()
$old = @(Get-SmbShare | Where-Object -FilterScript { ([string]$_.Name).StartsWith($a.prefix) })
foreach ($s in $old) {
  vz_purge ([string]$s.Path) $sid | Out-Null
  Remove-SmbShare -Name $s.Name -Force
  $removed += [string]$s.Name
}
foreach ($p in @($a.paths)) { vz_purge ([string]$p) $sid | Out-Null }
$removedRule = $false
if (@(Get-NetFirewallRule -Name $a.rule -ErrorAction SilentlyContinue).Count -gt 0) {
  Remove-NetFirewallRule -Name $a.rule
  $removedRule = $true
}
"""

SHARE = Script(
    name="share",
    args=("prefix", "account", "password", "description", "rule", "switch", "paths", "shares"),
    depth=8,
    body=_SHARE_CHECKS
    + _joined(r"""
$secret = ConvertTo-SecureString -String $a.password -AsPlainText -Force
if ($null -eq $user) {
  $user = New-LocalUser -Name $a.account -Password $secret -Description $a.description ^
    -AccountNeverExpires -PasswordNeverExpires -UserMayNotChangePassword
  $sid = $user.SID
} else {
  Set-LocalUser -Name $a.account -Password $secret
  Enable-LocalUser -Name $a.account
}
$qualified = $env:COMPUTERNAME + '\' + $a.account
$alias = 'vEthernet (' + $a.switch + ')'
$address = @(Get-NetIPAddress -InterfaceAlias $alias -AddressFamily IPv4 -ErrorAction SilentlyContinue)
if ($address.Count -eq 0) { throw "the host has no IPv4 address on $alias, the switch the guest reaches the shares on" }
New-NetFirewallRule -Name $a.rule -DisplayName $a.rule -Description $a.description -Direction Inbound ^
  -Action Allow -Protocol TCP -LocalPort 445 -InterfaceAlias $alias -RemoteAddress LocalSubnet -Profile Any | Out-Null
$made = @()
foreach ($s in @($a.shares)) {
  if (-not ([string]$s.name).StartsWith($a.prefix) -or [string]$s.name -notmatch '^vz-[0-9a-f]{32}-[0-9]+\$$') { ^
    throw "not a vz share name: $($s.name)" }
  if (-not (Test-Path -LiteralPath $s.path -PathType Container)) { ^
    throw "the shared directory $($s.path) does not exist" }
  if ($s.read_only) {
    New-SmbShare -Name $s.name -Path $s.path -Description $a.description -ReadAccess $qualified ^
      -Temporary -EncryptData $true -FolderEnumerationMode AccessBased -CachingMode None | Out-Null
    $rights = 'ReadAndExecute'
  } else {
    New-SmbShare -Name $s.name -Path $s.path -Description $a.description -ChangeAccess $qualified ^
      -Temporary -EncryptData $true -FolderEnumerationMode AccessBased -CachingMode None | Out-Null
    $rights = 'Modify'
  }
  $dir = Get-Item -LiteralPath $s.path
  $acl = $dir.GetAccessControl('Access')
  $rule = New-Object -TypeName System.Security.AccessControl.FileSystemAccessRule ^
    -ArgumentList @($sid, $rights, 'ContainerInherit, ObjectInherit', 'None', 'Allow')
  $acl.AddAccessRule($rule)
  $dir.SetAccessControl($acl)
  $access = @(Get-SmbShareAccess -Name $s.name | ForEach-Object -Process { @{ AccountName = [string]$_.AccountName; ^
    AccessRight = [string]$_.AccessRight; AccessControlType = [string]$_.AccessControlType } })
  $made += @{ Name = [string]$s.name; Path = [string]$s.path; Access = $access }
}
@{ Account = $qualified; User = [string]$a.account; Domain = [string]$env:COMPUTERNAME; ^
  HostAddress = [string]$address[0].IPAddress; Shares = $made; Replaced = $removed }
"""),
)
"""Converge one Machine's shares for a boot: the account (made, or its password reset and enabled), leftovers of
earlier boots removed (shares, directory ACEs, firewall rule), then every share, its ACE and a firewall rule
for TCP 445 on the switch's host interface (LocalSubnet only); answers the shares' access lists as Windows
reads them back, so the driver checks the read-only ones itself."""

UNSHARE = Script(
    name="unshare",
    args=("prefix", "account", "rule", "paths", "remove_account"),
    body=_SHARE_CHECKS
    + r"""
$accountState = 'absent'
if ($null -ne $user) {
  if ($a.remove_account) {
    Remove-LocalUser -Name $a.account
    $accountState = 'removed'
  } else {
    Disable-LocalUser -Name $a.account
    $accountState = 'disabled'
  }
}
@{ RemovedShares = $removed; RemovedRule = $removedRule; Account = $accountState }
""",
)
"""Remove one Machine's shares, their directory ACEs and its firewall rule; disable its account (Stop) or remove
it (Delete). Idempotent: what is already gone is skipped."""

LIST_SHARES = Script(
    name="list-shares",
    body=_joined(r"""
$shares = @(Get-SmbShare | Where-Object -FilterScript { [string]$_.Name -match '^vz-[0-9a-f]{32}-[0-9]+\$$' } | ^
  ForEach-Object -Process { @{ Name = [string]$_.Name; Path = [string]$_.Path; Description = [string]$_.Description } })
$accounts = @(Get-LocalUser | Where-Object -FilterScript { [string]$_.Name -match '^vz-[0-9a-f]{16}$' } | ^
  ForEach-Object -Process { @{ Name = [string]$_.Name; Description = [string]$_.Description; ^
  Enabled = [bool]$_.Enabled } })
@{ Shares = $shares; Accounts = $accounts }
"""),
)
"""Every share and account named like vz's (to find those a crash left behind)."""

SCRIPTS: tuple[Script, ...] = (PROBE, STATE, CREATE, START, STOP, TURN_OFF, REMOVE, SHARE, UNSHARE, LIST_SHARES)


# ---------------------------------------------------------------------------------------------- answers


def _bad(script: str, field: str, value: Any) -> RuntimeFailureError:
    return RuntimeFailureError(
        f"Hyper-V script {script!r} answered an unexpected {field}: {str(value)[:100]!r}",
        details={"script": script, "field": field},
    )


def _field(script: str, data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(name)
    # JSON has one number type: ints are acceptable where floats are expected; bools are never numbers.
    if isinstance(value, bool) and kind is not bool:
        raise _bad(script, name, value)
    if not isinstance(value, kind):
        raise _bad(script, name, value)
    return value


@dataclass(frozen=True)
class VmState:
    """A VM as ``Get-VM`` describes it (``State``: the VMState name, "Running", "Off", "Saved", ...)."""

    name: str
    id: str
    state: str
    status: str = ""
    uptime_seconds: float = 0.0
    cpus: int = 0
    memory_startup: int = 0
    generation: int = 0

    @property
    def running(self) -> bool:
        return self.state == "Running"

    @property
    def off(self) -> bool:
        return self.state == "Off"


_GUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")


def parse_state(script: str, value: Any) -> VmState | None:
    """The ``vz_vm`` object a script answered (None when the VM does not exist)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad(script, "answer", value)
    vm_id = _field(script, value, "Id", str)
    if not _GUID_RE.match(vm_id):
        raise _bad(script, "Id", vm_id)
    return VmState(
        name=_field(script, value, "Name", str),
        id=vm_id.lower(),
        state=_field(script, value, "State", str),
        status=_field(script, value, "Status", str),
        uptime_seconds=float(_field(script, value, "UptimeSeconds", (int, float))),
        cpus=_field(script, value, "ProcessorCount", int),
        memory_startup=_field(script, value, "MemoryStartup", int),
        generation=_field(script, value, "Generation", int),
    )


@dataclass(frozen=True)
class HostProbe:
    """What this Windows host offers: the Hyper-V module, the user's privileges, the virtual switches."""

    module: bool
    module_version: str
    elevated: bool
    hyperv_administrator: bool
    user: str
    switches: tuple[str, ...]
    ps_version: str
    memory_bytes: int = 0
    """``Get-VMHost``'s MemoryCapacity (0 when not readable)."""
    cpus: int = 0
    """``Get-VMHost``'s LogicalProcessorCount (0 when not readable)."""


def parse_probe(value: Any) -> HostProbe:
    if not isinstance(value, dict):
        raise _bad("probe", "answer", value)
    switches = value.get("Switches")
    # ConvertTo-Json writes a one-element array as that element (PowerShell 5.1 unrolls it).
    if isinstance(switches, str):
        switches = [switches]
    if switches is None:
        switches = []
    if not isinstance(switches, list) or not all(isinstance(s, str) for s in switches):
        raise _bad("probe", "Switches", switches)
    return HostProbe(
        module=_field("probe", value, "Module", bool),
        module_version=_field("probe", value, "ModuleVersion", str),
        elevated=_field("probe", value, "Elevated", bool),
        hyperv_administrator=_field("probe", value, "HyperVAdministrator", bool),
        user=_field("probe", value, "User", str),
        switches=tuple(switches),
        ps_version=_field("probe", value, "PSVersion", str),
        memory_bytes=_field("probe", value, "MemoryCapacity", int),
        cpus=_field("probe", value, "LogicalProcessorCount", int),
    )


@dataclass(frozen=True)
class Removal:
    removed_vm: bool
    removed_service: bool


def parse_removal(value: Any) -> Removal:
    if not isinstance(value, dict):
        raise _bad("remove", "answer", value)
    return Removal(
        removed_vm=_field("remove", value, "RemovedVm", bool),
        removed_service=_field("remove", value, "RemovedService", bool),
    )


def _objects(script: str, value: Any, name: str) -> list[dict[str, Any]]:
    """A list of objects (ConvertTo-Json writes a one-element array as that element; an empty one as null)."""
    if value is None:
        return []
    if isinstance(value, dict):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise _bad(script, name, value)
    return value


def _strings(script: str, value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(script, name, value)
    return tuple(value)


@dataclass(frozen=True)
class ShareAccess:
    """One entry of ``Get-SmbShareAccess`` (AccessRight: Full, Change, Read, Custom; type: Allow, Deny)."""

    account: str
    right: str
    control: str


@dataclass(frozen=True)
class SharedDir:
    name: str
    path: str
    access: tuple[ShareAccess, ...]


@dataclass(frozen=True)
class SharesMade:
    """The SHARE script's answer: the account the guest logs on as and the shares it may mount."""

    account: str
    """``COMPUTER\\vz-<key16>`` (what the share ACLs name)."""
    user: str
    domain: str
    host_address: str
    """The host's IPv4 address on the Machine's switch (the SMB server the guest connects to)."""
    shares: tuple[SharedDir, ...]
    replaced: tuple[str, ...]
    """Shares of an earlier boot that were removed first (a crash left them)."""


_IPV4_RE = re.compile(r"^(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}\Z")


def parse_shares(value: Any) -> SharesMade:
    script = "share"
    if not isinstance(value, dict):
        raise _bad(script, "answer", value)
    address = _field(script, value, "HostAddress", str)
    if not _IPV4_RE.match(address):
        raise _bad(script, "HostAddress", address)
    shares = []
    for item in _objects(script, value.get("Shares"), "Shares"):
        access = tuple(
            ShareAccess(
                account=_field(script, entry, "AccountName", str),
                right=_field(script, entry, "AccessRight", str),
                control=_field(script, entry, "AccessControlType", str),
            )
            for entry in _objects(script, item.get("Access"), "Access")
        )
        shares.append(SharedDir(_field(script, item, "Name", str), _field(script, item, "Path", str), access))
    return SharesMade(
        account=_field(script, value, "Account", str),
        user=_field(script, value, "User", str),
        domain=_field(script, value, "Domain", str),
        host_address=address,
        shares=tuple(shares),
        replaced=_strings(script, value.get("Replaced"), "Replaced"),
    )


@dataclass(frozen=True)
class Unshared:
    removed_shares: tuple[str, ...]
    removed_rule: bool
    account: str
    """"removed", "disabled" or "absent"."""


def parse_unshare(value: Any) -> Unshared:
    script = "unshare"
    if not isinstance(value, dict):
        raise _bad(script, "answer", value)
    account = _field(script, value, "Account", str)
    if account not in ("removed", "disabled", "absent"):
        raise _bad(script, "Account", account)
    return Unshared(
        removed_shares=_strings(script, value.get("RemovedShares"), "RemovedShares"),
        removed_rule=_field(script, value, "RemovedRule", bool),
        account=account,
    )


@dataclass(frozen=True)
class ShareListing:
    """vz-named shares (name, path, description) and accounts (name, description) of this host."""

    shares: tuple[tuple[str, str, str], ...]
    accounts: tuple[tuple[str, str], ...]


def parse_share_listing(value: Any) -> ShareListing:
    script = "list-shares"
    if not isinstance(value, dict):
        raise _bad(script, "answer", value)
    shares = tuple(
        (_field(script, s, "Name", str), _field(script, s, "Path", str), _field(script, s, "Description", str))
        for s in _objects(script, value.get("Shares"), "Shares")
    )
    accounts = tuple(
        (_field(script, u, "Name", str), _field(script, u, "Description", str))
        for u in _objects(script, value.get("Accounts"), "Accounts")
    )
    return ShareListing(shares=shares, accounts=accounts)
