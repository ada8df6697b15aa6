"""The ``vz.network`` RunImage label: one Machine's slice of its Environment's topology plan (docs/network.md).

The Environment layer gives each Machine of a driver that advertises the Extensions fact ``topology`` the label
``vz.network=<compact JSON>``; the drivers (linux_native: veth pairs; qemu: tap devices) read it with
``parse_machine_slice``, so both refuse exactly the same labels with the same messages. The slice is itself a
plan holding only that Machine, so ``DomainSpec.from_plan`` and ``attach_machine`` read it unchanged::

    {"format": 1, "environment_id": "env_…", "route_domain": "vzd-…",
     "networks": [{"name", "subnet", "gateway", "machines": [m]}, …],          # the Machine's networks only
     "machines": [{"name": m, "attachments": [{"network", "address", "prefixlen", "gateway",
                                               "machine_ifname", "domain_ifname"}, …],
                   "dns_server": "10.89.242.1", "search": ["vz.internal"], "egress": {…}}],
     "forward": [], "input": []}

The label is given when the Machine is created, and the driver protocol has no call that changes it. When a
Machine's attachments change in vz.json (a network added or removed, another subnet), ``vz up`` records every
recorded Machine's **current slice** on the host (``write_slices``: one file per Machine id under
``/run/vz/network/vzd-<id12>/``, root only, removed with the domain by ``remove_slices``); a driver reads
``current_slice(labels)`` at every start (the recorded slice when there is one, else the label's) and notes which
slice it attached with (``note_attached``), so ``needs_reattach`` tells ``vz up`` which running Machines still
carry an older attachment and must be restarted to take the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vz_core.errors import InvalidArgumentError
from vz_core.network._spec import AttachmentSpec, DomainSpec, PlanError, domain_for

__all__ = [
    "FACT_KEY",
    "LABEL",
    "MAX_LABEL",
    "SLICES_DIR",
    "MachineSlice",
    "current_slice",
    "machine_slice",
    "needs_reattach",
    "note_attached",
    "parse_machine_slice",
    "remove_slices",
    "write_slices",
]

LABEL = "vz.network"
FACT_KEY = "topology"
"""The Extensions fact a driver advertises when it reads the label (the Environment layer passes it only then)."""
MAX_LABEL = 8192
ENVIRONMENT_LABEL = "dev.vz.environment"
MACHINE_LABEL = "dev.vz.machine"
SLICES_DIR = Path("/run/vz/network")
"""Where ``vz up`` records each Machine's current slice, per route domain (tmpfs: gone with a reboot, like the
domains themselves)."""
_MACHINE_ID_RE = re.compile(r"mch_[0-9a-z]{12}")
_SEARCH_RE = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class MachineSlice:
    """One Machine's part of its Environment's topology plan, as carried by the ``vz.network`` label."""

    plan: dict[str, Any]
    spec: DomainSpec
    machine: str
    dns_server: str
    search: tuple[str, ...]

    @property
    def attachments(self) -> tuple[AttachmentSpec, ...]:
        return self.spec.machine(self.machine)

    def resolv_conf(self) -> str:
        return f"nameserver {self.dns_server}\nsearch {' '.join(self.search)}\n"


def machine_slice(plan: Mapping[str, Any], machine: str) -> str | None:
    """The ``vz.network`` label value of ``machine``: its slice of the plan (JSON form) as compact JSON; None for
    a Machine attached to no network (it gets no label)."""
    entries = [m for m in plan.get("machines", []) if isinstance(m, Mapping) and m.get("name") == machine]
    if len(entries) != 1:
        raise PlanError(f"{machine!r} is not a Machine of this plan")
    entry = entries[0]
    if not entry["attachments"]:
        return None
    names = {a["network"] for a in entry["attachments"]}
    piece = {
        "format": plan["format"],
        "environment_id": plan["environment_id"],
        "route_domain": plan["route_domain"],
        "networks": [
            {"name": n["name"], "subnet": n["subnet"], "gateway": n["gateway"], "machines": [machine]}
            for n in plan["networks"]
            if n["name"] in names
        ],
        "machines": [
            {
                "name": machine,
                "attachments": entry["attachments"],
                "dns_server": entry["dns_server"],
                "search": entry["search"],
                "egress": entry["egress"],
            }
        ],
        "forward": [],
        "input": [],
    }
    return json.dumps(piece, sort_keys=True, separators=(",", ":"))


def _bad(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"label {LABEL}: {message}", details={"field": "labels", "label": LABEL})


def parse_machine_slice(labels: Mapping[str, str]) -> MachineSlice | None:
    """The Machine's slice from its labels (None: no ``vz.network`` label, the driver's own networking).

    Checked whole, with the checks ``vz_core.network`` applies to any plan plus the slice's own (one Machine,
    attached, no rules, its DNS server one of its gateways, search domains, the Machine's Environment when the
    ownership label says it); InvalidArgumentError naming the problem otherwise, before anything is touched."""
    text = labels.get(LABEL)
    if text is None:
        return None
    if len(text) > MAX_LABEL:
        raise _bad(f"{len(text)} characters is longer than {MAX_LABEL}; it carries one Machine's slice of the plan")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _bad(f"not JSON ({exc}); it is the Machine's slice of the topology plan (docs/network.md)") from None
    if not isinstance(data, dict):
        raise _bad("expected a JSON object (the Machine's slice of the topology plan)")
    try:
        spec = DomainSpec.from_plan(data)
    except PlanError as exc:
        raise _bad(exc.message) from None
    machines = data["machines"]
    if len(machines) != 1:
        raise _bad(f"$.machines: {len(machines)} Machines; a slice holds exactly the one Machine it is given to")
    entry = machines[0]
    name = str(entry["name"])
    if not spec.attachments:
        raise _bad(f"$.machines[0].attachments: {name!r} has none (a Machine attached to no network gets no label)")
    for i, net in enumerate(data["networks"]):
        if net.get("machines") != [name]:
            raise _bad(f"$.networks[{i}].machines: {net.get('machines')!r}; a slice's networks list only {name!r}")
    if data["forward"] or data["input"]:
        raise _bad("$.forward/$.input: a slice carries no rules (the route domain holds them)")
    environment_id = data["environment_id"]
    if ENVIRONMENT_LABEL in labels and labels[ENVIRONMENT_LABEL] != environment_id:
        raise _bad(
            f"$.environment_id: {environment_id!r} is not the Machine's Environment ({labels[ENVIRONMENT_LABEL]!r})"
        )
    dns = entry.get("dns_server")
    if dns not in {str(a.gateway) for a in spec.attachments}:
        raise _bad(f"$.machines[0].dns_server: {dns!r} is not a gateway of the Machine's attachments")
    search = entry.get("search")
    if (
        not isinstance(search, list)
        or not search
        or not all(isinstance(x, str) and _SEARCH_RE.fullmatch(x) for x in search)
    ):
        raise _bad(f"$.machines[0].search: {search!r} is not a non-empty list of domain names")
    return MachineSlice(data, spec, name, str(dns), tuple(search))


# --- the current slice of a Machine whose attachments changed after its creation ----------------------------


def _slices_dir(environment_id: str) -> Path:
    return SLICES_DIR / domain_for(environment_id)


def _machine_id(value: Any) -> str:
    if not isinstance(value, str) or not _MACHINE_ID_RE.fullmatch(value):
        raise InvalidArgumentError(f"{value!r} is not a Machine id (mch_ followed by 12 characters)")
    return value


def _digest(text: str | None) -> str:
    return "none" if text is None else hashlib.sha256(text.encode()).hexdigest()


def _write(path: Path, data: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_slices(environment_id: str, slices: Mapping[str, str | None]) -> None:
    """Record the current slice of each recorded Machine of the Environment (Machine id -> ``machine_slice``,
    None for a Machine attached to no network); files of Machine ids not given are removed. Root only."""
    directory = _slices_dir(environment_id)
    SLICES_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.mkdir(exist_ok=True, mode=0o700)
    for machine_id, text in slices.items():
        _machine_id(machine_id)
        _write(directory / f"{machine_id}.slice", json.dumps({"slice": text}))
    for entry in directory.iterdir():
        stem, _, suffix = entry.name.partition(".")
        if suffix in ("slice", "attached") and stem not in slices:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()


def remove_slices(environment_id: str) -> bool:
    """Forget the Environment's recorded slices (with its route domain). Whether there were any."""
    directory = _slices_dir(environment_id)
    if not directory.is_dir():
        return False
    for entry in directory.iterdir():
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
    with contextlib.suppress(FileNotFoundError, OSError):
        directory.rmdir()
    return True


