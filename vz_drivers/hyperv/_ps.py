"""Running fixed PowerShell scripts with their arguments as data, and reading their answers as JSON.

Every script is a constant of this package (``vz_drivers.hyperv._scripts``): no user value is ever written into
script text. A script reads its arguments from ``$a``, an object parsed with ``ConvertFrom-Json`` from the
environment variable ``VZ_HYPERV_ARGS`` (a JSON document the host writes), and its answer is one line on
stdout, ``VZJSON:<json>``, made by ``ConvertTo-Json -Compress`` from an envelope ``{ok, value}`` or
``{ok: false, error: {message, id, category, type}}``; non-ASCII characters are escaped as ``\\uXXXX`` so the
console code page cannot garble them. Nothing is ever parsed from PowerShell's formatted text output.

The process is ``powershell.exe -NoProfile -NonInteractive -Command -`` with the script on stdin. In that mode
PowerShell reads stdin like typed input, statement by statement, and a statement spanning lines ends at an
empty line: so the whole script is one top-level statement (a script block invoked with ``&``), its body
has no empty line, and the text ends with one. ``script_text`` builds it; tests check those properties.

``ScriptRunner`` is what the backend calls; ``PowerShellRunner`` is the real one, and tests use a stand-in that
checks each script's cmdlets and parameters against the documented parameter sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from vz_core.errors import (
    DriverError,
    NotFoundError,
    PermissionDeniedError,
    RuntimeFailureError,
    RuntimeTimeoutError,
    UnavailableError,
)

__all__ = [
    "ARGS_ENV",
    "MARKER",
    "PowerShellRunner",
    "Script",
    "ScriptError",
    "ScriptRunner",
    "parse_answer",
    "script_text",
]

ARGS_ENV = "VZ_HYPERV_ARGS"
"""The environment variable carrying a script's arguments (JSON)."""
MARKER = "VZJSON:"
"""The prefix of the one stdout line that carries a script's answer."""
_OUTPUT_LIMIT = 1 << 20


@dataclass(frozen=True)
class Script:
    """A fixed PowerShell script: ``body`` uses ``$a`` (the arguments) and its last value is the answer."""

    name: str
    body: str
    args: tuple[str, ...] = ()
    """The argument names the body reads (``$a.<name>``); a call must give exactly these."""
    depth: int = 5
    """``ConvertTo-Json -Depth`` of the answer."""


