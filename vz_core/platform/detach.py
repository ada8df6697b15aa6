"""Starting the daemon detached from the command that starts it.

POSIX: a new session (``start_new_session``: no controlling terminal, no signals of the caller's process
group). Windows has no ``fork``/``setsid``: a subprocess in a new process group and without a console
(``CREATE_NEW_PROCESS_GROUP | DETACHED_PROCESS``), so Ctrl-C in the caller's console never reaches it.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

__all__ = ["detach_options"]


def detach_options() -> dict[str, Any]:
    """Keyword arguments for ``subprocess.Popen`` that start a process detached from ours."""
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.DETACHED_PROCESS}
    return {"start_new_session": True}