def _recorded(labels: Mapping[str, str]) -> tuple[bool, str | None]:
    """(whether ``vz up`` recorded a slice for this Machine, that slice)."""
    environment_id, machine_id = labels.get(ENVIRONMENT_LABEL), labels.get(MACHINE_LABEL)
    if environment_id is None or machine_id is None or not _MACHINE_ID_RE.fullmatch(machine_id):
        return False, None
    try:
        path = _slices_dir(environment_id) / f"{machine_id}.slice"
    except PlanError:
        return False, None
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return False, None
    except ValueError:
        raise _bad(f"{path} is not the JSON vz up writes; run `vz up` again") from None
    text = data.get("slice") if isinstance(data, dict) else None
    if text is not None and not isinstance(text, str):
        raise _bad(f"{path}: the recorded slice is not a string; run `vz up` again")
    return True, text


def current_slice(labels: Mapping[str, str]) -> MachineSlice | None:
    """The slice a Machine is to be attached with now: the one ``vz up`` recorded for it (its attachments may
    have changed since it was created), else its label's; None when it is attached to no network (or has no
    ``vz.network`` label and nothing was recorded: the driver's own networking). Checked exactly like the label
    (``parse_machine_slice``, the Machine's Environment included)."""
    found, text = _recorded(labels)
    if not found:
        return parse_machine_slice(labels)
    if text is None:
        return None
    return parse_machine_slice({**labels, LABEL: text})


