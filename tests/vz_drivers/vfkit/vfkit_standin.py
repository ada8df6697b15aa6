"""A stand-in for vfkit: its documented REST API over a real Unix socket, and a stand-in executable.

The REST server follows vfkit's doc/usage.md and pkg/rest: ``GET /vm/state`` (state + can* flags),
``POST /vm/state`` ``{"state": "Stop"|"HardStop"|"Pause"|"Resume"}`` answered 202, 400 for a body it cannot
bind, 500 ``{"error": ...}`` when the change fails; ``GET /vm/inspect`` (vfkit 0.6's configuration object).

``main`` is the stand-in executable: it parses its arguments with ``vfkit_grammar`` (refusing what vfkit would
refuse), writes a console line, serves the REST API on ``--restful-uri``, reports the guest ready on the
``listen``-mode vsock socket, and obeys Stop/HardStop according to its behaviour:

* ``obey``: Stop -> Stopping, then exit 0 (the guest powered off);
* ``ignore-stop``: Stop is accepted but nothing happens; HardStop exits;
* ``ignore-all``: nothing stops it but a signal;
* ``crash``: prints an error to stderr and exits 1 before serving;
* ``never-ready``: serves REST but never reports ready;
* ``agent AGENT_BINARY``: plays the guest too. It reads the Machine's ``config.sh`` from the ``vzcfg`` virtio-fs
  share, runs the real vz guest agent on this host with the arguments of its ``vz_agent_vsock`` line (never
  ``--poweroff``, never as another user), proxies every connection to the agent socket to it (vfkit's
  ``connect`` mode: one vsock connection per host connection), reports ready when the agent does, and ends when
  the agent ends (the guest powered off). Stop sends the agent SIGTERM; HardStop kills it and its processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION_LINE = "vfkit version: v0.6.1"


@dataclass
class StandinVm:
    behaviour: str = "obey"
    state: str = "VirtualMachineStateRunning"
    cpus: int = 2
    memory_bytes: int = 2048 << 20
    devices: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    chunked: bool = False
    agent_pid: int = 0

    def change(self, new: str) -> tuple[int, dict[str, Any] | None]:
        if self.agent_pid and new in ("Stop", "HardStop"):
            _signal_agent(self.agent_pid, hard=new == "HardStop")
            self.state = "VirtualMachineStateStopping"
            return 202, None
        if new == "Stop":
            if self.behaviour in ("obey", "never-ready"):
                self.state = "VirtualMachineStateStopping"
                asyncio.get_running_loop().call_later(0.05, self._halt)
            return 202, None
        if new == "HardStop":
            if self.behaviour == "ignore-all":
                return 500, {"error": 'Error Domain=VZErrorDomain Code=1 "The operation couldn\'t be completed."'}
            self._halt()
            return 202, None
        if new == "Pause":
            self.state = "VirtualMachineStatePaused"
            return 202, None
        if new == "Resume":
            self.state = "VirtualMachineStateRunning"
            return 202, None
        return 500, {"error": f"invalid new VMState: {new}"}

    def _halt(self) -> None:
        self.state = "VirtualMachineStateStopped"
        self.stopped.set()


def _response(status: int, body: dict[str, Any] | None, *, chunked: bool = False) -> bytes:
    reason = {200: "OK", 202: "Accepted", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}
    payload = b"" if body is None else json.dumps(body).encode()
    head = [f"HTTP/1.1 {status} {reason.get(status, 'X')}", "Date: Tue, 01 Dec 2026 09:00:00 GMT"]
    if body is not None:
        head.append("Content-Type: application/json; charset=utf-8")
    if chunked and payload:
        head.append("Transfer-Encoding: chunked")
        half = len(payload) // 2
        chunks = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in (payload[:half], payload[half:]) if p)
        return ("\r\n".join(head) + "\r\n\r\n").encode() + chunks + b"0\r\n\r\n"
    head.append(f"Content-Length: {len(payload)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


async def _handle(vm: StandinVm, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request_line = (await reader.readuntil(b"\r\n")).decode().strip()
        method, path, _version = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        vm.requests.append((method, path, body))
        if (method, path) == ("GET", "/vm/state"):
            out = _response(
                200,
                {
                    "state": vm.state,
                    "canStart": vm.state == "VirtualMachineStateStopped",
                    "canPause": vm.state == "VirtualMachineStateRunning",
                    "canResume": vm.state == "VirtualMachineStatePaused",
                    "canStop": vm.state == "VirtualMachineStateRunning",
                    "canHardStop": True,
                },
                chunked=vm.chunked,
            )
        elif (method, path) == ("POST", "/vm/state"):
            try:
                wanted = json.loads(body)["state"]
                if not isinstance(wanted, str):
                    raise TypeError(wanted)
            except (ValueError, KeyError, TypeError) as exc:
                out = _response(400, {"error": f"cannot bind the request: {exc}"})
            else:
                out = _response(*vm.change(wanted))
        elif (method, path) == ("GET", "/vm/inspect"):
            out = _response(
                200,
                {"vcpus": vm.cpus, "memoryBytes": vm.memory_bytes, "bootloader": {}, "devices": vm.devices},
                chunked=vm.chunked,
            )
        else:
            out = _response(404, {"error": "404 page not found"})
        writer.write(out)
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def serve_rest(path: str, vm: StandinVm) -> asyncio.AbstractServer:
    return await asyncio.start_unix_server(lambda r, w: _handle(vm, r, w), path=path)


def _write(path: Path, line: str) -> None:
    with path.open("a") as fh:
        fh.write(line)


def _signal_agent(pid: int, *, hard: bool) -> None:
    import psutil

    try:
        agent = psutil.Process(pid)
        victims = [*agent.children(recursive=True), agent] if hard else [agent]
    except psutil.Error:
        return
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL if hard else signal.SIGTERM)


def _die_with_parent() -> None:
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def _agent_args(config_sh: Path, run: Path) -> list[str]:
    """The agent arguments of config.sh's ``vz_agent_vsock`` line, made safe to run on a test host."""
    line = next(ln for ln in config_sh.read_text().splitlines() if ln.startswith("vz_agent_vsock "))
    words = shlex.split(line)[3:]  # function name, agent port, ready port
    out: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--":
            out += words[index:]
            break
        if word == "--poweroff":
            index += 1
            continue
        if word in ("--main-user", "--main-workdir"):
            index += 2
            continue
        if word == "--log":
            out += ["--log", str(run / "main.log")]
            index += 2
            continue
        out.append(word)
        index += 1
    return out


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.write_eof()


