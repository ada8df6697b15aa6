"""Drive vz from Python with the typed API (docs/api.md): up, status, exec, events, stop, delete.

    python examples/api/lifecycle.py [PROJECT_DIR] [--transport local|grpc]

PROJECT_DIR holds a vz.json (default: examples/fake, one Machine on the reference fake driver, so this runs on
any host). The daemon of VZ_HOME is started on demand, as the CLI would start it. Exit status: 0 when every
step worked, 1 with the API error's message otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vz_core.api import ApiError, Client, default_context


def run(project: Path, transport: str) -> int:
    # The context says where the project is: the daemon selects the Environment exactly as `vz` run there would.
    with Client(transport=transport, context=default_context(cwd=project)) as client:
        with client.events(0) as past:  # System.Events without follow: what happened so far, then the end
            for _ in past:
                pass
        start = past.last_revision  # watch from here after a reconnect and nothing is lost

        # Environments.Up: a stream of progress messages, then one result.
        op = client.up()
        for progress in op:
            if progress.event == "step" and progress.status != "started":
                print(f"  {progress.message}: {progress.status} ({progress.seconds:.2f}s)")
            elif progress.event == "note":
                print(f"  note: {progress.message}")
        result = op.result()
        env = result.environment
        print(f"up: Environment {env.name} ({env.id}) is {env.state}")

        # Environments.Get: the status document with live health from the driver.
        status = client.environment()
        for machine in status.machines:
            health = machine.health or {}
            print(f"machine {machine.name}: {machine.state} (health from {health.get('source')})")

        # Machines.Exec: bytes in, captured bytes out, the command's exit status.
        done = client.exec(["sh", "-c", 'read line; echo "got $line"; echo oops >&2; exit 3'], stdin=b"hello\n")
        print(f"exec: exit {done.exit_code}, stdout {done.stdout!r}, stderr {done.stderr!r}")

        client.stop().result()
        deleted = client.delete().result()
        print(f"delete: {deleted.environment.state}, {len(deleted.machines)} Machine(s) removed")

        # System.Events: every event since we started, with revisions to resume from.
        with client.events(start) as events:
            kinds = [event.kind for event in events]
        print(f"events: {len(kinds)} since revision {start}: {', '.join(sorted(set(kinds)))}")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    default = Path(__file__).resolve().parent.parent / "fake"
    parser.add_argument("project", nargs="?", type=Path, default=default)
    parser.add_argument("--transport", choices=("local", "grpc"), default="local")
    args = parser.parse_args(argv)
    try:
        return run(args.project.resolve(), args.transport)
    except ApiError as exc:
        print(f"error ({exc.kind}, exit {exc.exit_code}): {exc.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
