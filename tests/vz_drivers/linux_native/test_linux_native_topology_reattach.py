"""A Machine whose attachments change in vz.json is re-attached at the next `vz up` (docs/network.md).

Through the real `vz` (CLI, daemon, linux_native plugin): two Machines on one network; vz.json then gives that
network a declared subnet (new addresses, same interfaces) and adds a second network (a new interface). The
next `vz up` restarts the running Machines it must re-attach (their data kept), after which each has exactly
the addresses of the new plan, the declared path connects at the new address and resolv.conf names the new DNS
server; another `vz up` changes nothing (no restart: a process started before it still runs). A stopped Machine
whose attachment changed takes the new one at its start. `vz delete` leaves no recorded slice behind.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from topology_testlib import vz_project

from vz_core.env import compile_topology
from vz_core.env._definition import parse_definition
from vz_core.network import domain_exists, domain_for
from vz_core.network.label import SLICES_DIR

pytestmark = [pytest.mark.root, pytest.mark.slow]

M = {"profile": "developer", "driver": "linux_native", "image": "vz:default", "workspace": {"projection": "none"}}
BEFORE: dict[str, Any] = {
    "version": 2,
    "project_id": "topology-reattach",
    "machines": [
        {"name": "app", **M},
        {"name": "db", **M, "services": [{"name": "pg", "port": 5432}]},
    ],
    "networks": [{"name": "front", "machines": ["app", "db"]}],
    "paths": [{"from": "app", "to": "db", "service": "pg"}],
    "default_machine": "app",
}
AFTER = copy.deepcopy(BEFORE)
AFTER["networks"] = [
    {"name": "front", "machines": ["app", "db"], "subnet": "10.77.3.0/24"},
    {"name": "back", "machines": ["app", "db"], "subnet": "10.77.4.0/24"},
]
LATER = copy.deepcopy(AFTER)
LATER["networks"] = [AFTER["networks"][0]]  # "back" removed again

LISTEN = (
    "printf '#!/bin/sh\\necho ok\\n' > /tmp/ok.sh; chmod +x /tmp/ok.sh; "
    "setsid nc -ll -p 5432 -e /tmp/ok.sh </dev/null >/dev/null 2>&1 &"
    " for i in $(seq 50); do netstat -ltn | grep -q ':5432 ' && exit 0; sleep 0.1; done; exit 1"
)
PROBE = "nc -w 2 {0} 5432 </dev/null 2>/dev/null | grep -q '^ok$' && echo yes || echo no"
ADDRESSES = "ip -4 -o addr show | awk '$2 != \"lo\" {print $2, $4}' | sort"


def _expected(data: dict[str, Any], env_id: str) -> dict[str, Any]:
    plan = compile_topology(parse_definition(data), env_id)
    return {
        m.name: {
            "addresses": "\n".join(sorted(f"{a.machine_ifname} {a.address}/32" for a in m.attachments)),
            "first": m.attachments[0].address,
            "resolv": f"nameserver {m.dns_server}\nsearch vz.internal",
        }
        for m in plan.machines
    }


def test_a_changed_attachment_is_taken_at_the_next_vz_up_and_only_then(tmp_path: Path) -> None:
    with vz_project(tmp_path, BEFORE) as vz:
        definition = vz.cwd / "vz.json"
        vz.up()
        env_id = vz.env_id
        before = _expected(BEFORE, env_id)
        for name in ("app", "db"):
            assert vz.sh(name, ADDRESSES) == before[name]["addresses"]

        definition.write_text(json.dumps(AFTER))
        after = _expected(AFTER, env_id)
        assert after["db"]["first"] != before["db"]["first"]
        out = vz.ok("up", stderr=True)
        assert "re-attaching machine app" in out and "re-attaching machine db" in out, out
        for name in ("app", "db"):
            assert vz.sh(name, ADDRESSES) == after[name]["addresses"], name  # eth0 renumbered, eth1 added
            assert vz.sh(name, "cat /etc/resolv.conf") == after[name]["resolv"]
        vz.sh("db", LISTEN)
        assert vz.sh("app", PROBE.format(after["db"]["first"])) == "yes"  # the declared path, new address
        # The Environment's DNS (the daemon's, on the new gateway) answers with the new address.
        resolved = vz.sh("app", "nslookup db 2>&1 | awk '/^Address/ {a=$NF} END {print a}'")
        assert resolved == after["db"]["first"], resolved
        assert vz.sh("app", "nc -w 2 db 5432 </dev/null | grep -q '^ok$' && echo yes || echo no") == "yes"
        assert vz.sh("app", PROBE.format(before["db"]["first"])) == "no"  # the old address leads nowhere

        # Converged: another `vz up` restarts nothing (db's listener, started before it, still answers).
        out = vz.ok("up", stderr=True)
        assert "re-attaching" not in out, out
        assert vz.sh("app", PROBE.format(after["db"]["first"])) == "yes"

        # A stopped Machine takes its changed attachment when it starts.
        definition.write_text(json.dumps(LATER))
        later = _expected(LATER, env_id)
        vz.ok("stop")
        out = vz.ok("up", stderr=True)
        assert "re-attaching" not in out, out  # started, not restarted: its start attaches the current slice
        for name in ("app", "db"):
            assert vz.sh(name, ADDRESSES) == later[name]["addresses"], name  # eth1 gone
        recorded = SLICES_DIR / domain_for(env_id)
        assert recorded.is_dir()

        vz.ok("delete")
        assert not domain_exists(env_id)
        assert not recorded.exists(), "vz delete removes the recorded slices with the route domain"
