"""Test-only drivers. "blocking": the fake driver, except that its first RunImage never returns. "leaky": the
fake driver whose RunImage fails with a message quoting the Machine's environment values (as a careless
backend might), to prove vz masks secrets in what it shows and records. "talking": the fake driver whose
Machines' main process prints "one", "two", "three", then "four" once the file named by its ``go`` option
exists, then sleeps (a log to read with `vz status --logs`).

The vz daemon runs every driver out of process, so a test adds one of these as an external driver
(``vzcli.add_test_driver``): a plugin script, pinned by its SHA-256 in a manifest, that puts this directory on
its ``sys.path`` and serves the declaration below through ``vz_core.registry``'s plugin main. RunImage of
"blocking" creates the Machine, writes the marker file named by the ``once`` option (and
``vz-test-blocking: holding RunImage`` to the plugin's stderr, i.e. the daemon's log) and waits forever, so a
test can kill `vz up` or the daemon at a known point. The marker makes every later RunImage behave normally.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

from vz_conformance.fake import FakeDriver

from vz_core import RunImageRequest
from vz_core.errors import RuntimeFailureError
from vz_core.registry import BuiltinDriver, hookimpl


class BlockingDriver(FakeDriver):
    def __init__(self, once: str, **options: Any) -> None:
        super().__init__(**options)
        self._once = Path(once)

    async def run_image(self, request: RunImageRequest) -> None:
        await super().run_image(request)
        if self._once.exists():
            return
        self._once.write_text("blocked once\n")
        sys.stderr.write("vz-test-blocking: holding RunImage\n")
        sys.stderr.flush()
        await asyncio.Event().wait()


class TalkingDriver(FakeDriver):
    def __init__(self, go: str, **options: Any) -> None:
        super().__init__(**options)
        self._go = go

    async def run_image(self, request: RunImageRequest) -> None:
        script = (
            f"echo one; echo two; echo three; while [ ! -e {self._go} ]; do sleep 0.05; done; echo four; "
            "exec sleep 100000"
        )
        await super().run_image(dataclasses.replace(request, entrypoint="sh", args=("-c", script)))


class LeakyDriver(FakeDriver):
    async def run_image(self, request: RunImageRequest) -> None:
        raise RuntimeFailureError(f"backend rejected environment {dict(request.environment)}")


@hookimpl
def vz_builtin_drivers() -> list[BuiltinDriver]:
    return [
        BuiltinDriver(
            name="blocking",
            summary="test only: the fake driver whose first RunImage never returns",
            factory="vz_test_blocking:BlockingDriver",
        ),
        BuiltinDriver(
            name="talking",
            summary="test only: the fake driver whose Machines' main process prints a few lines",
            factory="vz_test_blocking:TalkingDriver",
        ),
        BuiltinDriver(
            name="leaky",
            summary="test only: RunImage fails quoting the environment values",
            factory="vz_test_blocking:LeakyDriver",
        ),
    ]
