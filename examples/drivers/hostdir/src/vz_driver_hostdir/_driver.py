"""The hostdir driver: a Machine is a directory on the host, and exec runs host processes inside it.

It isolates nothing (commands run as the plugin's own user, with the host's files and network). It shows, in one
file, what every driver does: validate before mutating, keep all state on disk, never use a workspace id as a
path, stream exec output with backpressure, and kill the whole process group on cancellation.

Layout under the state directory::

    machines/<sha256 of the workspace id>/machine.json   the Machine's record (replaced atomically)
    machines/<sha256 of the workspace id>/root/          Machine-local data: the commands' HOME and cwd
    locks/<sha256 of the workspace id>.lock              one lock per Machine, shared by plugin processes
    tmp/                                                 staging for creation and deletion (atomic renames)
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import platform
import pwd
import secrets
import shutil
import signal
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Literal

import vz_core as vz
from vz_core import errors

__all__ = ["IMAGE", "VERSION", "HostdirDriver"]

VERSION = "0.1.0"
IMAGE = "host"
"""The only image: a hostdir Machine runs the host's own programs."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MIN_FREE_BYTES = 64 * 1024 * 1024
HOST_OS = {"linux": "linux", "darwin": "darwin"}.get(sys.platform)
HOST_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())


def _own_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _check_env(env: Mapping[str, str], where: str) -> None:
    for name, value in env.items():  # values are secrets: an error names the variable, never its value
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise errors.InvalidArgumentError(f"{where}: environment variable {name!r} has a bad name or a NUL byte")


def _refuse_unsupported(request: vz.RunImageRequest) -> None:
    """UNSUPPORTED for anything in ``request`` that hostdir cannot honour (never silently ignored)."""
    needs = request.host_requirements or vz.HostRequirements()
    labels = request.label_map()
    me = _own_user()
    refusals = [
        (bool(request.all_mounts()), "hostdir has no mounts (bind, volume or tmpfs); remove them"),
        (bool(needs.cpus or needs.memory_bytes or needs.storage_bytes), "hostdir cannot limit CPUs, memory or disk"),
        (needs.gpu == vz.GpuRequirement.REQUIRED, "hostdir cannot give a Machine a GPU"),
        (request.platform not in ("", f"{HOST_OS}/{HOST_ARCH}"), f"hostdir runs only {HOST_OS}/{HOST_ARCH} here"),
        (bool(request.entrypoint or request.args), "hostdir Machines have no main process; leave entrypoint empty"),
        (request.user not in ("", me) or request.remote_user not in ("", me), f"hostdir runs everything as {me!r}"),
        (bool(request.privileged or request.cap_add or request.security_opt), "hostdir isolates nothing"),
        (bool(request.userns or request.uid_map or request.gid_map), "hostdir maps no user ids"),
        (labels.get("vz.profile", "developer") != "developer", "hostdir offers the 'developer' profile only"),
        ("vz.egress" in labels, "hostdir Machines use the host's network: no egress policy can be enforced"),
        ("vz.network" in labels, "hostdir Machines use the host's network: they cannot join a route domain"),
    ]
    for refused, why in refusals:
        if refused:
            raise errors.UnsupportedError(f"{why}; change the request for Machine {request.workspace_id!r}")


