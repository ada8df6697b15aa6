"""Assertion helpers: every failure names the RPC, what was expected and what happened.

Errors are classified by their Runtime Protocol category (``category_of``), never by parsing messages. The
suite maps the two asyncio outcomes a caller sees for an abandoned call onto the categories the wire uses:
a cancelled task is CANCELLED and an expired ``asyncio.timeout`` is TIMEOUT, so in-process and external runs
judge the same thing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import NoReturn, TypeVar

import grpc

from vz_core.errors import DriverError

__all__ = [
    "category_of",
    "describe",
    "ensure",
    "expect_error",
    "expect_ok",
    "fail",
]

T = TypeVar("T")


def fail(rpc: str, expected: str, actual: str, *, note: str = "") -> NoReturn:
    """Raise the suite's standard failure: ``<rpc>: expected <expected>; got <actual> (<note>)``."""
    text = f"{rpc}: expected {expected}; got {actual}"
    if note:
        text += f" ({note})"
    raise AssertionError(text)


def ensure(condition: bool, rpc: str, expected: str, actual: object, *, note: str = "") -> None:
    """``fail`` unless ``condition`` holds; ``actual`` is rendered with ``repr`` unless it is a string."""
    if not condition:
        fail(rpc, expected, actual if isinstance(actual, str) else repr(actual), note=note)


def category_of(exc: BaseException) -> str:
    """The Runtime Protocol category an exception stands for ("NOT_FOUND", "CANCELLED", ...).

    ``DriverError`` carries its category; a cancelled asyncio task is "CANCELLED", an expired
    ``asyncio.timeout`` is "TIMEOUT"; a raw gRPC error is classified through the vz_core boundary. Anything
    else is "NOT_A_DRIVER_ERROR", which no check accepts.
    """
    if isinstance(exc, DriverError):
        return exc.code
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELLED"
    if isinstance(exc, TimeoutError):
        return "TIMEOUT"
    if isinstance(exc, grpc.RpcError):
        from vz_core.rpc import error_from_rpc

        return error_from_rpc(exc).code
    return "NOT_A_DRIVER_ERROR"


def describe(exc: BaseException) -> str:
    """One line naming an exception's category, type and message (secrets never reach exceptions)."""
    text = str(exc).strip().replace("\n", " ")
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{category_of(exc)} ({type(exc).__name__}: {text or '<no message>'})"


async def expect_error(
    rpc: str,
    call: Callable[[], Awaitable[object]],
    categories: str | Iterable[str],
    *,
    note: str = "",
    need_message: bool = True,
) -> BaseException:
    """Await ``call()`` and require it to fail with one of ``categories``; return the exception.

    A ``DriverError`` must carry a non-empty message (``need_message``): users act on it.
    """
    wanted = {categories} if isinstance(categories, str) else set(categories)
    shown = " or ".join(sorted(wanted))
    try:
        result = await call()
    except asyncio.CancelledError:
        if "CANCELLED" in wanted and _current_task_not_cancelling():
            return asyncio.CancelledError()
        raise
    except Exception as exc:
        got = category_of(exc)
        if got not in wanted:
            fail(rpc, f"an error of category {shown}", describe(exc), note=note)
        if need_message and isinstance(exc, DriverError) and not exc.message.strip():
            fail(rpc, f"{shown} with a non-empty, actionable message", "an empty message", note=note)
        return exc
    fail(rpc, f"an error of category {shown}", f"success ({_short(result)})", note=note)


async def expect_ok(rpc: str, call: Callable[[], Awaitable[T]], *, note: str = "") -> T:
    """Await ``call()`` and turn any error into a failure that names the RPC."""
    try:
        return await call()
    except asyncio.CancelledError:
        raise
    except AssertionError:
        raise
    except Exception as exc:
        fail(rpc, "success", describe(exc), note=note)


def _current_task_not_cancelling() -> bool:
    task = asyncio.current_task()
    return task is None or task.cancelling() == 0


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
