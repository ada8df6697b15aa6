"""What a check gets: the driver under test, the adapter, and helpers that keep failure texts precise.

``DriverSession`` is the connection the cases of one run share (reconnected when a case broke it);
``CheckContext`` is one case's view of it: unique Machine ids (every Machine is deleted after the case),
a private scratch directory, exec helpers, and ``not_applicable`` which only answers after the refusal of the
absent capability was verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from vz_conformance import _capabilities as _cap
from vz_conformance._adapter import Adapter
from vz_conformance._exec import ExecResult, close_iterator, collect
from vz_conformance._expect import describe, ensure, expect_error, expect_ok, fail
from vz_conformance._outcome import NotApplicable
from vz_conformance._providers import DriverProvider, ProviderMode
from vz_core import (
    Capabilities,
    Driver,
    DriverInfo,
    ExecSpec,
    Extensions,
    MachineDetails,
    RecreateMode,
    RunImageRequest,
)

__all__ = ["CheckContext", "ConnectFailedError", "DriverSession"]


class ConnectFailedError(Exception):
    """The driver under test could not be built or launched; every case that needs it fails with this."""


class DriverSession:
    """The driver connection shared by the cases of one run.

    A connection failure is remembered: launching is deterministic, so later cases fail at once with the same
    text instead of waiting for the same timeout again.
    """

    def __init__(self, provider: DriverProvider) -> None:
        self.provider = provider
        self._driver: Driver | None = None
        self._info: DriverInfo | None = None
        self._extensions: Extensions | None = None
        self._connect_error: str | None = None
        self._shared: dict[str, object] = {}
        self._finalizers: list[Callable[[], Awaitable[None]]] = []

    def shared(self, key: str) -> object | None:
        """What a case shared under ``key`` for the rest of the run (None: nothing yet)."""
        return self._shared.get(key)

    def share(self, key: str, value: object, finalizer: Callable[[], Awaitable[None]]) -> None:
        """Keep ``value`` for the later cases of this run; ``finalizer`` runs when the run ends (before the
        connection closes, in reverse order of sharing), so Machines shared by several cases are created once."""
        self._shared[key] = value
        self._finalizers.append(finalizer)

    @property
    def connected(self) -> bool:
        return self._driver is not None

    async def driver(self) -> Driver:
        if self._driver is None:
            if self._connect_error is not None:
                raise ConnectFailedError(self._connect_error)
            try:
                self._driver = await self.provider.connect()
            except Exception as exc:
                self._connect_error = f"connecting the driver failed: {describe(exc)}"
                raise ConnectFailedError(self._connect_error) from exc
            self._info = None
            self._extensions = None
        return self._driver

    async def info(self) -> tuple[DriverInfo, Extensions | None]:
        """Info and extensions of the current connection (fetched once per connection)."""
        driver = await self.driver()
        if self._info is None:
            self._info = await expect_ok("Info", driver.info)
            self._extensions = await expect_ok("Extensions (vz.machine.v1)", driver.extensions)
        return self._info, self._extensions

    async def healthy(self, within: float = 5.0) -> bool:
        """True when the current connection still answers Info."""
        if self._driver is None:
            return True
        try:
            async with asyncio.timeout(within):
                await self._driver.info()
        except Exception:
            return False
        return True

    async def reset(self) -> None:
        """Drop the current connection (the next case reconnects)."""
        driver, self._driver = self._driver, None
        self._info = None
        self._extensions = None
        if driver is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await driver.close()

    async def close(self) -> None:
        while self._finalizers:
            finalizer = self._finalizers.pop()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(120):
                    await finalizer()
        self._shared.clear()
        await self.reset()


_SAFE = re.compile(r"[^a-z0-9-]+")


class CheckContext:
    """One case's handle on the driver under test."""

    def __init__(
        self,
        *,
        case_id: str,
        session: DriverSession,
        adapter: Adapter,
        scratch: Path,
        token: str,
        info: DriverInfo,
        extensions: Extensions | None,
        driver: Driver,
    ) -> None:
        self.case_id = case_id
        self.session = session
        self.adapter = adapter
        self.scratch = scratch
        self.token = token
        self.info = info
        self.extensions = extensions
        self.driver = driver
        self.created: list[str] = []
        self._counter = itertools.count(1)
        self._extra_drivers: list[Driver] = []
        self._on_run_mode: RecreateMode | int | None = None

    # -- what is under test -------------------------------------------------------------------------------

    @property
    def mode(self) -> ProviderMode:
        return self.session.provider.mode

    @property
    def provider(self) -> DriverProvider:
        return self.session.provider

    @property
    def caps(self) -> Capabilities:
        """The declared capabilities (an Info without capabilities declares nothing)."""
        return self.info.capabilities or Capabilities()

    def declared(self, name: str) -> bool:
        """Whether the driver declared capability ``name`` (see ``vz_conformance._capabilities``)."""
        if name == _cap.RECREATE_ON_RUN:
            raise ValueError("use `await ctx.on_run_mode()` for the recreate mode: it needs an Info call")
        return _cap.declared(name, self.info, self.extensions, None)

    @property
    def ext(self) -> Extensions:
        """The declared extensions (no extension service declares nothing)."""
        return self.extensions or Extensions(target_os=(), egress_policies=())

    # -- Machines -----------------------------------------------------------------------------------------

    def new_id(self, purpose: str = "m") -> str:
        """A workspace id no Machine has yet; the Machine is deleted after the case."""
        short = _SAFE.sub("-", self.case_id.split(".", 1)[-1].lower())[:24]
        workspace_id = f"vzc-{self.token}-{short}-{_SAFE.sub('-', purpose.lower())[:16]}-{next(self._counter)}"
        self.track(workspace_id)
        return workspace_id

    def track(self, workspace_id: str) -> None:
        """Delete ``workspace_id`` after the case (for ids a check builds itself)."""
        if workspace_id not in self.created:
            self.created.append(workspace_id)

    def request(self, purpose: str = "m", **changes: Any) -> RunImageRequest:
        """The adapter's request for a new, unique Machine, with ``changes`` applied."""
        base = self.adapter.unique_request(self.new_id(purpose), purpose)
        return replace(base, **changes) if changes else base

    async def create(
        self, purpose: str = "m", *, request: RunImageRequest | None = None, **changes: Any
    ) -> RunImageRequest:
        """RunImage a new Machine (any error fails the case, naming the request)."""
        req = request or self.request(purpose, **changes)
        self.track(req.workspace_id)
        await expect_ok("RunImage", lambda: self.driver.run_image(req), note=f"workspace_id={req.workspace_id!r}")
        return req

    async def find(self, workspace_id: str, *, driver: Driver | None = None) -> MachineDetails | None:
        d = driver or self.driver
        return await expect_ok("Find", lambda: d.find(workspace_id), note=f"workspace_id={workspace_id!r}")

    async def require_status(
        self, workspace_id: str, status: str, *, after: str, driver: Driver | None = None
    ) -> MachineDetails:
        """Find must report the Machine with ``status``; ``after`` names the operation that preceded."""
        details = await self.find(workspace_id, driver=driver)
        if details is None:
            fail("Find", f"found=true with status {status!r} after {after}", "found=false", note=workspace_id)
        if details.state.status != status:
            fail("Find", f"status {status!r} after {after}", f"status {details.state.status!r}", note=workspace_id)
        return details

    async def require_absent(self, workspace_id: str, *, after: str) -> None:
        details = await self.find(workspace_id)
        if details is not None:
            fail(
                "Find", f"found=false after {after}", f"found=true, status {details.state.status!r}", note=workspace_id
            )

    async def require_unchanged(self, workspace_id: str, before: MachineDetails | None, what: str) -> None:
        """Find must answer exactly ``before`` (taken earlier); ``what`` says what must not have changed it."""
        after = await self.find(workspace_id)
        ensure(after == before, "Find", what, f"{before!r} became {after!r}")

    async def on_run_mode(self) -> RecreateMode | int:
        """The recreate mode answered to a host that opted in to recreate-on-run (API 1.3)."""
        if self._on_run_mode is None:
            info = await expect_ok(
                "Info(supports_recreate_on_run=true)", lambda: self.driver.info(supports_recreate_on_run=True)
            )
            self._on_run_mode = (info.capabilities or Capabilities()).recreate_mode
        return self._on_run_mode

    async def recreate(self, request: RunImageRequest) -> None:
        """Replace the Machine the way the driver declares: RunImage(allow_recreate) under ON_RUN, else
        Delete followed by RunImage."""
        if await self.on_run_mode() == RecreateMode.ON_RUN:
            req = replace(request, allow_recreate=True)
            await expect_ok(
                "RunImage(allow_recreate=true)", lambda: self.driver.run_image(req), note=request.workspace_id
            )
            return
        await expect_ok("Delete", lambda: self.driver.delete(request.workspace_id), note=request.workspace_id)
        await expect_ok("RunImage", lambda: self.driver.run_image(request), note=request.workspace_id)

    # -- exec -----------------------------------------------------------------------------------------------

    async def run(
        self,
        workspace_id: str,
        argv: tuple[str, ...],
        stdin: bytes | AsyncIterator[bytes] = b"",
        *,
        user: str = "",
        workdir: str = "",
        env: Mapping[str, str] | None = None,
        within: float = 30.0,
        driver: Driver | None = None,
    ) -> ExecResult:
        """Exec ``argv`` and collect everything (errors propagate for the check to judge)."""
        spec = ExecSpec(workspace_id=workspace_id, argv=argv, user=user, workdir=workdir, environment=dict(env or {}))
        return await collect(driver or self.driver, spec, stdin, within=within)

    async def run_ok(
        self,
        workspace_id: str,
        argv: tuple[str, ...],
        stdin: bytes | AsyncIterator[bytes] = b"",
        *,
        within: float = 30.0,
        driver: Driver | None = None,
    ) -> ExecResult:
        """Exec ``argv``; any error or an unsuccessful exit fails the case."""
        result = await expect_ok(
            "Exec",
            lambda: self.run(workspace_id, argv, stdin, within=within, driver=driver),
            note=f"argv={list(argv)!r}",
        )
        return result.require_success()

    # -- logs ---------------------------------------------------------------------------------------------

    async def logs(self, workspace_id: str, *, within: float = 20.0) -> list[bytes]:
        """Read Logs to its end as the chunks that came (errors propagate for the check to judge); a stream
        still open after ``within`` seconds fails the case: Logs must end once the output so far is sent."""
        chunks: list[bytes] = []
        stream = self.driver.logs(workspace_id)
        try:
            async with asyncio.timeout(within):
                async for chunk in stream:
                    chunks.append(chunk)
        except TimeoutError:
            fail(
                "Logs",
                "a finite stream (it must end once the output so far is sent)",
                f"still open after {within:g} s",
                note=workspace_id,
            )
        finally:
            await close_iterator(stream)
        return chunks

    async def require_stdout(self, workspace_id: str, argv: tuple[str, ...], expected: bytes, what: str) -> None:
        """Exec ``argv`` successfully and require exactly ``expected`` on stdout; ``what`` names the content."""
        result = await self.run_ok(workspace_id, argv)
        ensure(result.stdout == expected, "Exec", what, result.stdout)

    # -- not applicable -------------------------------------------------------------------------------------

    async def not_applicable(
        self, capability: str, refusal: str, verify: Callable[[], Awaitable[object]]
    ) -> NotApplicable:
        """The case does not apply: ``capability`` is declared absent. ``verify`` must prove the refusal
        (it raises AssertionError otherwise, which fails the case)."""
        await verify()
        return NotApplicable(capability=capability, refusal=refusal)

    async def run_image_refused(
        self, capability: str, request: RunImageRequest, what: str, *, note: str
    ) -> NotApplicable:
        """Not applicable: ``capability`` is declared absent, so RunImage of ``request`` (which needs it: ``what``
        says how) must fail UNSUPPORTED and create nothing."""

        async def verify() -> None:
            await expect_error("RunImage", lambda: self.driver.run_image(request), "UNSUPPORTED", note=note)
            await self.require_absent(request.workspace_id, after=f"RunImage with {what} was refused")

        return await self.not_applicable(
            capability, f"RunImage with {what} refused as UNSUPPORTED, nothing created", verify
        )

    # -- more drivers, the wire -----------------------------------------------------------------------------

    async def relaunch(self) -> Driver:
        """A second, independent driver instance (externally: a new plugin process), closed after the case."""
        driver = await expect_ok("connect (relaunch)", self.provider.connect)
        self._extra_drivers.append(driver)
        return driver

    def wire(self) -> contextlib.AbstractAsyncContextManager[grpc.aio.Channel]:
        """A raw ``RuntimeDriver`` channel to the driver under test (wire-level cases)."""
        return self.provider.wire(self.driver)

    async def close_extra(self) -> None:
        for driver in self._extra_drivers:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await driver.close()
        self._extra_drivers.clear()
