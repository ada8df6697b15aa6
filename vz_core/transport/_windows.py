"""Windows process-tree ownership: a Job Object that kills its processes when its last handle closes.

The plugin is created suspended, assigned to a job with ``JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`` and only then
resumed, so every process it starts is born inside the job. The host holds the only (non-inheritable)
handle: when the host exits for any reason, Windows closes the handle and terminates the whole job.

Only importable for use on Windows; on other systems every function raises ``PluginError`` saying so.
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import wintypes
from typing import Any

from vz_core.errors import PluginError

__all__ = [
    "CREATE_NEW_PROCESS_GROUP",
    "CREATE_SUSPENDED",
    "assign_and_resume",
    "close_job",
    "create_kill_on_close_job",
    "terminate_job",
]

CREATE_SUSPENDED = 0x00000004
CREATE_NEW_PROCESS_GROUP = 0x00000200
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS = 9
PROCESS_TERMINATE = 0x0001
PROCESS_SET_QUOTA = 0x0100
PROCESS_SUSPEND_RESUME = 0x0800


class _IoCounters(ctypes.Structure):
    _fields_ = [
        ("ReadOperationCount", ctypes.c_ulonglong),
        ("WriteOperationCount", ctypes.c_ulonglong),
        ("OtherOperationCount", ctypes.c_ulonglong),
        ("ReadTransferCount", ctypes.c_ulonglong),
        ("WriteTransferCount", ctypes.c_ulonglong),
        ("OtherTransferCount", ctypes.c_ulonglong),
    ]


class _BasicLimits(ctypes.Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", ctypes.c_int64),
        ("PerJobUserTimeLimit", ctypes.c_int64),
        ("LimitFlags", ctypes.c_uint32),
        ("MinimumWorkingSetSize", ctypes.c_size_t),
        ("MaximumWorkingSetSize", ctypes.c_size_t),
        ("ActiveProcessLimit", ctypes.c_uint32),
        ("Affinity", ctypes.c_size_t),
        ("PriorityClass", ctypes.c_uint32),
        ("SchedulingClass", ctypes.c_uint32),
    ]


class _ExtendedLimits(ctypes.Structure):
    _fields_ = [
        ("BasicLimitInformation", _BasicLimits),
        ("IoInfo", _IoCounters),
        ("ProcessMemoryLimit", ctypes.c_size_t),
        ("JobMemoryLimit", ctypes.c_size_t),
        ("PeakProcessMemoryUsed", ctypes.c_size_t),
        ("PeakJobMemoryUsed", ctypes.c_size_t),
    ]


def _api() -> tuple[Any, Any]:
    if sys.platform != "win32":
        raise PluginError("Windows Job Objects are only available on Windows; this host is " + sys.platform)
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined,unused-ignore]
    ntdll = ctypes.WinDLL("ntdll")  # type: ignore[attr-defined,unused-ignore]
    kernel32.CreateJobObjectW.restype = wintypes.HANDLE
    kernel32.CreateJobObjectW.argtypes = [ctypes.c_void_p, wintypes.LPCWSTR]
    kernel32.SetInformationJobObject.restype = wintypes.BOOL
    kernel32.SetInformationJobObject.argtypes = [wintypes.HANDLE, ctypes.c_int, ctypes.c_void_p, wintypes.DWORD]
    kernel32.OpenProcess.restype = wintypes.HANDLE
    kernel32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
    kernel32.AssignProcessToJobObject.restype = wintypes.BOOL
    kernel32.AssignProcessToJobObject.argtypes = [wintypes.HANDLE, wintypes.HANDLE]
    kernel32.TerminateJobObject.restype = wintypes.BOOL
    kernel32.TerminateJobObject.argtypes = [wintypes.HANDLE, wintypes.UINT]
    kernel32.CloseHandle.restype = wintypes.BOOL
    kernel32.CloseHandle.argtypes = [wintypes.HANDLE]
    ntdll.NtResumeProcess.restype = ctypes.c_long
    ntdll.NtResumeProcess.argtypes = [wintypes.HANDLE]
    return kernel32, ntdll


def _fail(what: str) -> PluginError:
    code = ctypes.get_last_error()  # type: ignore[attr-defined,unused-ignore]
    return PluginError(f"{what} failed (Windows error {code})")


def create_kill_on_close_job() -> int:
    """A new Job Object whose processes die when its last handle is closed."""
    kernel32, _ = _api()
    job = kernel32.CreateJobObjectW(None, None)
    if not job:
        raise _fail("CreateJobObjectW")
    info = _ExtendedLimits()
    info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    if not kernel32.SetInformationJobObject(
        job, JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS, ctypes.byref(info), ctypes.sizeof(info)
    ):
        err = _fail("SetInformationJobObject")
        kernel32.CloseHandle(job)
        raise err
    return int(job)


def assign_and_resume(job: int, pid: int) -> None:
    """Put the (suspended) process ``pid`` into ``job``, then let it run."""
    kernel32, ntdll = _api()
    handle = kernel32.OpenProcess(PROCESS_SET_QUOTA | PROCESS_TERMINATE | PROCESS_SUSPEND_RESUME, False, pid)
    if not handle:
        raise _fail("OpenProcess")
    try:
        if not kernel32.AssignProcessToJobObject(job, handle):
            raise _fail("AssignProcessToJobObject")
        status = ntdll.NtResumeProcess(handle)
        if status != 0:
            raise PluginError(f"NtResumeProcess failed (NTSTATUS {status & 0xFFFFFFFF:#x})")
    finally:
        kernel32.CloseHandle(handle)


def terminate_job(job: object) -> None:
    """Kill every process in the job now."""
    kernel32, _ = _api()
    kernel32.TerminateJobObject(job, 1)


def close_job(job: object) -> None:
    """Close our handle (which kills whatever is still in the job)."""
    kernel32, _ = _api()
    kernel32.CloseHandle(job)
