"""The VM helper process: one headless macOS VM, its control socket and its agent relay (macOS only).

Run by the plugin as ``python -m vz_drivers.macos_vm._helper --plan PLAN.json --control SOCK --agent SOCK``
in its own session, so that the VM outlives the plugin (a relaunched plugin finds it by the record's pid).
Virtualization.framework needs a run loop on the thread that owns the VM: the main thread runs it; the
control server (``_control``) and the agent relay run in threads and hand every framework call to the main
queue. The agent relay accepts connections on ``--agent`` (a Unix socket in the Machine's ``chan``
directory) and joins each to a new virtio-socket connection to the guest agent's port. The process exits
with 0 when the guest powered off or was stopped, 1 when the VM stopped with an error or could not start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vz_drivers.macos_vm._control import ControlServer, VmController, listen_private
from vz_drivers.macos_vm._plan import AGENT_PORT, plan_from_json
from vz_drivers.macos_vm._realize import Frameworks, Realizer, load_frameworks

__all__ = ["main"]


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class AgentRelay:
    """Unix socket on the host side, one virtio-socket connection to ``port`` in the guest per client."""

    def __init__(self, path: Path, connect: Callable[[], socket.socket]) -> None:
        self._connect = connect
        self._sock = listen_private(path)
        self._path = path

    def serve_in_thread(self) -> None:
        threading.Thread(target=self._accept, name="vz-macos-agent-relay", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._join, args=(client,), daemon=True).start()

    def _join(self, client: socket.socket) -> None:
        try:
            guest = self._connect()
        except OSError as exc:
            print(f"agent relay: cannot reach the guest agent: {exc}", file=sys.stderr, flush=True)
            client.close()
            return
        with client, guest:
            back = threading.Thread(target=_pump, args=(guest, client), daemon=True)
            back.start()
            _pump(client, guest)
            back.join()

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()


def _run(args: argparse.Namespace, fw: Frameworks) -> int:
    import objc  # type: ignore[import-not-found]  # PyObjC, present wherever Virtualization is

    foundation = fw.foundation
    plan = plan_from_json(json.loads(Path(args.plan).read_text()))
    config = Realizer(fw).configuration(plan, save_restore=bool(args.restore))
    vm = fw.vz.VZVirtualMachine.alloc().initWithConfiguration_(config)
    main_queue = foundation.NSOperationQueue.mainQueue()
    stopped = threading.Event()
    outcome = {"code": 0}

    def dispatch(fn: Callable[[], None]) -> None:
        main_queue.addOperationWithBlock_(fn)

    nsobject: Any = objc.lookUpClass("NSObject")

    class VmDelegate(nsobject):  # type: ignore[misc]
        def guestDidStopVirtualMachine_(self, _vm: Any) -> None:
            print("the guest powered off", file=sys.stderr, flush=True)
            stopped.set()

        def virtualMachine_didStopWithError_(self, _vm: Any, error: Any) -> None:
            print(f"the VM stopped with an error: {error.localizedDescription()}", file=sys.stderr, flush=True)
            outcome["code"] = 1
            stopped.set()

    delegate = VmDelegate.alloc().init()
    vm.setDelegate_(delegate)
    controller = VmController(
        vm, dispatch=dispatch, url=foundation.NSURL.fileURLWithPath_, save_restore=plan.save_restore, stopped=stopped
    )

    def connect_guest() -> socket.socket:
        done = threading.Event()
        box: dict[str, Any] = {}

        def handler(connection: Any, error: Any) -> None:
            box["conn"], box["error"] = connection, error
            done.set()

        dispatch(lambda: vm.socketDevices()[0].connectToPort_completionHandler_(args.agent_port, handler))
        if not done.wait(30) or box.get("conn") is None:
            error = box.get("error")
            raise OSError(error.localizedDescription() if error is not None else "timed out")
        connection = box["conn"]
        sock = socket.socket(fileno=os.dup(connection.fileDescriptor()))
        dispatch(connection.close)  # our dup keeps the stream; the framework's descriptor is released
        return sock

    control = ControlServer(controller, Path(args.control))
    relay = AgentRelay(Path(args.agent), connect_guest)
    try:

        def boot() -> None:
            try:
                if args.restore:
                    try:
                        controller.start(args.restore)
                    except Exception as exc:
                        # A state that cannot be restored is dropped: the Machine boots from its disk instead.
                        print(f"restoring {args.restore} failed ({exc}); booting instead", file=sys.stderr, flush=True)
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(args.restore)
                        controller.start("")
                else:
                    controller.start("")
                print("the VM is running", file=sys.stderr, flush=True)
            except Exception as exc:
                print(f"the VM did not start: {exc}", file=sys.stderr, flush=True)
                outcome["code"] = 1
                stopped.set()

        control.serve_in_thread()
        relay.serve_in_thread()
        _signal_ready(b"ready")
        threading.Thread(target=boot, name="vz-macos-boot", daemon=True).start()
        loop = foundation.NSRunLoop.currentRunLoop()
        while not stopped.is_set():
            # Each turn handles the queued framework calls; the stop event ends the loop within a second.
            loop.runMode_beforeDate_(
                foundation.NSDefaultRunLoopMode, foundation.NSDate.dateWithTimeIntervalSinceNow_(1.0)
            )
    finally:
        relay.close()
        control.close()
    return outcome["code"]


def _daemonize(log: Path) -> int | None:
    """Fork: the parent waits for the child's "ready" (its sockets listen), prints the child's pid and returns
    its exit status; the child (a new session, stdio to ``log``) returns None and goes on. A pipe carries the
    word, not a sleep."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:
            word = reader.read(64)
        if word.startswith(b"ready"):
            print(pid, flush=True)  # the plugin records this process as the Machine's
            return 0
        sys.stderr.write((word or b"the helper exited before it was ready").decode(errors="replace") + "\n")
        return 1
    os.close(read_end)
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ["VZ_MACOS_HELPER_READY_FD"] = str(write_end)
    return None


