"""The public gRPC front end: MSService.Predict, wire-compatible with MindSpore Serving."""

import collections
import os
import ssl
from collections import Counter

import grpc
from google.protobuf.message import DecodeError

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.limits import Limits
from mindspore_serving.frontends import h2grpc, replies, request_ids
from mindspore_serving.frontends.address import check_address, check_max_msg_mb_size, check_unix_address
from mindspore_serving.frontends.api_groups import Access
from mindspore_serving.frontends.auth import ApiKeyInterceptor
from mindspore_serving.frontends.drain import CUT_ANSWER_S, Drain, DrainingFrontend, GuardedBackend, GuardedDispatcher
from mindspore_serving.frontends.errors import grpc_error
from mindspore_serving.frontends.grpc_llm import predict_stream
from mindspore_serving.frontends.health import HealthServicer, always_ready
from mindspore_serving.frontends.kserve import add_kserve_servicer
from mindspore_serving.proto import ms_service_pb2, ms_service_pb2_grpc

SERVICE_NAME = "mindspore.serving.proto.MSService"
SERVER_KIND = os.environ.get("MS_SERVING_GRPC_SERVER", "h2grpc")  # or "grpcio"


class MSServiceServicer(ms_service_pb2_grpc.MSServiceServicer):
    """Converts and delegates. Errors travel in error_msg with status OK, as in MindSpore Serving, except those
    that frontends/errors.py ends with a status: back-pressure (RESOURCE_EXHAUSTED) and a request-wide unavailable
    error, a stopping server's included (UNAVAILABLE: retry later)."""

    def __init__(self, dispatcher, llm_backend=None, drain: Drain | None = None):
        self.drain = drain or Drain()
        self.dispatcher = GuardedDispatcher(dispatcher, self.drain)
        self.llm_backend = None if llm_backend is None else GuardedBackend(llm_backend, self.drain)

    async def PredictStream(self, request, context):
        """Token streaming for LLM servables (see frontends/grpc_llm.py)."""
        request_ids.bind_grpc(context)
        if not self.drain.accepting:
            await _abort(context, self.drain.refusal())
        if self.llm_backend is None:
            yield replies.error_reply(request.servable_spec, errors.ServableUnavailable("streaming is not available"))
            return
        kind = f"gRPC PredictStream {request.servable_spec.name}"
        self.drain.enter(kind)
        try:
            async for reply in predict_stream(self.llm_backend, request):
                yield reply
        except errors.ServingError as err:  # one that ends the call with a status rather than a reply
            await _abort(context, err)
        finally:
            self.drain.leave(kind)

    async def Predict(self, request, context):
        request_ids.bind_grpc(context)
        spec = request.servable_spec
        if not self.drain.accepting:
            await _abort(context, self.drain.refusal())
        kind = f"gRPC Predict {spec.name}.{spec.method_name}"
        self.drain.enter(kind)
        try:
            # the client's deadline bounds the calls to the workers too (None: the master's default)
            results = await self.dispatcher.predict(spec, request.instances, timeout=context.time_remaining())
        except errors.ServingError as err:  # a stopping server's cut included: UNAVAILABLE below
            results = err
        except Exception as err:
            log.exception("Predict failed")
            return replies.error_reply(spec, err)
        finally:
            self.drain.leave(kind)
        failure = replies.global_error(results)  # the request failed as a whole
        if failure is not None and grpc_error(failure)[0] is not grpc.StatusCode.OK:
            await context.abort(grpc_error(failure)[0], errors.message_of(failure))
        if isinstance(results, errors.ServingError):
            return replies.error_reply(spec, results)
        return replies.predict_reply(spec, results)


async def _abort(context, error: errors.ServingError):
    status, _ = grpc_error(error)
    await context.abort(status, errors.message_of(error))


def _decode(raw: bytes) -> "ms_service_pb2.PredictRequest":
    """The PredictRequest in `raw`; InvalidInputs when it is not one (the client's fault, not the server's)."""
    try:
        return ms_service_pb2.PredictRequest.FromString(raw)
    except DecodeError as err:
        raise errors.InvalidInputs(
            f"the request is not a valid mindspore.serving.proto.PredictRequest ({len(raw)} bytes): {err}"
        ) from None