class HostdirDriver(vz.Driver):
    """Machines as host directories under ``state_dir``; every fact lives on disk, none in this object."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state = Path(state_dir).absolute()
        # The process groups of commands this process runs, per Machine, so that Stop and Delete end them.
        self._running: dict[str, set[int]] = {}

    # -- records ---------------------------------------------------------------------------------------------

    def _key(self, workspace_id: str) -> str:
        """The Machine's directory name. Ids may hold "/", ".." or anything else: hash them, never join them."""
        if not workspace_id:
            raise errors.InvalidArgumentError("workspace_id is empty; every call names its Machine")
        return hashlib.sha256(workspace_id.encode()).hexdigest()

    def _dir(self, key: str) -> Path:
        return self.state / "machines" / key

    def _read(self, key: str) -> dict[str, Any] | None:
        try:
            record: dict[str, Any] = json.loads((self._dir(key) / "machine.json").read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise errors.RuntimeFailureError(f"{self._dir(key)} is damaged ({exc}); delete this Machine") from None
        return record

    def _existing(self, key: str, workspace_id: str) -> dict[str, Any]:
        record = self._read(key)
        if record is None:
            raise errors.NotFoundError(f"there is no Machine {workspace_id!r}; create it with RunImage first")
        return record

    def _write(self, directory: Path, record: dict[str, Any]) -> None:
        tmp = directory / "machine.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)  # it holds secret values
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, directory / "machine.json")  # readers see the old record or the new one, never half

    @contextlib.asynccontextmanager
    async def _locked(self, key: str) -> AsyncIterator[None]:
        """Serialize changes to one Machine, also across processes (a host may launch a plugin per call)."""
        (self.state / "locks").mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state / "locks" / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            while True:  # poll rather than block the event loop; giving up (cancellation) is always safe
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.01)
            yield
        finally:
            os.close(fd)  # releases the lock

    # -- discovery -------------------------------------------------------------------------------------------

    async def info(self, *, supports_recreate_on_run: bool = False) -> vz.DriverInfo:
        # DELETE whatever the host supports: hostdir replaces a Machine by Delete + RunImage, never inside RunImage.
        caps = vz.Capabilities(mount_types=(), recreate_mode=vz.RecreateMode.DELETE, provisioning_preflight=True)
        return vz.DriverInfo("hostdir", VERSION, "host-directories", platform.release(), caps)

    async def extensions(self) -> vz.Extensions:
        return vz.Extensions(
            target_os=(HOST_OS or sys.platform,),
            profiles=("developer",),
            facts={"isolation": "none: commands are host processes of the plugin's user"},
            terminal=True,  # Driver.terminal below: `vz exec -it` works
        )

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        if HOST_OS is None or HOST_ARCH is None:
            raise errors.UnsupportedError(
                f"hostdir needs a Linux or macOS host on amd64 or arm64, not {sys.platform} on {platform.machine()}"
            )
        try:
            (self.state / "tmp").mkdir(parents=True, exist_ok=True)
            probe = self.state / "tmp" / f"probe-{secrets.token_hex(4)}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise errors.UnavailableError(
                f"the state directory {self.state} is not writable ({exc.strerror}); pass --state-dir DIR"
            ) from None

    async def provisioning_preflight(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.state).free
        if free < MIN_FREE_BYTES:
            raise errors.UnavailableError(f"only {free >> 20} MiB free under {self.state}; free at least 64 MiB")

    async def target_architecture(self, workspace_id: str) -> str:
        self._key(workspace_id)
        if HOST_ARCH is None:
            raise errors.UnsupportedError(f"this host's CPU {platform.machine()!r} is neither amd64 nor arm64")
        return HOST_ARCH

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def run_image(self, request: vz.RunImageRequest) -> None:
        key = self._key(request.workspace_id)
        if request.image != IMAGE:  # the whole request is checked before anything is touched
            raise errors.InvalidArgumentError(
                f"image {request.image!r} is not available: hostdir Machines use the image {IMAGE!r}"
            )
        _refuse_unsupported(request)
        _check_env(request.environment, "RunImage")
        async with self._locked(key):
            if self._read(key) is not None:  # even with allow_recreate: under DELETE the host deletes first
                raise errors.AlreadyExistsError(f"Machine {request.workspace_id!r} exists; delete it first")
            now = _now()
            record = {
                "workspace_id": request.workspace_id,  # for people reading the state directory
                "id": secrets.token_hex(32),
                "created_at": now,
                "started_at": now,
                "status": "running",
                "labels": request.label_map(),
                "environment": dict(request.environment),
            }
            staging = self.state / "tmp" / f"new-{secrets.token_hex(8)}"
            (staging / "root").mkdir(parents=True, mode=0o700)
            self._write(staging, record)
            self._dir(key).parent.mkdir(parents=True, exist_ok=True)
            os.rename(staging, self._dir(key))  # atomic: a crash never leaves half a Machine

    async def find(self, workspace_id: str) -> vz.MachineDetails | None:
        key = self._key(workspace_id)
        record = self._read(key)
        if record is None:
            return None
        return vz.MachineDetails(
            id=record["id"],
            created_at=record["created_at"],
            state=vz.MachineState(status=record["status"], started_at=record["started_at"]),
            config=vz.MachineConfig(record["labels"], working_dir=str(self._dir(key) / "root"), user=_own_user()),
        )

    async def start(self, workspace_id: str) -> None:
        key = self._key(workspace_id)
        async with self._locked(key):
            record = self._existing(key, workspace_id)
            if record["status"] != "running":
                record.update(status="running", started_at=_now())
                self._write(self._dir(key), record)

    async def stop(self, workspace_id: str) -> None:
        key = self._key(workspace_id)
        async with self._locked(key):
            record = self._existing(key, workspace_id)
            self._kill_commands(key)
            if record["status"] != "stopped":
                record.update(status="stopped")
                self._write(self._dir(key), record)

    async def delete(self, workspace_id: str) -> None:
        key = self._key(workspace_id)
        async with self._locked(key):
            self._kill_commands(key)
            if self._dir(key).exists():
                trash = self.state / "tmp" / f"old-{secrets.token_hex(8)}"
                trash.parent.mkdir(parents=True, exist_ok=True)
                os.rename(self._dir(key), trash)  # gone for Find at once; removing the files may take longer
                await asyncio.to_thread(shutil.rmtree, trash, ignore_errors=True)

    def _kill_commands(self, key: str) -> None:
        for pgid in self._running.get(key, set()):
            _kill_group(pgid)

    # -- exec ------------------------------------------------------------------------------------------------

    async def exec(self, spec: vz.ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[vz.ExecEvent]:
        key = self._key(spec.workspace_id)
        record = self._existing(key, spec.workspace_id)
        if record["status"] != "running":
            raise errors.FailedPreconditionError(f"Machine {spec.workspace_id!r} is stopped; start it first")
        if not spec.argv or any("\0" in arg for arg in spec.argv):
            raise errors.InvalidArgumentError("argv must name a command, and no argument may contain a NUL byte")
        if spec.tty:
            raise errors.UnsupportedError("hostdir has no terminals; run the command without a tty")
        if spec.user not in ("", _own_user()):
            raise errors.UnsupportedError(f"user {spec.user!r}: hostdir runs commands as {_own_user()!r} only")
        _check_env(spec.environment, "Exec")
        root = self._dir(key) / "root"
        cwd = root / spec.workdir  # a relative workdir starts at the Machine's root; an absolute one replaces it
        if not cwd.is_dir():
            raise errors.InvalidArgumentError(f"workdir {spec.workdir!r} is not a directory")
        env = {"PATH": PATH, "HOME": str(root), **record["environment"], **spec.environment, "HOSTDIR_ROOT": str(root)}
        spawning = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *spec.argv,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=vz.MAX_CHUNK,  # asyncio stops reading a pipe with 2 x limit buffered: the command then waits
                process_group=0,  # its own group (to kill all it starts), still in the plugin's session
            )
        )
        try:
            # Shielded: cancelled halfway, asyncio would wait for every process holding the pipes to exit.
            proc = await asyncio.shield(spawning)
        except asyncio.CancelledError:
            spawning.add_done_callback(_kill_spawned)
            raise
        except OSError as exc:  # like a shell: say why on stderr, exit 127 (not found) or 126 (cannot run)
            yield vz.ExecOutput("stderr", f"hostdir: {spec.argv[0]}: {exc.strerror}\n".encode())
            yield vz.ExecExit(127 if isinstance(exc, FileNotFoundError) else 126)
            return
        groups = self._running.setdefault(key, set())
        groups.add(proc.pid)
        try:
            async with contextlib.aclosing(_stream(proc, stdin)) as events:
                async for event in events:
                    yield event
        finally:
            groups.discard(proc.pid)

    # -- terminal sessions (`vz exec -it`) -----------------------------------------------------------------

    def terminal(
        self, spec: vz.TerminalSpec, input: AsyncIterator[vz.TerminalInput]
    ) -> AsyncIterator[vz.TerminalEvent]:
        """A command on a pseudo-terminal of the host. The SDK's ``host_terminal`` does the terminal part (new
        session, controlling terminal, window size, resizes, whole-session cleanup); this method only checks
        the request like ``exec`` and says where and how the command runs."""
        from vz_plugins.terminal import host_terminal

        key = self._key(spec.workspace_id)
        record = self._existing(key, spec.workspace_id)
        if record["status"] != "running":
            raise errors.FailedPreconditionError(f"Machine {spec.workspace_id!r} is stopped; start it first")
        if not spec.argv or any("\0" in arg for arg in spec.argv):
            raise errors.InvalidArgumentError("argv must name a command, and no argument may contain a NUL byte")
        if spec.user not in ("", _own_user()):
            raise errors.UnsupportedError(f"user {spec.user!r}: hostdir runs commands as {_own_user()!r} only")
        _check_env(spec.environment, "ExecPty")
        root = self._dir(key) / "root"
        cwd = root / spec.workdir
        if not cwd.is_dir():
            raise errors.InvalidArgumentError(f"workdir {spec.workdir!r} is not a directory")
        env = {"PATH": PATH, "HOME": str(root), **record["environment"], **spec.environment, "HOSTDIR_ROOT": str(root)}
        groups = self._running.setdefault(key, set())

        async def session() -> AsyncGenerator[vz.TerminalEvent, None]:
            started: list[int] = []

            def on_start(pid: int) -> None:  # Stop and Delete kill it with the Machine's other commands
                started.append(pid)
                groups.add(pid)

            events = host_terminal(
                spec.argv,
                input,
                rows=spec.rows,
                cols=spec.cols,
                term=spec.term,
                env=env,
                cwd=str(cwd),
                on_start=on_start,
            )
            try:
                async with contextlib.aclosing(events) as stream:
                    async for event in stream:
                        yield event
            finally:
                for pid in started:
                    groups.discard(pid)

        return session()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_spawned(spawning: asyncio.Future[asyncio.subprocess.Process]) -> None:
    if not spawning.cancelled() and spawning.exception() is None:
        _kill_group(spawning.result().pid)