def _signal_ready(word: bytes) -> None:
    fd = os.environ.pop("VZ_MACOS_HELPER_READY_FD", "")
    if fd:
        with contextlib.suppress(OSError):
            os.write(int(fd), word)
            os.close(int(fd))


def _install(args: argparse.Namespace, fw: Frameworks) -> int:
    from vz_drivers.macos_vm._host import _version
    from vz_drivers.macos_vm._install import install_base

    foundation = fw.foundation
    main_queue = foundation.NSOperationQueue.mainQueue()
    outcome = {"code": 1}
    finished = threading.Event()

    def work() -> None:
        try:
            install_base(
                fw,
                lambda fn: main_queue.addOperationWithBlock_(fn),
                base_dir=Path(args.base_dir),
                ipsw=Path(args.ipsw),
                sha256=args.sha256,
                disk_bytes=args.disk_bytes,
                host_macos=_version(platform.mac_ver()[0]),
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
            outcome["code"] = 0
        except Exception as exc:
            print(f"install failed: {exc}", file=sys.stderr, flush=True)
        finally:
            finished.set()

    threading.Thread(target=work, name="vz-macos-install", daemon=True).start()
    loop = foundation.NSRunLoop.currentRunLoop()
    while not finished.is_set():
        loop.runMode_beforeDate_(foundation.NSDefaultRunLoopMode, foundation.NSDate.dateWithTimeIntervalSinceNow_(1.0))
    return outcome["code"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vz_drivers.macos_vm._helper")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one Machine's VM (detaches once its sockets listen)")
    run.add_argument("--plan", required=True, help="the VM plan (JSON, from vz_drivers.macos_vm._plan)")
    run.add_argument("--control", required=True, help="Unix socket path of the control protocol")
    run.add_argument("--agent", required=True, help="Unix socket path relayed to the guest agent")
    run.add_argument("--agent-port", type=int, default=AGENT_PORT)
    run.add_argument("--log", required=True, help="the detached helper's stdout and stderr")
    run.add_argument("--restore", default="", help="start by restoring this saved state file")
    install = commands.add_parser("install", help="install a restore image into a base directory")
    install.add_argument("--base-dir", required=True)
    install.add_argument("--ipsw", required=True)
    install.add_argument("--sha256", required=True)
    install.add_argument("--disk-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    if platform.system() != "Darwin":
        print("the macOS VM helper runs on macOS only", file=sys.stderr)
        return 2
    if args.command == "install":
        return _install(args, load_frameworks())
    status = _daemonize(Path(args.log))
    if status is not None:
        return status
    try:
        return _run(args, load_frameworks())
    except Exception as exc:
        _signal_ready(f"error: {exc}".encode()[:4000])
        raise


if __name__ == "__main__":
    sys.exit(main())
