"""The documented parameter sets of every cmdlet the hyperv scripts call, and a checker for script text.

Built from the cmdlet reference (learn.microsoft.com/powershell/module/hyper-v/<cmdlet>, the SYNTAX sections of
Windows Server 2022 / Windows 10+ Hyper-V module 2.0, and Microsoft.PowerShell.Management/Utility/Core 5.1).
Only the parameter sets a script could reach by name are listed (the object/pipeline sets such as ``-VM`` are
kept where they change what a name-based call may combine). ``mandatory`` lists the parameters a set requires
when given by name; pipeline-bound mandatory parameters (``-InputObject``) are satisfied by a ``|`` before the
call.

``check_text`` finds every cmdlet call in a script, refuses undocumented cmdlets, positional arguments and
unknown parameters, and requires one parameter set to hold every parameter used (with its mandatory ones).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

COMMON = frozenset(
    {
        "Verbose",
        "Debug",
        "ErrorAction",
        "WarningAction",
        "InformationAction",
        "ErrorVariable",
        "WarningVariable",
        "InformationVariable",
        "OutVariable",
        "OutBuffer",
        "PipelineVariable",
    }
)
SWITCHES = frozenset(
    {
        "NoVHD",
        "Force",
        "AsJob",
        "Passthru",
        "Save",
        "TurnOff",
        "ListAvailable",
        "Recurse",
        "Compress",
        "WhatIf",
        "Confirm",
        "Prerelease",
        "Experimental",
        "All",
        "Refresh",
        "Resolve",
        "IsValid",
        "SkipEditionCheck",
        "SupportPersistentReservations",
        "AllowUnverifiedPaths",
        "Parallel",
        "DynamicMemory",
        "StaticMemory",
        "AsPlainText",
        "AccountNeverExpires",
        "PasswordNeverExpires",
        "UserMayNotChangePassword",
        "NoPassword",
        "Disabled",
        "Temporary",
        "Scoped",
        "Special",
        "IncludeHidden",
        "IncludeAllCompartments",
    }
)


@dataclass(frozen=True)
class ParameterSet:
    params: frozenset[str]
    mandatory: frozenset[str] = field(default_factory=frozenset)


def _set(params: str, mandatory: str = "") -> ParameterSet:
    return ParameterSet(frozenset(params.split()), frozenset(mandatory.split()))


_REMOTE = " CimSession ComputerName Credential"
_SP = " WhatIf Confirm"

DOCS: dict[str, dict[str, ParameterSet]] = {
    # Hyper-V module
    "Get-VM": {
        "Name": _set("Name" + _REMOTE),
        "Id": _set("Id" + _REMOTE, "Id"),
    },
    "New-VM": {
        "No VHD": _set(
            "Name MemoryStartupBytes BootDevice NoVHD SwitchName Path Version Prerelease Experimental "
            "Generation Force AsJob" + _REMOTE + _SP
        ),
        "New VHD": _set(
            "Name MemoryStartupBytes BootDevice SwitchName NewVHDPath NewVHDSizeBytes Path Version "
            "Prerelease Experimental Generation Force AsJob" + _REMOTE + _SP,
            "NewVHDPath NewVHDSizeBytes",
        ),
        "Existing VHD": _set(
            "Name MemoryStartupBytes BootDevice SwitchName VHDPath Path Version Prerelease "
            "Experimental Generation Force AsJob" + _REMOTE + _SP,
            "VHDPath",
        ),
    },
    "Set-VMProcessor": {
        "VMName": _set(
            "VMName Count CompatibilityForMigrationEnabled CompatibilityForOlderOperatingSystemsEnabled "
            "HwThreadCountPerCore Maximum Reserve RelativeWeight MaximumCountPerNumaNode MaximumCountPerNumaSocket "
            "ResourcePoolName Perfmon EnableHostResourceProtection ExposeVirtualizationExtensions Passthru"
            + _REMOTE
            + _SP,
            "VMName",
        ),
        "VMObject": _set(
            "VM Count CompatibilityForMigrationEnabled CompatibilityForOlderOperatingSystemsEnabled "
            "HwThreadCountPerCore Maximum Reserve RelativeWeight MaximumCountPerNumaNode MaximumCountPerNumaSocket "
            "ResourcePoolName Perfmon EnableHostResourceProtection ExposeVirtualizationExtensions Passthru" + _SP,
            "VM",
        ),
    },
    "Set-VMMemory": {
        "VMName": _set(
            "VMName Buffer DynamicMemoryEnabled MaximumBytes StartupBytes MinimumBytes Priority "
            "MaximumAmountPerNumaNodeBytes ResourcePoolName Passthru" + _REMOTE + _SP,
            "VMName",
        ),
        "VMObject": _set(
            "VM Buffer DynamicMemoryEnabled MaximumBytes StartupBytes MinimumBytes Priority Passthru" + _SP, "VM"
        ),
    },
    "Set-VMFirmware": {
        "VMName": _set(
            "VMName BootOrder FirstBootDevice EnableSecureBoot SecureBootTemplate SecureBootTemplateId "
            "PreferredNetworkBootProtocol ConsoleMode PauseAfterBootFailure Passthru" + _REMOTE + _SP,
            "VMName",
        ),
        "VMObject": _set(
            "VM BootOrder FirstBootDevice EnableSecureBoot SecureBootTemplate SecureBootTemplateId "
            "PreferredNetworkBootProtocol ConsoleMode PauseAfterBootFailure Passthru" + _SP,
            "VM",
        ),
    },
    "Set-VM": {
        "Name": _set(
            "Name GuestControlledCacheTypes LowMemoryMappedIoSpace HighMemoryMappedIoSpace "
            "ProcessorCount "
            "DynamicMemory StaticMemory MemoryMinimumBytes MemoryMaximumBytes MemoryStartupBytes "
            "AutomaticStartAction AutomaticStopAction AutomaticStartDelay AutomaticCriticalErrorAction "
            "AutomaticCriticalErrorActionTimeout AutomaticCheckpointsEnabled LockOnDisconnect Notes "
            "NewVMName SnapshotFileLocation SmartPagingFilePath CheckpointType AllowUnverifiedPaths "
            "Passthru" + _REMOTE + _SP,
            "Name",
        ),
    },
    "Set-VMComPort": {
        "VMName": _set("VMName Number Path DebuggerMode Passthru" + _REMOTE + _SP, "VMName Number"),
    },
    "Add-VMHardDiskDrive": {
        "VMName": _set(
            "VMName ControllerType ControllerNumber ControllerLocation Path DiskNumber ResourcePoolName "
            "SupportPersistentReservations AllowUnverifiedPaths MaximumIOPS MinimumIOPS QoSPolicyID "
            "QoSPolicy Passthru OverrideCacheAttributes" + _REMOTE + _SP,
            "VMName",
        ),
    },
    "Start-VM": {"Name": _set("Name AsJob Passthru" + _REMOTE + _SP, "Name")},
    "Stop-VM": {"Name": _set("Name Save TurnOff Force AsJob Passthru" + _REMOTE + _SP, "Name")},
    "Remove-VM": {"Name": _set("Name Force AsJob Passthru" + _REMOTE + _SP, "Name")},
    "Get-VMHost": {"ComputerName": _set("ComputerName Credential"), "CimSession": _set("CimSession", "CimSession")},
    "Get-VMSwitch": {
        "Name": _set("Name ResourcePoolName SwitchType" + _REMOTE),
        "Id": _set("Id ResourcePoolName SwitchType" + _REMOTE, "Id"),
    },
    # SmbShare module (learn.microsoft.com/powershell/module/smbshare/<cmdlet>)
    "New-SmbShare": {
        "Default": _set(
            "Temporary ContinuouslyAvailable Description ConcurrentUserLimit CATimeout FolderEnumerationMode "
            "CachingMode FullAccess ChangeAccess ReadAccess NoAccess SecurityDescriptor Path Name ScopeName "
            "EncryptData CompressData LeasingMode CimSession ThrottleLimit AsJob" + _SP,
            "Path Name",
        )
    },
    "Get-SmbShare": {
        "Default": _set(
            "Name ScopeName Scoped Special ContinuouslyAvailable ShareState FolderEnumerationMode CachingMode "
            "LeasingMode ConcurrentUserLimit AvailabilityType CaTimeout EncryptData IncludeHidden CimSession "
            "ThrottleLimit AsJob"
        )
    },
    "Remove-SmbShare": {
        "Query": _set("Name ScopeName Force CimSession ThrottleLimit AsJob" + _SP, "Name"),
        "InputObject": _set("InputObject Force CimSession ThrottleLimit AsJob" + _SP, "InputObject"),
    },
    "Get-SmbShareAccess": {
        "Query": _set("Name ScopeName CimSession ThrottleLimit AsJob", "Name"),
        "InputObject": _set("InputObject CimSession ThrottleLimit AsJob", "InputObject"),
    },
    # Microsoft.PowerShell.LocalAccounts (Windows PowerShell 5.1)
    "New-LocalUser": {
        "Password": _set(
            "Name Password AccountExpires AccountNeverExpires Description Disabled FullName PasswordNeverExpires "
            "UserMayNotChangePassword" + _SP,
            "Name Password",
        ),
        "NoPassword": _set(
            "Name AccountExpires AccountNeverExpires Description Disabled FullName NoPassword "
            "UserMayNotChangePassword" + _SP,
            "Name",
        ),
    },
    "Set-LocalUser": {
        "Name": _set(
            "Name AccountExpires AccountNeverExpires Description FullName Password PasswordNeverExpires "
            "UserMayChangePassword" + _SP,
            "Name",
        ),
        "SecurityIdentifier": _set(
            "SID AccountExpires AccountNeverExpires Description FullName Password PasswordNeverExpires "
            "UserMayChangePassword" + _SP,
            "SID",
        ),
    },
    "Get-LocalUser": {"Default": _set("Name"), "SecurityIdentifier": _set("SID", "SID")},
    "Enable-LocalUser": {"Name": _set("Name" + _SP, "Name"), "SecurityIdentifier": _set("SID" + _SP, "SID")},
    "Disable-LocalUser": {"Name": _set("Name" + _SP, "Name"), "SecurityIdentifier": _set("SID" + _SP, "SID")},
    "Remove-LocalUser": {"Name": _set("Name" + _SP, "Name"), "SecurityIdentifier": _set("SID" + _SP, "SID")},
    # NetSecurity / NetTCPIP modules
    "New-NetFirewallRule": {
        "Default": _set(
            "PolicyStore GPOSession Name DisplayName Description Group Enabled Profile Platform Direction Action "
            "EdgeTraversalPolicy LooseSourceMapping LocalOnlyMapping Owner LocalAddress RemoteAddress Protocol "
            "LocalPort RemotePort IcmpType DynamicTarget Program Package Service InterfaceAlias InterfaceType "
            "LocalUser RemoteUser RemoteMachine Authentication Encryption OverrideBlockRules CimSession "
            "ThrottleLimit AsJob" + _SP,
            "DisplayName",
        )
    },
    "Get-NetFirewallRule": {
        "All": _set("All PolicyStore GPOSession TracePolicyStore CimSession ThrottleLimit AsJob"),
        "ByName": _set("Name PolicyStore GPOSession TracePolicyStore CimSession ThrottleLimit AsJob", "Name"),
    },
    "Remove-NetFirewallRule": {
        "ByName": _set("Name PolicyStore GPOSession CimSession ThrottleLimit AsJob" + _SP, "Name"),
        "GetInstance": _set("InputObject CimSession ThrottleLimit AsJob" + _SP, "InputObject"),
    },
    "Get-NetIPAddress": {
        "ByName": _set(
            "IPAddress InterfaceIndex InterfaceAlias AddressFamily Type PrefixLength PrefixOrigin SuffixOrigin "
            "AddressState ValidLifetime PreferredLifetime SkipAsSource AssociatedIPInterface PolicyStore "
            "IncludeAllCompartments CimSession ThrottleLimit AsJob"
        )
    },
    # Microsoft.PowerShell.Security
    "ConvertTo-SecureString": {
        "Secure": _set("String SecureKey", "String"),
        "PlainText": _set("String AsPlainText Force", "String AsPlainText"),
        "Open": _set("String Key", "String"),
    },
    # Microsoft.PowerShell.Core / Utility / Management (Windows PowerShell 5.1)
    "Get-Module": {
        "Available": _set(
            "Name FullyQualifiedName All ListAvailable PSEdition SkipEditionCheck Refresh", "ListAvailable"
        ),
        "Loaded": _set("Name FullyQualifiedName All"),
    },
    "ForEach-Object": {"ScriptBlockSet": _set("InputObject Begin Process End RemainingScripts" + _SP, "Process")},
    "New-Object": {"Net": _set("TypeName ArgumentList Property", "TypeName")},
    "Join-Path": {"Default": _set("Path ChildPath Resolve Credential", "Path ChildPath")},
    "New-Item": {"pathSet": _set("Path ItemType Value Force Credential" + _SP, "Path")},
    "New-ItemProperty": {
        "Path": _set("Path Name PropertyType Value Force Filter Include Exclude Credential" + _SP, "Path Name")
    },
    "Remove-Item": {"Path": _set("Path Filter Include Exclude Recurse Force Credential Stream" + _SP, "Path")},
    "Test-Path": {
        "Path": _set("Path Filter Include Exclude PathType IsValid Credential OlderThan NewerThan", "Path"),
        "LiteralPath": _set(
            "LiteralPath Filter Include Exclude PathType IsValid Credential OlderThan NewerThan", "LiteralPath"
        ),
    },
    "Get-Item": {
        "Path": _set("Path Filter Include Exclude Force Credential Stream", "Path"),
        "LiteralPath": _set("LiteralPath Filter Include Exclude Force Credential Stream", "LiteralPath"),
    },
    "Where-Object": {"ScriptBlockSet": _set("InputObject FilterScript", "FilterScript")},
    "Out-Null": {"Default": _set("InputObject")},
    "ConvertFrom-Json": {"Default": _set("InputObject")},
    "ConvertTo-Json": {"Default": _set("InputObject Depth Compress")},
}

# PowerShell's approved verbs (Get-Verb) plus ForEach/Where: a Verb-Noun word with one of them is a cmdlet call.
_VERBS = frozenset(
    [
        "Add",
        "Clear",
        "Close",
        "Copy",
        "Enter",
        "Exit",
        "Find",
        "Format",
        "Get",
        "Hide",
        "Join",
        "Lock",
        "Move",
        "New",
        "Open",
        "Optimize",
        "Pop",
        "Push",
        "Redo",
        "Remove",
        "Rename",
        "Reset",
        "Resize",
        "Search",
        "Select",
        "Set",
        "Show",
        "Skip",
        "Split",
        "Step",
        "Switch",
        "Undo",
        "Unlock",
        "Watch",
        "Connect",
        "Disconnect",
        "Read",
        "Receive",
        "Send",
        "Write",
        "Backup",
        "Checkpoint",
        "Compare",
        "Compress",
        "Convert",
        "ConvertFrom",
        "ConvertTo",
        "Dismount",
        "Edit",
        "Expand",
        "Export",
        "Group",
        "Import",
        "Initialize",
        "Limit",
        "Merge",
        "Mount",
        "Out",
        "Publish",
        "Restore",
        "Save",
        "Sync",
        "Unpublish",
        "Update",
        "Debug",
        "Measure",
        "Ping",
        "Repair",
        "Resolve",
        "Test",
        "Trace",
        "Approve",
        "Assert",
        "Build",
        "Complete",
        "Confirm",
        "Deny",
        "Deploy",
        "Disable",
        "Enable",
        "Install",
        "Invoke",
        "Register",
        "Request",
        "Restart",
        "Resume",
        "Start",
        "Stop",
        "Submit",
        "Suspend",
        "Uninstall",
        "Unregister",
        "Wait",
        "Block",
        "Grant",
        "Protect",
        "Revoke",
        "Unblock",
        "Unprotect",
        "Use",
        "ForEach",
        "Where",
    ]
)
_CMDLET_RE = re.compile(r"(?<![\w$.-])([A-Z][A-Za-z]+)-([A-Z][A-Za-z]+)(?![\w-])")


@dataclass(frozen=True)
class Call:
    cmdlet: str
    params: tuple[str, ...]
    piped: bool
    positional: tuple[str, ...]


def _strip_strings(text: str) -> str:
    """Blank out the contents of quoted strings (so words inside them are never taken for code)."""
    out = []
    quote = ""
    for ch in text:
        if quote:
            out.append(ch if ch == quote else "_")
            if ch == quote:
                quote = ""
        else:
            if ch in "'\"":
                quote = ch
            out.append(ch)
    return "".join(out)


def _tokens(rest: str) -> list[str]:
    """Top-level tokens of the rest of a statement, up to its end (newline, ``;``, ``|`` or a closing bracket)."""
    tokens: list[str] = []
    depth = 0
    current = ""
    for ch in rest:
        if depth == 0 and ch in "\n;|})":
            break
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if depth == 0 and ch in " \t":
            if current:
                tokens.append(current)
            current = ""
        else:
            current += ch
    if current:
        tokens.append(current)
    return tokens


def calls(text: str) -> list[Call]:
    """Every cmdlet call in ``text`` (``Verb-Noun`` with a known verb, outside strings)."""
    code = _strip_strings(text)
    found = []
    for match in _CMDLET_RE.finditer(code):
        if match.group(1) not in _VERBS:
            continue
        before = code[: match.start()].rstrip(" \t")
        piped = before.endswith("|")
        tokens = _tokens(code[match.end() :])
        params: list[str] = []
        positional: list[str] = []
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if re.fullmatch(r"-[A-Za-z]+", tok):
                name = tok[1:]
                params.append(name)
                if name not in SWITCHES:
                    i += 1  # its value
            else:
                positional.append(tok)
            i += 1
        found.append(Call(f"{match.group(1)}-{match.group(2)}", tuple(params), piped, tuple(positional)))
    return found


def check_call(call: Call) -> None:
    sets = DOCS.get(call.cmdlet)
    if sets is None:
        raise AssertionError(f"{call.cmdlet} is not a documented cmdlet of the table")
    if call.positional:
        raise AssertionError(f"{call.cmdlet}: positional argument(s) {call.positional} (name every parameter)")
    used = set(call.params)
    if len(used) != len(call.params):
        raise AssertionError(f"{call.cmdlet}: a parameter is given twice: {call.params}")
    own = used - COMMON
    fits = [
        name for name, ps in DOCS[call.cmdlet].items() if own <= ps.params and (ps.mandatory - {"InputObject"}) <= own
    ]
    if not fits:
        unknown = own - set().union(*(ps.params for ps in sets.values()))
        if unknown:
            raise AssertionError(f"{call.cmdlet}: undocumented parameter(s) {sorted(unknown)}")
        raise AssertionError(f"{call.cmdlet}: {sorted(own)} fit no documented parameter set of {sorted(sets)}")


def check_text(text: str) -> list[Call]:
    found = calls(text)
    for call in found:
        check_call(call)
    return found
