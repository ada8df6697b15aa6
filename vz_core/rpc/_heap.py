"""The C allocator of a process that moves exec data in wide frames: freed frame buffers kept for the next frame.

Every wide frame allocates buffers of about 1 MiB on each side (the encoded frame, grpcio's slices, the decoded
data). glibc serves allocations that large with mmap and unmaps them when freed, or trims the heap top as soon
as that much is free at once, so the next frame page-faults its buffers in again: about 300 page faults per MiB
moved here, a fifth of a host's exec CPU. ``keep_freed_heap()`` raises both thresholds once per process
(``M_MMAP_THRESHOLD`` 4 MiB, ``M_TRIM_THRESHOLD`` 16 MiB): such buffers then come from the heap and freed memory
waits there for the next frame. The cost is at most 16 MiB of freed heap a process keeps rather than returning
it to the kernel at once. glibc only and best effort; a process whose environment sets either threshold
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) keeps its own choice.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_heap"]

MMAP_THRESHOLD = 4 << 20
"""Bytes: allocations below this come from the heap, not from mmap."""
TRIM_THRESHOLD = 16 << 20
"""Bytes: free memory at the heap top beyond this goes back to the kernel."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_set: bool | None = None


def keep_freed_heap() -> bool:
    """Set the thresholds (once per process); whether they are set."""
    global _set
    if _set is None:
        _set = _apply()
    return _set


def _apply() -> bool:
    if not sys.platform.startswith("linux") or os.environ.keys() & {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library symbol to call
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
