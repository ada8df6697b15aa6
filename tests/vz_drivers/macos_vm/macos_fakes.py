"""A tiny stand-in for the Virtualization.framework and Foundation object model (tests only).

Objects record the initializer they were made with and every property set on them, so a test can read back
what the realizer built. ``FakeVM`` plays a ``VZVirtualMachine`` for the control logic: completion handlers
run at once unless the test says otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

APPLE_CLASSES = (
    "VZVirtualMachineConfiguration",
    "VZMacPlatformConfiguration",
    "VZMacHardwareModel",
    "VZMacMachineIdentifier",
    "VZMacAuxiliaryStorage",
    "VZMacOSBootLoader",
    "VZVirtioBlockDeviceConfiguration",
    "VZDiskImageStorageDeviceAttachment",
    "VZVirtioNetworkDeviceConfiguration",
    "VZNATNetworkDeviceAttachment",
    "VZMACAddress",
    "VZVirtioSocketDeviceConfiguration",
    "VZVirtioFileSystemDeviceConfiguration",
    "VZSingleDirectoryShare",
    "VZSharedDirectory",
    "VZMacGraphicsDeviceConfiguration",
    "VZMacGraphicsDisplayConfiguration",
    "VZVirtioEntropyDeviceConfiguration",
    "VZVirtioTraditionalMemoryBalloonDeviceConfiguration",
    "VZMacOSRestoreImage",
    "VZVirtualMachine",
    "VZMacOSInstaller",
)


QUEUE_BOUND = ("VZVirtualMachine", "VZMacOSInstaller")


class FakeError:
    def __init__(self, text: str) -> None:
        self.text = text

    def localizedDescription(self) -> str:
        return self.text


class FakeObject:
    def __init__(self, model: FakeFramework, cls: str) -> None:
        self._model = model
        self.cls = cls
        self.made_by: str | None = None
        self.args: tuple[Any, ...] = ()
        self.props: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("init"):

            def init(*args: Any) -> Any:
                self._model.check_queue(self.cls, name)
                self.made_by, self.args = name, args
                self._model.made.append(self)
                if name == "initCreatingStorageAtURL_hardwareModel_options_error_":
                    with open(args[0][1], "wb") as fh:  # the framework creates the file
                        fh.write(b"aux")
                refused = self._model.refuse.get(self.cls)
                if name.endswith("error_"):
                    return (None, FakeError(refused)) if refused else (self, None)
                return self

            return init
        if name.startswith("set") and name.endswith("_"):
            return lambda value: self.props.__setitem__(name[3:-1], value)
        if name.endswith("WithCompletionHandler_"):

            def call(handler: Callable[..., None]) -> None:
                self._model.check_queue(self.cls, name)
                self._model.completed.append((self.cls, name))
                failure = self._model.fail.get(name)
                handler(FakeError(failure) if failure else None)

            return call
        raise AttributeError(name)

    def dataRepresentation(self) -> bytes:
        return f"{self.cls}:{id(self)}".encode()

    def validateWithError_(self, _error: None) -> tuple[bool, Any]:
        self._model.validated.append(self)
        text = self._model.invalid
        return (False, FakeError(text)) if text else (True, None)

    def validateSaveRestoreSupportWithError_(self, _error: None) -> tuple[bool, Any]:
        self._model.save_validated.append(self)
        return (False, FakeError("a device cannot be saved")) if self._model.no_save else (True, None)


class FakeClass:
    def __init__(self, model: FakeFramework, name: str) -> None:
        self._model = model
        self.name = name

    def alloc(self) -> FakeObject:
        return FakeObject(self._model, self.name)

    # VZVirtualMachineConfiguration class properties
    def minimumAllowedCPUCount(self) -> int:
        return self._model.limits[0]

    def maximumAllowedCPUCount(self) -> int:
        return self._model.limits[1]

    def minimumAllowedMemorySize(self) -> int:
        return self._model.limits[2]

    def maximumAllowedMemorySize(self) -> int:
        return self._model.limits[3]

    # VZMacOSRestoreImage
    def loadFileURL_completionHandler_(self, url: Any, handler: Callable[..., None]) -> None:
        self._model.loaded.append(url)
        handler(FakeRestoreImage(self._model), None)


class FakeHardwareModel:
    def __init__(self, supported: bool) -> None:
        self.supported = supported

    def isSupported(self) -> bool:
        return self.supported

    def dataRepresentation(self) -> bytes:
        return b"hw-model"


class FakeRequirements:
    def __init__(self, model: FakeFramework) -> None:
        self._model = model

    def hardwareModel(self) -> FakeHardwareModel:
        return FakeHardwareModel(self._model.hardware_supported)

    def minimumSupportedCPUCount(self) -> int:
        return 2

    def minimumSupportedMemorySize(self) -> int:
        return 4 << 30


class FakeRestoreImage:
    def __init__(self, model: FakeFramework) -> None:
        self._model = model

    def buildVersion(self) -> str:
        return "23F79"

    def mostFeaturefulSupportedConfiguration(self) -> FakeRequirements | None:
        return FakeRequirements(self._model) if self._model.installable else None


class FakeFramework:
    """``Virtualization`` as a module-like object; ``without`` drops classes (an older macOS)."""

    def __init__(self, *, without: Iterable[str] = (), limits: tuple[int, int, int, int] = (1, 8, 1 << 30, 16 << 30)):
        self._names = set(APPLE_CLASSES) - set(without)
        self.limits = limits
        self.refuse: dict[str, str] = {}
        self.invalid = ""
        self.no_save = False
        self.validated: list[FakeObject] = []
        self.save_validated: list[FakeObject] = []
        self.made: list[FakeObject] = []
        self.completed: list[tuple[str, str]] = []
        self.fail: dict[str, str] = {}
        self.loaded: list[Any] = []
        self.installable = True
        self.hardware_supported = True
        self.queue: QueueThread | None = None
        """When set, a VM object (``QUEUE_BOUND``) made or messaged off this queue's thread is an error: Apple's
        VZVirtualMachine documentation requires every operation on the VM's queue (the main queue unless made
        with ``initWithConfiguration_queue_``), and so do VZMacOSInstaller's (it drives the VM)."""
        self.off_queue: list[tuple[str, str, str]] = []

    def check_queue(self, cls: str, selector: str) -> None:
        if self.queue is None or cls not in QUEUE_BOUND or self.queue.on_queue():
            return
        self.off_queue.append((cls, selector, threading.current_thread().name))
        raise RuntimeError(f"{cls}.{selector} called off the VM's queue (thread {threading.current_thread().name})")

    def __getattr__(self, name: str) -> FakeClass:
        if name.startswith("_") or name not in self._names:
            raise AttributeError(name)
        return FakeClass(self, name)