def _attached_path(labels: Mapping[str, str]) -> Path | None:
    environment_id, machine_id = labels.get(ENVIRONMENT_LABEL), labels.get(MACHINE_LABEL)
    if environment_id is None or machine_id is None or not _MACHINE_ID_RE.fullmatch(machine_id):
        return None
    try:
        return _slices_dir(environment_id) / f"{machine_id}.attached"
    except PlanError:
        return None


def note_attached(labels: Mapping[str, str], found: MachineSlice | None) -> None:
    """A driver's note that the Machine now runs attached with ``found`` (``current_slice``'s answer)."""
    path = _attached_path(labels)
    if path is None or not path.parent.is_dir():
        return  # nothing recorded for this Environment (yet): the label's slice is the current one
    text = json.dumps(found.plan, sort_keys=True, separators=(",", ":")) if found is not None else None
    _write(path, _digest(text))


def needs_reattach(environment_id: str, machine_id: str, desired: str | None, created_with: str | None) -> bool:
    """Whether a running Machine carries another attachment than ``desired`` (its ``machine_slice`` now):
    compared with what its driver noted at its last start, else with the label it was created with. A Machine
    attached to no network now needs nothing: ``ensure_domain`` already removed every domain end the plan no
    longer has (and a veth's Machine end, or a tap's backend, goes with it); its next start is isolated."""
    if desired is None:
        return False
    path = _slices_dir(environment_id) / f"{_machine_id(machine_id)}.attached"
    try:
        noted = path.read_text().strip()
    except FileNotFoundError:
        return _digest(desired) != _digest(created_with)
    return noted != _digest(desired)