class ScriptError(RuntimeFailureError):
    """A script ended with a PowerShell error; ``error_id`` is its ``FullyQualifiedErrorId``."""

    def __init__(self, message: str, *, error_id: str = "", category: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.error_id = error_id
        self.ps_category = category


class ScriptRunner(Protocol):
    """Runs one of the package's scripts with ``args`` and returns its answer (JSON-decoded)."""

    async def run(self, script: Script, args: Mapping[str, Any], *, timeout: float) -> Any: ...  # noqa: ASYNC109


def script_text(script: Script) -> str:
    """The complete text sent on stdin: arguments parsed from ``VZ_HYPERV_ARGS``, the body, the envelope."""
    body = [line for line in script.body.strip("\n").splitlines() if line.strip()]
    lines = [
        "& {",
        "$ErrorActionPreference = 'Stop'",
        "$ProgressPreference = 'SilentlyContinue'",
        "try {",
        f"$a = [Environment]::GetEnvironmentVariable('{ARGS_ENV}') | ConvertFrom-Json",
        "$vzValue = & {",
        *body,
        "}",
        "$vzAnswer = @{ ok = $true; value = $vzValue }",
        "} catch {",
        "$vzAnswer = @{ ok = $false; error = @{ message = [string]$_.Exception.Message;"
        " id = [string]$_.FullyQualifiedErrorId; category = [string]$_.CategoryInfo.Category;"
        " type = [string]$_.Exception.GetType().FullName } }",
        "}",
        f"$vzJson = ConvertTo-Json -InputObject $vzAnswer -Depth {script.depth} -Compress",
        "$vzJson = [regex]::Replace($vzJson, '[^\\x20-\\x7E]', { param($m) '\\u{0:x4}' -f [int][char]$m.Value })",
        f"[Console]::Out.Write('{MARKER}' + $vzJson + [char]10)",
        "}",
        "",
        "",
    ]
    return "\n".join(lines)


def _problem(script: Script, what: str, out: bytes, err: bytes) -> RuntimeFailureError:
    return RuntimeFailureError(
        f"Hyper-V script {script.name!r} {what}",
        runtime_message=(err or out).decode("utf-8", "replace")[-4000:],
        details={"script": script.name},
    )


def _classify(script: Script, error: Mapping[str, Any]) -> DriverError:
    message = str(error.get("message") or "no message")
    category = str(error.get("category") or "")
    error_id = str(error.get("id") or "")
    text = f"Hyper-V {script.name}: {message}"
    details = {"script": script.name, "error_id": error_id[:200], "category": category}
    if category in ("PermissionDenied", "SecurityError") or "UnauthorizedAccess" in error_id:
        return PermissionDeniedError(
            f"{text} (run vz as a member of Hyper-V Administrators; creating and deleting Machines also needs an "
            "elevated prompt: see docs/drivers/hyperv.md)",
            details=details,
        )
    if category == "ObjectNotFound":
        return NotFoundError(text, details=details)
    if category == "ResourceUnavailable":
        return UnavailableError(text, details=details)
    return ScriptError(text, error_id=error_id, category=category, details=details)


def parse_answer(script: Script, out: bytes, err: bytes = b"") -> Any:
    """The value of the ``VZJSON:`` line of ``out``; the script's error raised as a ``DriverError``."""
    answer: Any = None
    for line in reversed(out.splitlines()):
        if line.startswith(MARKER.encode()):
            try:
                answer = json.loads(line[len(MARKER) :])
            except ValueError:
                raise _problem(script, "answered with malformed JSON", out, err) from None
            break
    else:
        raise _problem(script, "gave no answer (is this Windows PowerShell with the Hyper-V module?)", out, err)
    if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
        raise _problem(script, "answered without its envelope", out, err)
    if answer["ok"]:
        return answer.get("value")
    error = answer.get("error")
    raise _classify(script, error if isinstance(error, dict) else {})


def check_args(script: Script, args: Mapping[str, Any]) -> None:
    """A call must give exactly the arguments the script reads (a typo would silently be ``$null``)."""
    if set(args) != set(script.args):
        missing = sorted(set(script.args) - set(args))
        extra = sorted(set(args) - set(script.args))
        raise RuntimeFailureError(
            f"script {script.name!r} called with wrong arguments (missing {missing}, extra {extra})"
        )


class PowerShellRunner:
    """The real runner: one ``powershell.exe -NoProfile -NonInteractive -Command -`` process per script."""

    def __init__(self, executable: str = "powershell.exe") -> None:
        self.executable = executable

    def argv(self) -> list[str]:
        return [self.executable, "-NoProfile", "-NonInteractive", "-Command", "-"]

    async def run(self, script: Script, args: Mapping[str, Any], *, timeout: float) -> Any:  # noqa: ASYNC109 - bounds the script
        check_args(script, args)
        env = dict(os.environ)
        env[ARGS_ENV] = json.dumps(dict(args), ensure_ascii=True)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as exc:
            raise UnavailableError(
                f"cannot run {self.executable} ({exc.strerror or exc}); the hyperv driver needs Windows PowerShell "
                "with the Hyper-V module"
            ) from None
        try:
            async with asyncio.timeout(timeout):
                out, err = await proc.communicate(script_text(script).encode("ascii"))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise RuntimeTimeoutError(
                f"Hyper-V script {script.name!r} did not finish within {timeout:g} s", details={"script": script.name}
            ) from None
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        return parse_answer(script, out[-_OUTPUT_LIMIT:], err[-_OUTPUT_LIMIT:])