class _NSURL:
    @staticmethod
    def fileURLWithPath_(path: str) -> tuple[str, str]:
        return ("file-url", path)


class _NSData:
    @staticmethod
    def dataWithContentsOfFile_(path: str) -> bytes | None:
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError:
            return None


class FakeFoundation:
    NSURL = _NSURL
    NSData = _NSData


# -- a VZVirtualMachine stand-in -------------------------------------------------------------------------

STOPPED, RUNNING, PAUSED = 0, 1, 2


class FakeVM:
    """Records every framework call in ``calls``; ``guest_stops`` says whether requestStop powers the guest off."""

    def __init__(self, stopped: threading.Event, *, guest_stops: bool = True) -> None:
        self.stopped = stopped
        self.guest_stops = guest_stops
        self.vm_state = STOPPED
        self.calls: list[str] = []
        self.fail: dict[str, str] = {}
        self.queue_thread: list[str] = []

    def _done(self, name: str, handler: Callable[..., None], new_state: int | None) -> None:
        self.calls.append(name)
        self.queue_thread.append(threading.current_thread().name)
        if name in self.fail:
            handler(FakeError(self.fail[name]))
            return
        if new_state is not None:
            self.vm_state = new_state
        handler(None)

    def state(self) -> int:
        return self.vm_state

    def startWithCompletionHandler_(self, handler: Callable[..., None]) -> None:
        self._done("start", handler, RUNNING)

    def stopWithCompletionHandler_(self, handler: Callable[..., None]) -> None:
        self._done("stop", handler, STOPPED)

    def pauseWithCompletionHandler_(self, handler: Callable[..., None]) -> None:
        self._done("pause", handler, PAUSED)

    def resumeWithCompletionHandler_(self, handler: Callable[..., None]) -> None:
        self._done("resume", handler, RUNNING)

    def saveMachineStateToURL_completionHandler_(self, url: Any, handler: Callable[..., None]) -> None:
        if "save" not in self.fail:
            with open(url[1], "wb") as fh:
                fh.write(b"saved state")
        self._done("save", handler, None)

    def restoreMachineStateFromURL_completionHandler_(self, url: Any, handler: Callable[..., None]) -> None:
        self._done("restore", handler, PAUSED)

    def canRequestStop(self) -> bool:
        return self.vm_state == RUNNING

    def requestStopWithError_(self, _error: None) -> tuple[bool, Any]:
        self.calls.append("requestStop")
        if self.guest_stops:
            # The guest powers off a moment later (the framework's delegate call).
            def power_off() -> None:
                self.vm_state = STOPPED
                self.stopped.set()

            threading.Timer(0.05, power_off).start()
        return True, None


class QueueThread:
    """A serial queue on its own thread (the framework's main queue in the helper)."""

    def __init__(self) -> None:
        import queue

        self._q: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="fake-vm-queue", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (fn := self._q.get()) is not None:
            fn()

    def dispatch(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)

    def on_queue(self) -> bool:
        return threading.current_thread() is self._thread

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(5)