_PROXIES: set[asyncio.Task[Any]] = set()


async def _proxy(inner: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    task = asyncio.current_task()
    if task is not None:
        _PROXIES.add(task)
        task.add_done_callback(_PROXIES.discard)
    try:
        in_reader, in_writer = await asyncio.open_unix_connection(inner)
    except OSError:
        writer.close()  # what vfkit does when the guest port does not listen yet
        return
    await asyncio.gather(_pipe(reader, in_writer), _pipe(in_reader, writer))
    in_writer.close()
    writer.close()


async def _run_guest(parsed: Any, vm: StandinVm, agent_binary: str) -> None:
    run = Path(parsed.of("virtio-serial")[0].options["logFilePath"]).parent
    cfg = next(d for d in parsed.of("virtio-fs") if d.options["mountTag"] == "vzcfg")
    inner = str(run / "inner.sock")
    read_fd, write_fd = os.pipe()
    # The guest lives in a PID namespace of its own, tied to this process: when the stand-in dies (even by
    # SIGKILL), the kernel kills every process of the "guest", as a VM's processes end with the VM.
    agent = await asyncio.create_subprocess_exec(
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        agent_binary,
        "serve",
        "--listen",
        f"unix:{inner}",
        "--key-from-host",  # as the guest's vz_agent_vsock runs it (the inner socket is the host's only here)
        "--ready-fd",
        str(write_fd),
        *_agent_args(Path(cfg.options["sharedDir"]) / "config.sh", run),
        pass_fds=(write_fd,),
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    os.close(write_fd)
    vm.agent_pid = agent.pid
    agent_sock = next(d for d in parsed.of("virtio-vsock") if "connect" in d.flags).options["socketURL"]
    proxy = await asyncio.start_unix_server(lambda r, w: _proxy(inner, r, w), path=agent_sock)
    ready_line = await asyncio.to_thread(os.read, read_fd, 64)
    os.close(read_fd)
    if ready_line.strip() == b"ready":
        ready = next(d for d in parsed.of("virtio-vsock") if "listen" in d.flags)
        _, writer = await asyncio.open_unix_connection(ready.options["socketURL"])
        writer.write(b"ready\n")
        await writer.drain()
        writer.close()
    await agent.wait()
    proxy.close()
    for task in list(_PROXIES):
        task.cancel()
    await asyncio.gather(*_PROXIES, return_exceptions=True)
    vm.state = "VirtualMachineStateStopped"
    vm.stopped.set()


async def _run(argv: list[str], behaviour: str, version: tuple[int, int, int]) -> int:
    from vfkit_grammar import GrammarError, parse_argv

    try:
        parsed = parse_argv(argv, version)
    except GrammarError as exc:  # cobra: "Error: unknown flag: --nested", usage, exit 1
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    (serial,) = parsed.of("virtio-serial")
    console = Path(serial.options["logFilePath"])
    _write(console, "[    0.000000] Booting Linux on physical CPU 0x0000000000 [stand-in]\n")
    if behaviour == "crash":
        _write(console, "[    0.010000] Kernel panic - not syncing: stand-in\n")
        print(
            'level=fatal msg="Error Domain=VZErrorDomain Code=2 Description=\\"Invalid virtual machine '
            'configuration. The storage device attachment is invalid.\\""',
            file=sys.stderr,
            flush=True,
        )
        return 1
    vm = StandinVm(behaviour=behaviour, cpus=parsed.cpus, memory_bytes=parsed.memory_mib << 20)
    vm.devices = [{"kind": d.kind, **d.options} for d in parsed.devices]
    server = await serve_rest(parsed.restful_path, vm)
    print("INFO[0000] stand-in vfkit serving", flush=True, file=sys.stderr)
    if behaviour.startswith("agent "):
        await _run_guest(parsed, vm, behaviour.split(" ", 1)[1])
    elif behaviour != "never-ready":
        ready = next(d for d in parsed.of("virtio-vsock") if "listen" in d.flags)
        _, writer = await asyncio.open_unix_connection(ready.options["socketURL"])
        writer.write(b"ready\n")
        await writer.drain()
        writer.close()
    await vm.stopped.wait()
    server.close()
    os.unlink(parsed.restful_path)
    return 0


def main(argv: list[str], behaviour_file: str) -> int:
    version_file = Path(behaviour_file).with_name("version")
    version = version_file.read_text().strip() if version_file.exists() else VERSION_LINE.rsplit("v", 1)[1]
    if argv == ["--version"]:
        print(f"vfkit version: v{version}")
        return 0
    behaviour = Path(behaviour_file).read_text().strip()
    numbers = tuple(int(n) for n in version.split("."))
    return asyncio.run(_run(argv, behaviour, (numbers[0], numbers[1], numbers[2])))


def write_executable(directory: Path, behaviour: str = "obey", version: str = "0.6.1") -> Path:
    """A stand-in ``vfkit`` ``version`` in ``directory`` running ``main`` with ``behaviour`` (a vfkit older
    than 0.6.2 refuses ``--nested`` as an unknown flag, as cobra does)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "behaviour").write_text(behaviour)
    (directory / "version").write_text(version)
    script = directory / "vfkit"
    here = os.path.dirname(os.path.abspath(__file__))
    script.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {here!r})\n"
        f"from vfkit_standin import main\nsys.exit(main(sys.argv[1:], {str(directory / 'behaviour')!r}))\n"
    )
    script.chmod(0o755)
    return script