async def _stream(proc: asyncio.subprocess.Process, stdin: AsyncIterator[bytes]) -> AsyncGenerator[vz.ExecEvent, None]:
    """The command's output, then its exit. Closed or cancelled before the exit, it kills the command's group."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    writer = proc.stdin
    queue: asyncio.Queue[vz.ExecOutput | None] = asyncio.Queue(maxsize=2)  # output moves as the consumer pulls

    async def read(reader: asyncio.StreamReader, name: Literal["stdout", "stderr"]) -> None:
        while data := await reader.read(vz.MAX_CHUNK):  # 1..MAX_CHUNK bytes, never decoded
            await queue.put(vz.ExecOutput(name, data))
        await queue.put(None)

    async def feed() -> None:
        broken = False
        async for data in stdin:
            if broken:
                continue  # the command stopped reading: keep taking (and dropping) the client's input
            try:
                writer.write(data)
                await writer.drain()  # waits while the pipe is full: a slow command throttles the client
            except (BrokenPipeError, ConnectionResetError):
                broken = True
        writer.close()

    def fed(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            _kill_group(proc.pid)  # the client's input broke: stop the command, that error is raised below

    readers = [asyncio.create_task(read(proc.stdout, "stdout")), asyncio.create_task(read(proc.stderr, "stderr"))]
    feeder = asyncio.create_task(feed())
    feeder.add_done_callback(fed)
    returncode: int | None = None
    try:
        open_pipes = 2
        while open_pipes:
            output = await queue.get()
            if output is None:
                open_pipes -= 1
            else:
                yield output
        returncode = await proc.wait()
    finally:
        if returncode is None:
            _kill_group(proc.pid)  # first and synchronously: nothing below may leave the command alive
        for task in (*readers, feeder):
            task.cancel()
        await asyncio.gather(*readers, feeder, return_exceptions=True)
        if returncode is None:
            await _reap(proc)
    if not feeder.cancelled() and (error := feeder.exception()) is not None:
        raise error
    yield _exit(returncode)


def _exit(returncode: int) -> vz.ExecExit:
    """A shell's convention: a command killed by signal N exits with 128 + N, and the signal is named."""
    if returncode >= 0:
        return vz.ExecExit(returncode)
    try:
        name = signal.Signals(-returncode).name
    except ValueError:  # real-time signals have no name of their own
        name = f"SIG{-returncode}"
    return vz.ExecExit(128 - returncode, name)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """After a kill: read the pipes to their end (asyncio releases a process only then) and collect the exit."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.close()

    async def drain(reader: asyncio.StreamReader) -> None:
        while await reader.read(vz.MAX_CHUNK):
            pass

    with contextlib.suppress(TimeoutError):  # a descendant that left the group may hold a pipe open
        async with asyncio.timeout(5):
            await asyncio.gather(drain(proc.stdout), drain(proc.stderr))
            await proc.wait()
