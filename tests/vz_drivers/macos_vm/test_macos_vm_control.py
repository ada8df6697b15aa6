"""The VM helper's control logic and JSON-lines protocol, against a stand-in VZVirtualMachine."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from macos_fakes import PAUSED, RUNNING, STOPPED, FakeVM, QueueThread

from vz_drivers.macos_vm._control import MAX_LINE, ControlError, ControlServer, VmController, decode, encode


@pytest.fixture
def queue() -> Iterator[QueueThread]:
    q = QueueThread()
    yield q
    q.close()


def _controller(
    queue: QueueThread, *, save_restore: bool = True, guest_stops: bool = True
) -> tuple[VmController, FakeVM]:
    stopped = threading.Event()
    vm = FakeVM(stopped, guest_stops=guest_stops)
    controller = VmController(
        vm, dispatch=queue.dispatch, url=lambda p: ("file-url", p), save_restore=save_restore, stopped=stopped
    )
    return controller, vm


def test_start_runs_on_the_vm_queue_and_is_idempotent(queue: QueueThread) -> None:
    controller, vm = _controller(queue)
    assert controller.start() == "running"
    assert controller.start() == "running"
    assert vm.calls == ["start"]
    assert set(vm.queue_thread) == {"fake-vm-queue"}


def test_stop_asks_the_guest_first(queue: QueueThread) -> None:
    controller, vm = _controller(queue)
    controller.start()
    assert controller.stop(timeout=5) == ("stopped", False)
    assert vm.calls == ["start", "requestStop"]
    assert controller.stopped.is_set()


def test_stop_forces_after_the_bounded_wait(queue: QueueThread) -> None:
    controller, vm = _controller(queue, guest_stops=False)
    controller.start()
    assert controller.stop(timeout=0.2) == ("stopped", True)
    assert vm.calls == ["start", "requestStop", "stop"]
    assert vm.vm_state == STOPPED


def test_stopping_a_stopped_vm_succeeds_without_calls(queue: QueueThread) -> None:
    controller, vm = _controller(queue)
    assert controller.stop(timeout=1) == ("stopped", False)
    assert vm.calls == []


def test_save_pauses_saves_and_stops_and_never_overwrites(queue: QueueThread, tmp_path: Path) -> None:
    controller, vm = _controller(queue)
    controller.start()
    target = tmp_path / "state.vzvmsave"
    assert controller.save(str(target)) == "stopped"
    assert vm.calls == ["start", "pause", "save", "stop"]
    assert target.read_bytes() == b"saved state"
    with pytest.raises(ControlError, match="never overwritten"):
        controller.save(str(target))


def test_a_failed_save_resumes_the_vm(queue: QueueThread, tmp_path: Path) -> None:
    controller, vm = _controller(queue)
    controller.start()
    vm.fail["save"] = "the disk is full"
    with pytest.raises(ControlError, match="save failed: the disk is full"):
        controller.save(str(tmp_path / "s"))
    assert vm.calls[-1] == "resume" and vm.vm_state == RUNNING
    assert not controller.stopped.is_set()


def test_restore_then_resume(queue: QueueThread, tmp_path: Path) -> None:
    controller, vm = _controller(queue)
    saved = tmp_path / "s"
    saved.write_bytes(b"state")
    assert controller.start(restore=str(saved)) == "running"
    assert vm.calls == ["restore", "resume"]
    with pytest.raises(ControlError, match="no saved state"):
        controller.restore(str(tmp_path / "missing"))


def test_save_and_restore_need_macos_14(queue: QueueThread, tmp_path: Path) -> None:
    controller, vm = _controller(queue, save_restore=False)
    controller.start()
    (tmp_path / "s").write_bytes(b"x")
    with pytest.raises(ControlError, match="macOS 14"):
        controller.save(str(tmp_path / "t"))
    with pytest.raises(ControlError, match="macOS 14"):
        controller.restore(str(tmp_path / "s"))
    assert vm.calls == ["start"]


def test_handle_answers_every_request_with_one_response(queue: QueueThread) -> None:
    controller, vm = _controller(queue)
    assert controller.handle({"id": 1, "op": "state"}) == {
        "id": 1,
        "ok": True,
        "state": "stopped",
        "save_restore": True,
    }
    assert controller.handle({"id": 2, "op": "start"})["state"] == "running"
    vm.vm_state = PAUSED
    assert controller.handle({"id": 3, "op": "state"})["state"] == "paused"
    bad = controller.handle({"id": 4, "op": "bogus"})
    assert bad == {"id": 4, "ok": False, "error": "unknown op 'bogus'; use one of start, stop, state, save, restore"}
    assert controller.handle({"id": 5, "op": "save"}) == {"id": 5, "ok": False, "error": "missing field 'path'"}
    vm.fail["start"] = "the hardware model is not supported"
    vm.vm_state = STOPPED
    failed = controller.handle({"id": 6, "op": "start"})
    assert failed["ok"] is False and "the hardware model is not supported" in failed["error"]


def test_lines_are_bounded() -> None:
    assert decode(encode({"op": "state"})) == {"op": "state"}
    with pytest.raises(ValueError, match="exceeds"):
        encode({"op": "x" * MAX_LINE})
    with pytest.raises(ValueError, match="JSON object"):
        decode(b"[1]\n")


def test_the_server_speaks_json_lines_on_a_private_socket(queue: QueueThread, tmp_path: Path) -> None:
    controller, _vm = _controller(queue)
    path = tmp_path / "control.sock"
    server = ControlServer(controller, path)
    thread = server.serve_in_thread()
    try:
        assert path.stat().st_mode & 0o777 == 0o600
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
            reader = client.makefile("rb")
            client.sendall(encode({"id": 1, "op": "start"}) + encode({"id": 2, "op": "state"}) + b"not json\n")
            replies = [json.loads(reader.readline()) for _ in range(3)]
            reader.close()
        assert [r["id"] for r in replies] == [1, 2, None]
        assert replies[1]["state"] == "running"
        assert replies[2]["ok"] is False and replies[2]["error"].startswith("bad request")
    finally:
        server.close()
    thread.join(5)
    assert not thread.is_alive()
    assert not path.exists()
