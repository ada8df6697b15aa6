"""The gRPC servicers of a plugin: translate the request, call the Driver, translate the answer.

Errors cross here exactly once: a ``DriverError`` becomes its status with one RuntimeError detail
(``vz_core.rpc._wire``); anything else becomes RUNTIME_FAILURE with a generic message, the exception text (redacted)
in ``runtime_message`` and the traceback on stderr. Secrets seen in requests (RunImage and Exec environment
values) are registered with the plugin's redactor, so they are masked in every error it sends.

The servicer is faithful: it forwards the driver's exec events and log chunks 1:1 without re-chunking or
repairing them, so the conformance suite sees exactly what the driver produced. It does enforce what the
protocol asks of a *server* on the client's frames (PROTOCOL.md §4) and gates optional calls on the driver's
advertised capabilities.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio
from grpc._cython import cygrpc  # type: ignore[attr-defined]

from vz_core._driver import Driver
from vz_core._proto.devsy.runtime.v1 import runtime_pb2 as pb
from vz_core._proto.devsy.runtime.v1 import runtime_pb2_grpc as pb_grpc
from vz_core._proto.vz.machine.v1 import extensions_pb2 as ext_pb
from vz_core._proto.vz.machine.v1 import extensions_pb2_grpc as ext_grpc
from vz_core._types import DriverInfo, Extensions
from vz_core.errors import DriverError, InvalidArgumentError, RuntimeFailureError, UnsupportedError
from vz_core.redact import Redactor
from vz_core.rpc import _convert, _convert_services
from vz_core.rpc._codec import decode_client, serialize
from vz_core.rpc._frames import start_problem, terminal_start_problem, wide_chunk
from vz_core.rpc._server_exec import DRAIN_TIMEOUT, ExecStream
from vz_core.rpc._wire import error_to_status

__all__ = ["ExtensionsServicer", "RuntimeServicer", "add_servicers", "stop_server"]

_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # end-of-stream marker of context.read()

log = logging.getLogger("vz.plugin")
T = TypeVar("T")


def _redacted(err: DriverError, redactor: Redactor) -> DriverError:
    if not redactor:
        return err
    message = redactor.redact(err.message)
    runtime_message = redactor.redact(err.runtime_message)
    details = {k: redactor.redact(v) for k, v in err.details.items()}
    if message == err.message and runtime_message == err.runtime_message and details == dict(err.details):
        return err
    return type(err)(message or "error", runtime_message=runtime_message, details=details, retryable=err.retryable)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], err: DriverError) -> NoReturn:
    status = error_to_status(err)
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


class _Base:
    def __init__(self, driver: Driver, redactor: Redactor) -> None:
        self._driver = driver
        self._redactor = redactor
        self._info: DriverInfo | None = None
        self._extensions: Extensions | bool | None = False

    def _failure(self, rpc: str, exc: BaseException) -> DriverError:
        log.error("%s: unexpected %s from the driver", rpc, type(exc).__name__, exc_info=exc)
        return RuntimeFailureError(
            f"the driver failed unexpectedly during {rpc}; see the plugin's log for details",
            runtime_message=self._redactor.redact(f"{type(exc).__name__}: {exc}"),
            details={"rpc": rpc},
        )

    def _error(self, rpc: str, exc: Exception) -> DriverError:
        if isinstance(exc, DriverError):
            return _redacted(exc, self._redactor)
        return self._failure(rpc, exc)

    async def _call(self, context: grpc.aio.ServicerContext[Any, Any], rpc: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except Exception as exc:
            err = self._error(rpc, exc)
        await _abort(context, err)

    async def _capabilities_info(self) -> DriverInfo:
        if self._info is None:
            self._info = await self._driver.info()
        return self._info

    async def _driver_extensions(self) -> Extensions | None:
        if self._extensions is False:
            self._extensions = await self._driver.extensions()
        assert self._extensions is not True
        return self._extensions

    async def _gate(self, context: grpc.aio.ServicerContext[Any, Any], rpc: str, flag: str) -> None:
        info = await self._call(context, "Info", self._capabilities_info)
        caps = info.capabilities
        if caps is None or not getattr(caps, flag):
            await _abort(context, UnsupportedError(f"this driver does not advertise {rpc} (capabilities.{flag})"))


class RuntimeServicer(_Base, pb_grpc.RuntimeDriverServicer):
    """``devsy.runtime.v1.RuntimeDriver`` over a Driver.

    ``exec_drain_timeout``: seconds an Exec waits, once it is over, for the client to half-close before
    ending the call anyway (see ``vz_core.rpc._server_exec``).
    """

    def __init__(self, driver: Driver, redactor: Redactor, *, exec_drain_timeout: float = DRAIN_TIMEOUT) -> None:
        super().__init__(driver, redactor)
        self._drain_timeout = exec_drain_timeout

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.InfoResponse:
        info = await self._call(
            context, "Info", lambda: self._driver.info(supports_recreate_on_run=request.supports_recreate_on_run)
        )
        return _convert.info_to_pb(info)

    async def Preflight(
        self, request: pb.PreflightRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PreflightResponse:
        await self._call(
            context, "Preflight", lambda: self._driver.preflight(disable_auto_start=request.disable_auto_start)
        )
        return pb.PreflightResponse()

    async def ProvisioningPreflight(
        self, request: pb.ProvisioningPreflightRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ProvisioningPreflightResponse:
        await self._gate(context, "ProvisioningPreflight", "provisioning_preflight")
        await self._call(context, "ProvisioningPreflight", self._driver.provisioning_preflight)
        return pb.ProvisioningPreflightResponse()

    async def ReusePreflight(
        self, request: pb.ReusePreflightRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ReusePreflightResponse:
        await self._gate(context, "ReusePreflight", "reuse_preflight")
        await self._call(
            context, "ReusePreflight", lambda: self._driver.reuse_preflight(request.workspace_id, request.remote_user)
        )
        return pb.ReusePreflightResponse()

    async def Find(self, request: pb.FindRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.FindResponse:
        details = await self._call(context, "Find", lambda: self._driver.find(request.workspace_id))
        if details is None:
            return pb.FindResponse(found=False)
        return pb.FindResponse(found=True, container=_convert.details_to_pb(details))

    async def TargetArchitecture(
        self, request: pb.TargetArchitectureRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.TargetArchitectureResponse:
        arch = await self._call(
            context, "TargetArchitecture", lambda: self._driver.target_architecture(request.workspace_id)
        )
        return pb.TargetArchitectureResponse(architecture=arch)

    async def RunImage(
        self, request: pb.RunImageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RunImageResponse:
        self._redactor.add_environment(request.environment)
        req = _convert.run_image_from_pb(request)
        await self._call(context, "RunImage", lambda: self._driver.run_image(req))
        return pb.RunImageResponse()

    async def Start(self, request: pb.StartRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.StartResponse:
        await self._call(context, "Start", lambda: self._driver.start(request.workspace_id))
        return pb.StartResponse()

    async def Stop(self, request: pb.StopRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.StopResponse:
        await self._call(context, "Stop", lambda: self._driver.stop(request.workspace_id))
        return pb.StopResponse()

    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.DeleteResponse:
        await self._call(context, "Delete", lambda: self._driver.delete(request.workspace_id))
        return pb.DeleteResponse()

    async def Logs(self, request: pb.LogsRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await self._gate(context, "Logs", "logs")
        error: DriverError | None = None
        chunks: AsyncIterator[bytes] | None = None
        try:
            # Inside the translation: a driver's logs() may raise before it returns its iterator.
            chunks = self._driver.logs(request.workspace_id)
            async for chunk in chunks:
                await context.write(pb.OutputChunk(data=chunk))
        except Exception as exc:
            error = self._error("Logs", exc)
        finally:
            if chunks is not None:
                await _aclose(chunks)
        if error is not None:
            await _abort(context, error)

    async def Exec(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        # Frame-rule violations are refused at once; anything else ends only after the client stopped
        # writing (see vz_core.rpc._server_exec for why).
        first = await context.read()
        if first is _EOF:
            await _abort(context, InvalidArgumentError("exec stream ended before its start frame"))
        if first is MALFORMED:
            await _abort(context, InvalidArgumentError("the first exec frame is not a valid ExecClientMessage"))
        which = first.WhichOneof("payload")
        if which != "start":
            await _abort(
                context,
                InvalidArgumentError(f"the first exec frame must be 'start', got {which or 'an unset payload'}"),
            )
        if (problem := start_problem(first.start)) is not None:
            await _abort(context, InvalidArgumentError(problem))
        self._redactor.add_environment(first.start.environment)
        spec = _convert.exec_spec_from_pb(first.start)
        stream = ExecStream(context, self._drain_timeout, chunk=wide_chunk(context.invocation_metadata()))
        try:
            error: DriverError | None = None
            if spec.tty:
                try:
                    ext = await self._driver_extensions()
                except Exception as exc:
                    error = await stream.refuse(self._error("Exec", exc))
                else:
                    if ext is None or not ext.tty:
                        error = await stream.refuse(UnsupportedError("tty exec is not supported by this driver"))
            if error is None:
                error = await stream.run(lambda stdin: self._driver.exec(spec, stdin), self._exec_error)
        finally:
            await stream.close()
        if error is not None:
            await _abort(context, error)

    def _exec_error(self, exc: BaseException) -> DriverError:
        return self._error("Exec", exc) if isinstance(exc, Exception) else self._failure("Exec", exc)


async def _aclose(stream: object) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


class ExtensionsServicer(_Base, ext_grpc.MachineExtensionsServicer):
    """``vz.machine.v1.MachineExtensions``: UNIMPLEMENTED when the driver has no extensions.

    ``ExecPty`` serves ``Driver.terminal`` when the driver's extensions say ``terminal``, with the Exec
    stream's machinery and rules (``vz_core.rpc._server_exec``), and is UNSUPPORTED otherwise.
    """

    def __init__(
        self,
        driver: Driver,
        redactor: Redactor,
        *,
        exec_drain_timeout: float = DRAIN_TIMEOUT,
        local_exec_socket: str = "",
    ) -> None:
        super().__init__(driver, redactor)
        self._drain_timeout = exec_drain_timeout
        self.local_exec_socket = local_exec_socket
        """Advertised as ``ExtensionsResponse.local_exec_socket`` (``vz_core.rpc._local``); "" = not served."""

    async def Extensions(
        self, request: ext_pb.ExtensionsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ext_pb.ExtensionsResponse:
        ext = await self._call(context, "Extensions", self._driver_extensions)
        if ext is None:
            await _abort(context, UnsupportedError("this driver has no vz.machine.v1 extensions"))
        reply = _convert.extensions_to_pb(ext)
        reply.local_exec_socket = self.local_exec_socket
        reply.volume_removal = self._volume_removal() is not None
        reply.services = self._services_method("set_services") is not None
        return reply

    def _services_method(self, name: str) -> Callable[..., Awaitable[Any]] | None:
        """The driver's optional service methods (``set_services``, ``service_states``, ``service_logs``;
        not part of the Driver base class), or None when it lacks any of them."""
        methods = [getattr(self._driver, n, None) for n in ("set_services", "service_states", "service_logs")]
        if not all(callable(m) for m in methods):
            return None
        method = getattr(self._driver, name)
        return method if callable(method) else None

    async def _services_call(self, context: grpc.aio.ServicerContext[Any, Any], rpc: str, name: str, *args: Any) -> Any:
        method = self._services_method(name)
        if method is None:
            await _abort(context, UnsupportedError("this driver does not supervise services"))
        if not args[0]:
            await _abort(context, InvalidArgumentError("a workspace_id is required"))
        return await self._call(context, rpc, lambda: method(*args))

    async def SetServices(
        self, request: ext_pb.SetServicesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ext_pb.ServiceStatesResponse:
        try:
            specs = tuple(_convert_services.spec_from_pb(m) for m in request.services)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        states = await self._services_call(context, "SetServices", "set_services", request.workspace_id, specs)
        return _convert_services.states_to_pb(states)

    async def ServiceStates(
        self, request: ext_pb.ServiceStatesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ext_pb.ServiceStatesResponse:
        states = await self._services_call(context, "ServiceStates", "service_states", request.workspace_id)
        return _convert_services.states_to_pb(states)

    async def ServiceLogs(
        self, request: ext_pb.ServiceLogsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ext_pb.ServiceLogsResponse:
        data = await self._services_call(
            context, "ServiceLogs", "service_logs", request.workspace_id, request.name, request.tail_bytes
        )
        return ext_pb.ServiceLogsResponse(data=data)

    def _volume_removal(self) -> Callable[[str], Awaitable[None]] | None:
        """The driver's optional ``delete_volume`` (not part of the Driver base class), or None."""
        remove = getattr(self._driver, "delete_volume", None)
        return remove if callable(remove) else None

    async def DeleteVolume(
        self, request: ext_pb.DeleteVolumeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ext_pb.DeleteVolumeResponse:
        remove = self._volume_removal()
        if remove is None:
            await _abort(context, UnsupportedError("this driver has no volume-removal operation"))
        if not request.name:
            await _abort(context, InvalidArgumentError("a volume name is required"))
        await self._call(context, "DeleteVolume", lambda: remove(request.name))
        return ext_pb.DeleteVolumeResponse()

    async def ExecPty(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        first = await context.read()
        if first is _EOF:
            await _abort(context, InvalidArgumentError("terminal stream ended before its start frame"))
        if first is MALFORMED:
            await _abort(context, InvalidArgumentError("the first terminal frame is not a valid PtyClientMessage"))
        which = first.WhichOneof("payload")
        if which != "start":
            await _abort(
                context,
                InvalidArgumentError(f"the first terminal frame must be 'start', got {which or 'an unset payload'}"),
            )
        if (problem := terminal_start_problem(first.start)) is not None:
            await _abort(context, InvalidArgumentError(problem))
        self._redactor.add_environment(first.start.environment)
        spec = _convert.terminal_spec_from_pb(first.start)
        stream = ExecStream(context, self._drain_timeout, terminal=True)
        try:
            error: DriverError | None = None
            try:
                ext = await self._driver_extensions()
            except Exception as exc:
                error = await stream.refuse(self._error("ExecPty", exc))
            else:
                if ext is None or not ext.terminal:
                    error = await stream.refuse(
                        UnsupportedError("this driver does not serve terminal sessions (extensions.terminal)")
                    )
            if error is None:
                error = await stream.run(lambda keys: self._driver.terminal(spec, keys), self._terminal_error)
        finally:
            await stream.close()
        if error is not None:
            await _abort(context, error)

    def _terminal_error(self, exc: BaseException) -> DriverError:
        return self._error("ExecPty", exc) if isinstance(exc, Exception) else self._failure("ExecPty", exc)


MALFORMED: Any = _convert.MALFORMED
"""What a request or frame that is not a valid protobuf message of its type decodes to (see ``add_servicers``)."""


def _lenient(cls: Any) -> Callable[[bytes], Any]:
    from_string = cls.FromString
    direct = cls is pb.ExecClientMessage  # stdin frames decoded without a message (vz_core.rpc._codec)

    def decode(raw: bytes) -> Any:
        if direct and (frame := decode_client(raw)) is not None:
            return frame
        try:
            return from_string(raw)
        except Exception:  # google.protobuf.message.DecodeError, or a RuntimeWarning-free variant of it
            return MALFORMED

    return decode


def _checked(method: Callable[[Any, Any], Awaitable[Any]], rpc: str, cls: Any) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if request is MALFORMED:
            await _abort(context, InvalidArgumentError(f"{rpc}: the request is not a valid {cls.DESCRIPTOR.name}"))
        return await method(request, context)

    return handler


def _register(server: grpc.aio.Server, module: Any, service: str, servicer: object) -> None:
    """Like the generated ``add_*Servicer_to_server``, but an undecodable request is INVALID_ARGUMENT.

    grpcio answers a request its deserializer cannot decode with INTERNAL and no RuntimeError detail; the
    protocol wants INVALID_ARGUMENT with exactly one. So requests decode to ``MALFORMED`` instead, refused by
    the handler (unary requests) or by the exec frame rules (stream frames).
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in module.DESCRIPTOR.services_by_name[service.rpartition(".")[2]].methods:
        request_cls = getattr(module, method.input_type.name)
        implementation = getattr(servicer, method.name)
        decode, encode = _lenient(request_cls), serialize  # a message, or an exec frame encoded already
        if method.client_streaming:
            factory = (
                grpc.stream_stream_rpc_method_handler
                if method.server_streaming
                else grpc.stream_unary_rpc_method_handler
            )
            handlers[method.name] = factory(implementation, request_deserializer=decode, response_serializer=encode)
        else:
            factory = (
                grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
            )
            handlers[method.name] = factory(
                _checked(implementation, method.name, request_cls),
                request_deserializer=decode,
                response_serializer=encode,
            )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)  # type: ignore[attr-defined]


def add_servicers(
    server: grpc.aio.Server,
    driver: Driver,
    redactor: Redactor,
    *,
    exec_drain_timeout: float = DRAIN_TIMEOUT,
    local_exec_socket: str = "",
) -> None:
    """Serve ``driver`` on ``server``: ``devsy.runtime.v1.RuntimeDriver`` and ``vz.machine.v1.MachineExtensions``.

    ``local_exec_socket``: the path of a ``LocalExecServer`` serving the same driver, advertised in Extensions.
    """
    runtime = RuntimeServicer(driver, redactor, exec_drain_timeout=exec_drain_timeout)
    _register(server, pb, "devsy.runtime.v1.RuntimeDriver", runtime)
    extensions = ExtensionsServicer(
        driver, redactor, exec_drain_timeout=exec_drain_timeout, local_exec_socket=local_exec_socket
    )
    _register(server, ext_pb, "vz.machine.v1.MachineExtensions", extensions)


class _ShutdownReports(logging.Filter):
    """Drops grpcio's ERROR reports about calls that our own server stop ends.

    While a server stops, a stream still open (a host's idle broker or stdio stream, an exec past the grace
    period) is cancelled, and a host may close its connection at the same moment (go-plugin's ``Kill()``
    closes it right after Shutdown answers). grpcio then logs, with a traceback from its own code, either the
    CancelledError of the task that waited for the call's close, or the ExecuteBatchError of a final status
    that can no longer be delivered, although nothing failed. Installed only once ``stop_server`` begins;
    only those two exception types from grpcio's server logger are dropped, every other report still shows.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _SHUTDOWN_NOISE)


_SHUTDOWN_NOISE: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    *((cls,) if isinstance(cls := getattr(cygrpc, "ExecuteBatchError", None), type) else ()),
)
_QUIET = _ShutdownReports()


async def stop_server(server: grpc.aio.Server, grace: float | None) -> None:
    """``server.stop(grace)`` without grpcio's tracebacks for the calls the stop ends (``_ShutdownReports``).

    The filter stays on grpcio's logger afterwards (the reports come from callbacks that may run later): call
    this only when the process, or the test, is done serving.
    """
    logging.getLogger("grpc._cython.cygrpc").addFilter(_QUIET)  # idempotent
    await server.stop(grace)
