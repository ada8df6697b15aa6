"""Human renderings of command results (plain text; the JSON shapes are the contract, these are for people)."""

from __future__ import annotations

from typing import Any

__all__ = ["render_delete", "render_status", "render_up", "render_volumes"]


def render_up(result: dict[str, Any]) -> list[str]:
    env = result["environment"]
    if result["dry_run"]:
        head = f"plan for Environment {env['name']}" + (f" ({env['id']})" if env["id"] else " (would be created)")
        return [head + ":", *("  " + line for line in result["plan_lines"]), "dry run: nothing was changed"]
    machines = ", ".join(f"{m['name']} ({m['id']}) {m['state']}" for m in result["machines"]) or "no machines"
    return [f"Environment {env['name']} ({env['id']}) is {env['state']}: {machines}"]


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def render_status(report: dict[str, Any]) -> str:
    lines: list[str] = []
    project = report.get("project")
    if project:
        where = f" ({project['definition']})" if project.get("definition") else ""
        lines.append(f"Project {project['id']}{where}")
        if project.get("definition_error"):
            lines.append("  vz.json is invalid: drift unknown (see `vz up` for the details)")
    if not report["environments"]:
        lines.append("no Environments (create one with `vz up`)")
    for env in report["environments"]:
        lines.append("")
        bound = ", ".join(env["bound_worktrees"]) or "none"
        of = "" if project else f" of project {env['project_id']}"
        lines.append(f"Environment {env['name']} ({env['id']}){of}  state: {env['state']}  bound: {bound}")
        for op in env["interrupted_operations"]:
            lines.append(f"  ! {op['explanation']}; run `vz up --environment {env['name']}` to converge")
        drift = env["drift"]
        if drift["status"] == "drifted":
            extra = []
            if drift["not_created"]:
                extra.append("not created: " + ", ".join(drift["not_created"]))
            if drift["default_machine"]:
                extra.append(f"default machine → {drift['default_machine']['desired']}")
            changed = [m["name"] for m in env["machines"] if m["drift"]["status"] != "in-sync"]
            if changed:
                extra.append("changed: " + ", ".join(changed))
            lines.append("  drift from vz.json: " + "; ".join(extra) + " (run `vz up` to reconcile)")
        rows = [["", "MACHINE", "ID", "STATE", "DRIVER", "TARGET", "PROFILE", "DRIFT"]]
        for machine in env["machines"]:
            driver = machine["driver"]
            driver_text = f"{driver['name']} {driver.get('version', '?')}" if "error" not in driver else "unavailable"
            if driver.get("matrix"):
                driver_text += f" ({driver['matrix']['status']})"
            target = machine["target"]
            rows.append(
                [
                    "*" if machine["default"] else "",
                    machine["name"],
                    machine["id"],
                    machine["state"],
                    driver_text,
                    f"{target.get('os')}/{target.get('arch') or '?'}",
                    str(machine["profile"]),
                    machine["drift"]["status"],
                ]
            )
        if len(rows) > 1:
            lines.extend(_table(rows))
        for machine in env["machines"]:
            if machine.get("error"):
                lines.append(f"  {machine['name']}: {machine['error']}")
        services = [["MACHINE", "SERVICE", "STATE", "HEALTH", "PID", "RESTARTS", "LAST EXIT", "NOTE"]]
        for machine in env["machines"]:
            for svc in machine.get("services") or []:
                code = svc.get("last_exit_code")
                last = "" if code is None else str(code) + (f" {svc['last_signal']}" if svc.get("last_signal") else "")
                services.append(
                    [
                        machine["name"],
                        svc["name"],
                        svc["state"],
                        svc.get("health") or "-",
                        str(svc.get("pid") or "-"),
                        str(svc.get("restarts", 0)),
                        last or "-",
                        svc.get("last_error") or "",
                    ]
                )
        if len(services) > 1:
            lines.append("  services:")
            lines.extend(_table(services))
        endpoints = env.get("endpoints") or []
        if endpoints:
            shown = ", ".join(f"{e['machine']}/{e['service']} → {e['host']}:{e['port']}" for e in endpoints)
            lines.append(f"  endpoints: {shown}")
    return "\n".join(lines).lstrip("\n") + "\n"


def render_delete(result: dict[str, Any]) -> list[str]:
    """What `vz delete` removed (and kept), one table."""
    env = result["environment"]
    lines = [f"Environment {env['name']} ({env['id']}) deleted:"]
    rows = [["what", "name", "result"]]
    for machine in result["machines"]:
        rows.append(["machine", f"{machine['name']} ({machine['id']})", machine["state"]])
    for volume in result.get("volumes", []):
        state = volume["state"] + (f" ({volume['reason']})" if volume.get("reason") else "")
        rows.append(["volume", volume["name"], state])
    for worktree in result.get("bindings", []):
        rows.append(["binding", worktree, "removed"])
    rows.append(["records", f"{result.get('operations_removed', 0)} operation record(s), the Environment", "removed"])
    lines += _table(rows)
    if any(v["state"] == "kept" for v in result.get("volumes", [])):
        lines.append("kept volumes: `vz volume list`; remove one with `vz volume rm NAME`")
    return lines


def render_volumes(report: dict[str, Any], *, removed: bool = False) -> str:
    volumes = report["volumes"]
    if removed:
        return "".join(f"volume {v['name']} removed\n" for v in volumes)
    if not volumes:
        return "no volumes (a Machine's named volumes are listed here once `vz up` made them)\n"
    rows = [["NAME", "VOLUME", "STATE", "PROJECT", "DRIVER", "ENVIRONMENT/MACHINE"]]
    for v in volumes:
        state = "in use" if v["state"] == "attached" else v["state"]
        owner = f"{v['environment_id']}/{v['machine_id']}"
        rows.append([v["name"], v["volume"], state, v["project_id"], v["driver"], owner])
    lines = _table(rows, indent="")
    if any(v["state"] == "kept" for v in volumes):
        lines.append("kept volumes outlived their Environment: remove one with `vz volume rm NAME`")
    return "\n".join(lines) + "\n"
