"""The adapter: what a driver author tells the suite about their driver.

The suite never guesses how to build a Machine or which commands an image has. An ``Adapter`` says how to
make a unique, initially absent Machine request (image, mounts, options to build or launch the driver) and
the exact argv of every command scenario. The defaults work for any POSIX image (``sh``, ``cat``, ``printf``,
``sleep``, ``id``, ``pwd``, ``printenv``, ``getconf``, ``stat``, ``df``, ``tee``); override what differs.

Every scenario method returns the argv (a tuple of strings) run through Exec, verbatim. Scenario commands
pass data as positional arguments (``sh -c '...' sh ARG``), never by pasting it into a script.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from vz_core import HostRequirements, Mount, MountType, RunImageRequest

__all__ = ["Adapter"]

Argv = tuple[str, ...]


class Adapter:
    """Defaults for a driver whose Machines run a POSIX userland.

    Subclass and override attributes or methods; pass an instance to the runner, the CLI (``--adapter
    module:attr``) or the pytest plugin (the ``pytest_vz_adapter`` hook).
    """

    image: str = "vz:default"
    """Image of every Machine the suite creates (the embedded default needs no download)."""
    local_dir: str = "/var/tmp"
    """A directory on the Machine's own root storage, as a shell word (it may reference variables).
    Files here must survive Stop/Start and disappear when the Machine is recreated."""
    workspace_target: str = "/workspace"
    """Where the workspace mount appears inside the Machine."""
    mount_target_prefix: str = "/mnt/vz-conformance"
    """Parent directory (inside the Machine) of the other mounts the suite requests."""
    exec_user: str = "nobody"
    """A non-root user that exists in the image (exec.user)."""
    identity_users: tuple[str, str] = ("daemon", "nobody")
    """(user, remote_user): two distinct non-root users of the image (identity cases)."""
    exec_workdir: str = "/tmp"
    """An existing directory inside the Machine other than the default working directory (exec.workdir)."""
    processes_visible_on_host: bool = False
    """True when commands run as host processes (psutil sees them); otherwise the suite inspects the
    Machine's ``/proc`` through Exec to check that cancelled commands are gone."""
    resource_request: tuple[int, int] = (1, 512 * 1024 * 1024)
    """(cpus, memory_bytes) the resource case requests; the Machine must see exactly these."""
    impossible_resources: tuple[int, int] = (65536, 1 << 50)
    """(cpus, memory_bytes) no host can grant; RunImage must refuse them before creating anything."""
    storage_request: int = 2 * 1024 * 1024 * 1024
    """Root storage size (bytes) the storage-size case requests."""

    # -- building the driver ------------------------------------------------------------------------------

    def driver_options(self, state_dir: Path) -> dict[str, object]:
        """Keyword options for the in-process factory; ``state_dir`` is a fresh private directory."""
        return {}

    def plugin_args(self, state_dir: Path) -> list[str]:
        """Extra arguments for the plugin binary; ``state_dir`` is a fresh private directory."""
        return []

    def plugin_env(self) -> Mapping[str, str]:
        """Extra environment for the plugin process (never secrets: the suite records it)."""
        return {}

    # -- Machine requests ---------------------------------------------------------------------------------

    def unique_request(self, workspace_id: str, purpose: str) -> RunImageRequest:
        """A request for a Machine that does not exist yet; ``workspace_id`` is already unique. Its one label,
        ``vz.conformance=<purpose>``, is informational: drivers ignore it (docs/driver-authors.md lists every
        ``vz.`` label and which a driver may refuse)."""
        return RunImageRequest(workspace_id=workspace_id, image=self.image, labels=(f"vz.conformance={purpose}",))

    def with_mounts(self, request: RunImageRequest, *mounts: Mount) -> RunImageRequest:
        return replace(request, mounts=tuple(request.mounts) + mounts)

    def with_resources(
        self, request: RunImageRequest, *, cpus: int = 0, memory: int = 0, storage: int = 0
    ) -> RunImageRequest:
        requirements = HostRequirements(cpus=cpus, memory_bytes=memory, storage_bytes=storage)
        return replace(request, host_requirements=requirements)

    def mount_target(self, name: str) -> str:
        return f"{self.mount_target_prefix}/{name}"

    def mount_source(self, kind: MountType, scratch: Path, unique: str) -> str:
        """The source of a mount: a fresh host directory under ``scratch`` for BIND, a unique volume name for
        VOLUME, empty for TMPFS."""
        if kind == MountType.BIND:
            path = scratch / f"bind-{unique}"
            path.mkdir(parents=True, exist_ok=True)
            return str(path)
        if kind == MountType.VOLUME:
            return f"vzc-{unique}"
        return ""

    # -- command scenarios --------------------------------------------------------------------------------

    def cat(self) -> Argv:
        """Copy stdin to stdout byte for byte."""
        return ("cat",)

    def cat_to_stderr(self) -> Argv:
        """Copy stdin to stderr only."""
        return ("sh", "-c", "cat 1>&2")

    def tee_both(self) -> Argv:
        """Copy stdin to both stdout and stderr."""
        return ("sh", "-c", "tee /dev/stderr")

    def true(self) -> Argv:
        """Exit 0 at once without reading stdin."""
        return ("true",)

    def idle(self, seconds: int, marker: str) -> Argv:
        """Wait ``seconds`` without reading stdin; ``marker`` is in the command line of its shell."""
        return ("sh", "-c", f"sleep {int(seconds)} & wait", marker)

    def print_args(self, args: Sequence[str]) -> Argv:
        """Print every argument followed by a NUL byte, verbatim."""
        return ("printf", "%s\\000", *args)

    def shell_command(self) -> tuple[Argv, bytes]:
        """A command that needs a shell, and its exact stdout."""
        return ("sh", "-c", 'a=vz; echo "$a-$((6 * 7))"'), b"vz-42\n"

    def fail_with(self, code: int, message: str) -> Argv:
        """Print ``message`` on stderr and exit with ``code``."""
        return ("sh", "-c", 'printf "%s\\n" "$1" >&2; exit "$2"', "sh", message, str(code))

    def kill_self(self) -> Argv:
        """Terminate by a signal (SIGKILL sent to itself)."""
        return ("sh", "-c", "kill -KILL $$")

    def terminate_self(self) -> Argv:
        """Terminate by SIGTERM sent to itself (the exit is then ``128 + 15``, ``"SIGTERM"``)."""
        return ("sh", "-c", "kill -TERM $$")

    def print_user(self) -> Argv:
        return ("id", "-un")

    def print_workdir(self) -> Argv:
        return ("pwd",)

    def print_env(self, name: str) -> Argv:
        return ("printenv", name)

    def blocking_tree(self, marker: str) -> tuple[Argv, int]:
        """A command that starts a child and a grandchild, prints ``pid <n>`` for each process of the tree and
        ``ready``, then blocks forever; and how many ``pid`` lines it prints. ``marker`` is in the command line
        of every shell of the tree."""
        inner = 'sleep 1000 & echo "pid $!"; echo "pid $$"; wait'
        script = f'echo "pid $$"; sleep 1000 & echo "pid $!"; sh -c {shlex.quote(inner)} "$0-child" & echo ready; wait'
        return ("sh", "-c", script, marker), 4

    def blocking_on_stdin(self, marker: str) -> Argv:
        """Print ``pid <n>`` and ``ready``, then read stdin (which never ends) in that same process; should stdin
        end anyway, keep running (as the same process) so only a real kill ends it."""
        return ("sh", "-c", 'echo "pid $$"; echo ready; while read -r line; do :; done; exec sleep 1000', marker)

    def find_processes(self, pids: Sequence[int], marker: str) -> Argv:
        """Inside the Machine: print ``<pid> <starttime>`` for each of ``pids`` still alive and ``marker <pid>`` for
        every process whose command line contains ``marker``. The marker travels split in two so this command
        does not match itself."""
        head, tail = marker[: len(marker) // 2], marker[len(marker) // 2 :]
        script = (
            'for p in $1; do [ -r /proc/$p/stat ] && echo "$p $(cut -d" " -f22 /proc/$p/stat)"; done; '
            'm="$2$3"; for d in /proc/[0-9]*; do '
            'if tr "\\000" " " < "$d/cmdline" 2>/dev/null | grep -q -F -- "$m"; then echo "marker ${d#/proc/}"; fi; '
            "done; true"
        )
        return ("sh", "-c", script, "sh", " ".join(str(p) for p in pids), head, tail)

    def start_times(self, pids: Sequence[int]) -> Argv:
        """Inside the Machine: print ``<pid> <starttime>`` for each live pid (same format as find_processes)."""
        return self.find_processes(pids, "\x01unused-marker\x01")

    def write_local(self, name: str, data: str) -> Argv:
        """Write ``data`` to the Machine-local file ``name`` (under ``local_dir``)."""
        return ("sh", "-c", f'd={self.local_dir}; mkdir -p "$d" && printf %s "$1" > "$d/$2"', "sh", data, name)

    def read_local(self, name: str) -> Argv:
        """Print the Machine-local file ``name``, or exit 3 silently when it does not exist."""
        return ("sh", "-c", f'd={self.local_dir}; [ -f "$d/$1" ] || exit 3; cat "$d/$1"', "sh", name)

    def write_file(self, path: str, data: str) -> Argv:
        """Write ``data`` to ``path`` inside the Machine (exit non-zero when that is not possible)."""
        return ("sh", "-c", 'printf %s "$2" > "$1"', "sh", path, data)

    def read_file(self, path: str) -> Argv:
        """Print the file at ``path`` inside the Machine, or exit 3 when it does not exist."""
        return ("sh", "-c", '[ -f "$1" ] || exit 3; cat "$1"', "sh", path)

    def list_dir(self, path: str) -> Argv:
        """Print the names in directory ``path``, one per line (nothing for an empty directory)."""
        return ("sh", "-c", 'ls -A "$1"', "sh", path)

    def owner_of(self, path: str) -> Argv:
        """Print the user name owning ``path``."""
        return ("stat", "-c", "%U", path)

    def cpu_count(self) -> Argv:
        """Print the number of online CPUs."""
        return ("getconf", "_NPROCESSORS_ONLN")

    def mem_total_kib(self) -> Argv:
        """Print MemTotal from /proc/meminfo in KiB."""
        return ("sh", "-c", "sed -n 's/^MemTotal: *\\([0-9]*\\) kB/\\1/p' /proc/meminfo")

    def root_size_kib(self) -> Argv:
        """Print the size of the Machine's root filesystem in KiB."""
        return ("sh", "-c", "df -Pk / | awk 'NR==2 {print $2}'")

    def tcp_connect(self, host: str, port: int) -> Argv:
        """Open a TCP connection to host:port and send one line; exit 0 only when that worked."""
        script = (
            'if command -v nc >/dev/null 2>&1; then echo vz-conformance | nc -w 3 "$1" "$2"; '
            'else exec 3<>"/dev/tcp/$1/$2" && echo vz-conformance >&3; fi'
        )
        return ("sh", "-c", script, "sh", host, str(port))

    def logs_main(self, out: str, err: str) -> tuple[str, tuple[str, ...]]:
        """(entrypoint, args) of a main process that writes ``out`` to stdout and ``err`` to stderr (each exactly,
        no newline added) and then keeps running."""
        return "sh", ("-c", 'printf %s "$1"; printf %s "$2" >&2; exec sleep 100000', "sh", out, err)
