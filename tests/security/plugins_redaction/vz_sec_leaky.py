"""Test-only driver "sec_leaky": the fake driver, except that the calls named in the control file fail with a
message quoting the value it names, as a careless backend that kept a Machine's secret might.

The control file (``$VZ_SEC_CONTROL``, set by the plugin script the test writes) holds
``{"leak": "preflight,find,delete,stop,exec", "value": "..."}`` and is read at every call: the vz daemon keeps
this plugin warm across commands, so each command's test setting is written there before the command runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

from vz_conformance.fake import FakeDriver

from vz_core import ExecSpec
from vz_core.errors import FailedPreconditionError, RuntimeFailureError
from vz_core.registry import BuiltinDriver, hookimpl


def _control() -> dict[str, str]:
    try:
        with open(os.environ["VZ_SEC_CONTROL"]) as f:
            data: dict[str, str] = json.load(f)
    except (KeyError, OSError, ValueError):
        return {}
    return data


def _leaks(call: str) -> bool:
    return call in _control().get("leak", "").split(",")


def _error(call: str) -> RuntimeFailureError:
    value = _control().get("value", "")
    return RuntimeFailureError(
        f"{call} failed: backend said token={value} was refused (and {value})",
        runtime_message=f"diagnostic: {value}",
    )


class LeakyDriver(FakeDriver):
    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        if _leaks("preflight"):
            raise _error("preflight")
        await super().preflight(disable_auto_start=disable_auto_start)

    async def find(self, workspace_id: str) -> Any:
        if _leaks("find"):
            raise _error("find")
        return await super().find(workspace_id)

    async def delete(self, workspace_id: str) -> None:
        if _leaks("delete"):
            raise _error("delete")
        await super().delete(workspace_id)

    async def stop(self, workspace_id: str) -> None:
        if _leaks("stop"):
            raise _error("stop")
        await super().stop(workspace_id)

    def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> Any:
        if _leaks("exec"):
            value = _control().get("value", "")
            raise FailedPreconditionError(f"exec refused: token={value}")
        return super().exec(spec, stdin)


@hookimpl
def vz_builtin_drivers() -> list[BuiltinDriver]:
    return [
        BuiltinDriver(
            name="sec_leaky",
            summary="test only: the fake driver whose errors quote a secret",
            factory="vz_sec_leaky:LeakyDriver",
        )
    ]