def add_servicer(servicer: MSServiceServicer, server):
    """Registers MSService like the generated `add_MSServiceServicer_to_server`, but decodes requests itself:
    gRPC's own decoding would end a malformed request with UNKNOWN "Unexpected DecodeError"; here it ends with
    INVALID_ARGUMENT and a message that says so."""

    async def predict(raw, context):
        try:
            request = _decode(raw)
        except errors.InvalidInputs as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, err.message)
        return await servicer.Predict(request, context)

    async def predict_stream(raw, context):
        try:
            request = _decode(raw)
        except errors.InvalidInputs as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, err.message)
        async for reply in servicer.PredictStream(request, context):
            yield reply

    serialize = ms_service_pb2.PredictReply.SerializeToString
    handlers = {
        "Predict": grpc.unary_unary_rpc_method_handler(predict, response_serializer=serialize),
        "PredictStream": grpc.unary_stream_rpc_method_handler(predict_stream, response_serializer=serialize),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def read_ssl_files(ssl_config):
    """(private key, certificate chain, root certificates or None) read from the PEM files of a server
    SSLConfig, the clients' CA only with verify_client, as MindSpore Serving reads them. A file that cannot be read
    raises open()'s own error; contents gRPC cannot use fail the server's start."""

    def read(path):
        with open(path, "rb") as stream:
            return stream.read()

    certificate = read(ssl_config.certificate)
    private_key = read(ssl_config.private_key)
    root = read(ssl_config.custom_ca) if ssl_config.verify_client else None
    return private_key, certificate, root


def _credentials(ssl_config):
    """The port's TLS for the server SERVER_KIND names: an ssl.SSLContext for h2grpc, which loads the PEM files
    itself, grpcio's credentials from the files' contents otherwise."""
    try:
        if SERVER_KIND != "grpcio":
            return h2grpc.ssl_context(
                ssl_config.certificate, ssl_config.private_key, ssl_config.custom_ca, bool(ssl_config.verify_client)
            )
        private_key, certificate, root = read_ssl_files(ssl_config)
        return grpc.ssl_server_credentials(
            [(private_key, certificate)], root_certificates=root, require_client_auth=bool(ssl_config.verify_client)
        )
    except (ValueError, TypeError, ssl.SSLError) as err:
        raise RuntimeError(f"Serving Error: load ssl config failed: {err}") from err


class GrpcFrontend(DrainingFrontend):
    def __init__(
        self,
        address: str,
        max_msg_mb_size: int,
        ssl_config,
        dispatcher,
        extra_servicers=(),
        llm_backend=None,
        readiness=None,
        model_control=None,
        reuse_port: bool = False,
        api_key: str | None = None,
        limits: Limits = Limits(),
        access: Access | None = None,
        readiness_changes=None,
    ):
        check_max_msg_mb_size(max_msg_mb_size)
        if address.startswith("unix:"):
            check_unix_address(address)
        else:
            check_address(address, "Serving gRPC")
        self.address = address
        self.max_bytes = max_msg_mb_size * 1024 * 1024
        self.ssl_config = ssl_config
        self.dispatcher = dispatcher
        self.extra_servicers = extra_servicers
        self.llm_backend = llm_backend
        self.model_control = model_control
        self.reuse_port = reuse_port  # the port is shared with front-end processes (SO_REUSEPORT)
        self.access = access or Access(api_key)  # the key each RPC needs (api_groups.py)
        self.limits = limits
        self.drain = Drain()
        # grpc.health.v1, following the master's readiness
        self.health = HealthServicer(readiness or always_ready, limits.max_watch_streams, readiness_changes)
        self.server = None

    def _new_server(self):
        """The HTTP/2 server of this port: ours (h2grpc) unless MS_SERVING_GRPC_SERVER=grpcio asks for grpcio's."""
        # beyond max_concurrent_rpcs a call ends at once with RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!";
        # a connection is closed after read_timeout without its first call (grpcio: without its handshake) or a
        # body's stall, or idle_timeout without a call; beyond max_connections h2grpc refuses a connection's calls
        # and grpcio closes it
        limits = self.limits
        if SERVER_KIND == "grpcio":
            options = [
                ("grpc.max_send_message_length", self.max_bytes),
                ("grpc.max_receive_message_length", self.max_bytes),
                ("grpc.so_reuseport", int(self.reuse_port)),
                ("grpc.max_concurrent_streams", limits.max_streams_per_conn),
                ("grpc.max_connection_idle_ms", int(limits.idle_timeout * 1000)),
                ("grpc.server_handshake_timeout_ms", int(limits.read_timeout * 1000)),
                ("grpc.max_allowed_incoming_connections", limits.max_connections),
            ]
            interceptors = [ApiKeyInterceptor(self.access)] if self.access.guarded else None
            return grpc.aio.server(
                options=options, interceptors=interceptors, maximum_concurrent_rpcs=self.limits.max_concurrent_rpcs
            )
        access = self.access
        authorize = (
            None
            if not access.guarded
            else lambda method, metadata: getattr(access.check_grpc(method, metadata), "message", None)
        )
        return h2grpc.Server(
            self.max_bytes,
            limits.max_concurrent_rpcs,
            limits.max_streams_per_conn,
            reuse_port=self.reuse_port,
            authorize=authorize,
            read_timeout=limits.read_timeout,
            idle_timeout=limits.idle_timeout,
            max_connections=limits.max_connections,
        )

    async def start(self):
        server = self._new_server()
        add_servicer(MSServiceServicer(self.dispatcher, self.llm_backend, self.drain), server)
        self.health.add_to_server(server)
        add_kserve_servicer(
            GuardedDispatcher(self.dispatcher, self.drain), server, self.model_control
        )  # KServe v2 / Triton
        for add in self.extra_servicers:
            add(server)
        failed = RuntimeError(
            f"Serving Error: Serving gRPC server start failed, create server failed, address {self.address}"
        )
        try:
            if self.ssl_config is not None:
                port = server.add_secure_port(self.address, _credentials(self.ssl_config))
            else:
                port = server.add_insecure_port(self.address)
        except RuntimeError as err:
            raise failed from err
        if port == 0 and not self.address.startswith("unix:"):
            raise failed
        await server.start()
        self.server = server

    def stop_accepting(self):
        """New calls fail with UNAVAILABLE from now on; grpc.health.v1 still answers (NOT_SERVING) until `stop`
        closes the port at the end of the grace period."""
        self.drain.accepting = False

    async def drain_requests(self, grace: float) -> Counter:
        """Refuses new calls at once (UNAVAILABLE), lets those in flight finish within `grace` seconds, then cuts
        the rest (UNAVAILABLE); returns the calls cut, by kind. The port stays open (health) until `close`."""
        if self.server is None:
            return collections.Counter()
        self.stop_accepting()
        return await self.drain.finish(grace)

    async def close(self):
        """Ends the health Watch streams and closes the port; calls still running CUT_ANSWER_S later are
        cancelled (the drain has cut them already)."""
        if self.server is None:
            return
        self.health.close()
        # calls still running were cut and had their CUT_ANSWER_S already; otherwise only answers being written
        await self.server.stop(0 if self.drain.running() else CUT_ANSWER_S)
        self.server = None
