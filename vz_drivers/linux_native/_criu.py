"""Whether this host can checkpoint a container's processes with CRIU (``runc checkpoint`` / ``restore``).

``support()`` runs ``criu check`` once per process and answers (usable, reason). linux_native does not yet
save Machines' running state through runc, so it declares ``Extensions.save_state`` false whatever the answer,
with the reason: CRIU missing, CRIU refusing this kernel (Debian 12's criu 3.17 cannot read the vDSO layout of
newer kernels: ``Unexpected rt vDSO area bounds``), or the save path not being built.
"""

from __future__ import annotations

import asyncio
import shutil

__all__ = ["NOT_BUILT", "support"]

NOT_BUILT = "linux_native does not save Machines' running state through runc checkpoint/restore yet"
_TIMEOUT = 20.0
_cached: tuple[bool, str] | None = None


async def support(path: str | None = None) -> tuple[bool, str]:
    """(True, version) when ``criu check`` passes on this host, else (False, why); cached unless ``path``
    (a PATH to look for criu in) is given."""
    global _cached
    if path is None and _cached is not None:
        return _cached
    answer = await _check(path)
    if path is None:
        _cached = answer
    return answer


async def _check(path: str | None) -> tuple[bool, str]:
    criu = shutil.which("criu", path=path) or (shutil.which("criu", path="/usr/sbin:/sbin") if path is None else None)
    if criu is None:
        return False, "CRIU is not installed (apt-get install criu)"
    try:
        proc = await asyncio.create_subprocess_exec(
            criu, "check", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(proc.communicate(), _TIMEOUT)
    except (OSError, TimeoutError) as exc:
        return False, f"`{criu} check` could not run: {exc}"
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        errors = [line.strip() for line in text.splitlines() if line.startswith("Error")]
        detail = errors[0] if errors else (text.strip().splitlines() or ["no output"])[-1]
        return False, f"CRIU cannot checkpoint on this host's kernel: `criu check` failed: {detail}"
    return True, text.strip()
