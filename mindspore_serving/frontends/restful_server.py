"""The RESTful front end: MindSpore Serving's `POST /model/<name>[/version/<v>]:<method>` on uvicorn.

The classic route is a bare ASGI handler (it needs free key order in the URL, answers HTTP 200 with
`{"error_msg": ...}` for a failed request, 503 + Retry-After while the servable is unavailable, and is the hot
path). KServe v2 routes (`/v2/...`) are routed before it to their own bare handler; everything else (the OpenAPI
page, health, the LLM routes other than the classic `:generate_stream`, and routes added by other servables) goes to
a FastAPI app; a request for a path that app does not serve goes to the classic route, which answers it with
MindSpore Serving's URL errors, as its RESTful server serves only that route.
"""

import asyncio
import collections
import socket
import ssl
from collections import Counter

import uvicorn
from fastapi import Body, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.routing import Match

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.limits import Limits, payload_too_large
from mindspore_serving.common.tensor_codec import instances_to_proto, proto_to_instance
from mindspore_serving.frontends import kserve, request_ids, restful_codec
from mindspore_serving.frontends.address import check_address, check_max_msg_mb_size
from mindspore_serving.frontends.api_groups import Access
from mindspore_serving.frontends.drain import (
    CUT_ANSWER_S,
    Drain,
    DrainingFrontend,
    GuardedBackend,
    GuardedDispatcher,
    refusal_reply,
)
from mindspore_serving.frontends.errors import Protocol, classic_error, http_error, http_error_headers
from mindspore_serving.frontends.health import always_ready, build_health_router, is_probe
from mindspore_serving.frontends.http_protocol import limited_protocol
from mindspore_serving.frontends.llm import build_llm_router, mindspore_generate_stream, sse
from mindspore_serving.frontends.replies import global_error
from mindspore_serving.proto import ms_service_pb2

_JSON_HEADERS = [(b"content-type", restful_codec.CONTENT_TYPE.encode())]
GENERATE_STREAM = "generate_stream"
VLLM_PATHS = frozenset(("/tokenize", "/detokenize"))  # vLLM's routes outside /v1/, with OpenAI's errors
# the LLM APIs' paths (frontends/llm, health.py), the app's whether or not an LLM is served
LLM_API_PATHS = frozenset(("/", "/generate", "/generate_stream", "/info", "/health", "/ready", "/models", *VLLM_PATHS))
LLM_API_PREFIXES = ("/v1/", "/v2/", "/models/")


def build_docs_app(llm_backend=None, readiness=None, access: Access | None = None) -> FastAPI:
    """The FastAPI app: documents the classic route and serves the rest: the health and readiness probes (from
    `readiness()`, the master's; ready when not given), and the LLM protocols when given a backend (OpenAI, TGI
    and MindSpore LLM-serving routes)."""
    app = FastAPI(title="MindSpore Serving", description="RESTful access to served models")
    app.include_router(build_health_router(readiness or always_ready, (access or Access()).is_operator))
    if llm_backend is not None:
        app.include_router(build_llm_router(llm_backend, health_route=False))

    @app.post("/model/{servable_name}:{method_name}", summary="Call a method of the newest version of a servable")
    async def _predict_doc(
        servable_name: str,
        method_name: str,
        body: dict = Body(
            ..., examples=[{"instances": [{"x1": [[1.0, 2.0], [3.0, 4.0]], "x2": [[1.0, 2.0], [3.0, 4.0]]}]}]
        ),
    ):
        """Body: `{"instances": [{input name: value}, ...]}`; values are JSON scalars, nested lists, or
        `{"b64": "...", "type": "float32", "shape": [2, 2]}`. Reply: `{"instances": [{output name: value}]}`
        or `{"error_msg": "..."}` with HTTP 200; HTTP 503 with Retry-After while the servable is unavailable."""

    @app.post(
        "/model/{servable_name}/version/{version}:{method_name}", summary="Call a method of one version of a servable"
    )
    async def _predict_version_doc(servable_name: str, version: int, method_name: str, body: dict = Body(...)):
        """As the route without version; version 0 means the newest."""

    return app


def add_metrics_route(app: FastAPI, collector) -> None:
    """GET /metrics: one scrape of the master's metrics, workers' included (master/metrics.py)."""

    @app.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
    async def _metrics():
        return Response(await collector.render(), media_type=CONTENT_TYPE_LATEST)


class RestfulApp:
    """ASGI entry: KServe v2 and classic predict calls are handled here, the rest by the FastAPI app. Every HTTP
    request is counted in `drain` while it runs, and refused with 503 once the server is stopping (probes aside: they
    are answered throughout and not counted)."""

    def __init__(
        self,
        dispatcher,
        max_bytes: int,
        fallback,
        llm_backend=None,
        drain: Drain | None = None,
        model_control=None,
        api_key: str | None = None,
        limits: Limits = Limits(),
        access: Access | None = None,
    ):
        self.drain = drain or Drain()
        self.limits = limits
        self.access = access or Access(api_key)  # the key each route needs (api_groups.py)
        self.dispatcher = GuardedDispatcher(dispatcher, self.drain)
        self.max_bytes = max_bytes
        self.fallback = fallback
        self.llm_backend = llm_backend
        self.kserve = kserve.KServe(self.dispatcher, model_control)

    @staticmethod
    def is_classic(scope) -> bool:
        path = scope["path"]
        return "model" in path and ":" in path and not path.startswith(("/models/", "/v1/", "/docs", "/openapi"))

    def _app_routes(self, scope) -> bool:
        """Whether the request's path is the FastAPI app's: one of its routes (with any method), or a path of the
        LLM APIs (answered 404 in their shape when no LLM is served). Every other request goes to the classic
        route, which answers it with MindSpore Serving's URL errors, as its RESTful server serves nothing else:
        `please check url, the keyword:[model] must contain.` rather than a 404."""
        path = scope["path"]
        if path in LLM_API_PATHS or path.startswith(LLM_API_PREFIXES):
            return True
        routes = getattr(self.fallback, "routes", None)
        return routes is None or any(route.matches(scope)[0] is not Match.NONE for route in routes)

    def protocol_of(self, scope) -> Protocol:
        if self.is_classic(scope):
            return Protocol.MINDSPORE
        if scope["path"] == "/v2" or scope["path"].startswith("/v2/"):
            return Protocol.KSERVE
        if scope["path"].startswith("/v1/") or scope["path"] in VLLM_PATHS:
            return Protocol.OPENAI
        return Protocol.TGI  # TGI's routes and MindSpore LLM-serving's, which copies TGI's errors

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        request_id = request_ids.from_http(scope.get("headers", ()))
        token = log.bind_request_id(request_id)
        try:
            await self._route(scope, receive, request_ids.with_request_id(send, request_id))
        finally:
            log.unbind_request_id(token)

    async def _route(self, scope, receive, send):
        if self.access.guarded:
            failure = self.access.check_http(scope["method"], scope["path"], scope.get("headers", ()))
            if failure is not None:
                status, payload = http_error(self.protocol_of(scope), failure)
                headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in http_error_headers(failure).items()]
                await _send_json(send, status, sse.dumps(payload), headers)
                return
        if is_probe(scope["path"]):  # answered while the server drains, and not counted
            await self.fallback(scope, receive, send)
            return
        if not self.drain.accepting:
            status, payload = refusal_reply(self.protocol_of(scope), self.drain.refusal())
            await _send_json(send, status, sse.dumps(payload))
            return
        kind = f"RESTful {scope['method']} {scope['path']}"
        self.drain.enter(kind)
        try:
            v2_route = kserve.route_of(scope["method"], scope["path"])
            if v2_route is not None:
                await self._kserve(scope, receive, send, *v2_route)
            elif self.is_classic(scope) or not self._app_routes(scope):
                await self._classic(scope, receive, send)
            elif scope["method"] in ("GET", "HEAD"):
                await self.fallback(scope, receive, send)
            else:
                await self._with_body(scope, receive, send)
        finally:
            self.drain.leave(kind)

    async def refuse_connection(self, scope, receive, send):
        """The answer to a request on a connection beyond the limit: overloaded in the route's shape, and the
        connection is closed after it. Probes are answered (a full server is live, not dead)."""
        if scope["type"] == "http" and is_probe(scope["path"]):
            await self(scope, receive, send)
            return
        error = errors.Overloaded(
            f"the server has reached its limit of {self.limits.max_connections} open connections (--max_connections)"
        )
        status, payload = http_error(self.protocol_of(scope), error)
        await _send_json(send, status, sse.dumps(payload), [(b"connection", b"close"), (b"retry-after", b"1")])

    async def _classic(self, scope, receive, send):
        stream_of = None
        if self.llm_backend is not None and scope["method"] == "POST":
            stream_of = _stream_target(scope["path"])
        if stream_of is not None:  # an LLM route
            body = await self._llm_body(scope, receive, send)
            if body is not None:
                response = await mindspore_generate_stream(self.llm_backend, stream_of, body)
                await response(scope, receive, send)
            return
        try:
            body = await read_body(scope, receive, self.max_bytes)
        except BodyTooLarge:  # MindSpore Serving's text, with its HTTP 200
            error = errors.InvalidInputs(f"http message is bigger than {self.max_bytes}")
            await _send_json(send, 200, restful_codec.encode_error(error))
            return
        if body is None:
            return
        status, headers = 200, []
        results = await self.handle(scope["method"], request_target(scope), body)
        reply = restful_codec.encode_results(results)
        failure = global_error(results)
        if failure is not None:  # 200, or 503 + Retry-After while the servable is unavailable
            status, _ = http_error(Protocol.MINDSPORE, failure)
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in http_error_headers(failure).items()]
        await _send_json(send, status, reply, headers)

    async def _kserve(self, scope, receive, send, route: str, params: dict):
        try:
            body = await read_body(scope, receive, self.max_bytes)
        except BodyTooLarge as err:
            status, headers, reply = kserve.handle_error(
                errors.PayloadTooLarge(payload_too_large(err.size, self.max_bytes, "KServe", "max_msg_mb_size"))
            )
        else:
            if body is None:  # the client went away
                return
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
            status, headers, reply = await kserve.handle_rest(self.kserve, route, params, headers, body)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": headers + [(b"content-length", str(len(reply)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": reply})

    async def _with_body(self, scope, receive, send):
        """A POST to the FastAPI app (the LLM routes): its body is read here, within the LLM payload limit, and
        handed on whole."""
        body = await self._llm_body(scope, receive, send)
        if body is not None:
            await self.fallback(scope, replay(body, receive), send)

    async def _llm_body(self, scope, receive, send) -> bytes | None:
        """The body of a request to an LLM route, read within the LLM payload limit; None when it was refused
        (413 in the route's shape) or the client went away."""
        limit = self.limits.llm_payload_bytes
        try:
            return await read_body(scope, receive, limit)
        except BodyTooLarge as err:
            error = errors.PayloadTooLarge(payload_too_large(err.size, limit, "request", "--llm_payload_limit"))
            status, payload = http_error(self.protocol_of(scope), error)
            await _send_json(send, status, sse.dumps(payload))
            return None

    async def handle(self, http_method: str, path: str, body: bytes):
        """The request's results: per instance its outputs or a ServingError, or one exception for the whole."""
        try:
            name, method, version, instances = restful_codec.parse_request(path, body, self.max_bytes, http_method)
            spec = ms_service_pb2.ServableSpec(name=name, method_name=method, version_number=version)
            request = ms_service_pb2.PredictRequest()
            instances_to_proto(instances, request.instances)
            results = await self.dispatcher.predict(spec, request.instances)
        except errors.ServingError as err:
            return err
        except Exception as err:
            log.exception("RESTful request failed")
            return classic_error(err)
        return [
            result if isinstance(result, errors.ServingError) else proto_to_instance(result, copy=False)
            for result in results
        ]


def request_target(scope) -> str:
    """The request's target as sent: its path not percent-decoded, and its query after '?'. MindSpore Serving parses
    the URL from it, so that `/model/add:add_common?x=1` names the method `add_common?x=1`."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else scope["path"]
    query = scope.get("query_string") or b""
    return f"{path}?{query.decode('latin-1')}" if query else path


class BodyTooLarge(Exception):
    """The request body is beyond the route's limit; `size` is its declared length, None when it was not declared
    (chunked) and the limit was passed while reading."""

    def __init__(self, size: int | None):
        super().__init__(size)
        self.size = size


def declared_length(scope) -> int | None:
    """The request's Content-Length, None without one (uvicorn's parser refuses a malformed one)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(scope, receive, limit: int) -> bytes | None:
    """The request body; None when the client went away. BodyTooLarge without reading anything when the declared
    length is beyond `limit`, or as soon as what arrived is: the rest is never read into memory (uvicorn drops it,
    and closes a connection whose body stalls, frontends/http_protocol.py)."""
    declared = declared_length(scope)
    if declared is not None and declared > limit:
        raise BodyTooLarge(declared)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(None)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive):
    """An ASGI receive that gives `body` whole first, then what `receive` gives (the client's disconnect)."""
    first = [{"type": "http.request", "body": body, "more_body": False}]

    async def _receive():
        return first.pop() if first else await receive()

    return _receive


async def _send_json(send, status: int, body: bytes, headers=()):
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": _JSON_HEADERS + list(headers) + [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _stream_target(path: str):
    """The servable of `POST /model/<name>[/version/<v>]:generate_stream` (the LLM servable's tokens as
    Server-Sent Events), or None for any other method or a URL that the classic route refuses."""
    try:
        name, method, _ = restful_codec.parse_url(path)
    except errors.ServingError:
        return None
    return name if method == GENERATE_STREAM else None


def _ssl_context_kwargs(ssl_config):
    if ssl_config is None:
        return {}
    kwargs = {
        "ssl_certfile": ssl_config.certificate,
        "ssl_keyfile": ssl_config.private_key,
        "ssl_version": ssl.PROTOCOL_TLS_SERVER,
    }
    if ssl_config.verify_client:
        kwargs.update(ssl_ca_certs=ssl_config.custom_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return kwargs


def _check_ssl(ssl_config):
    """Loads the files once, in MindSpore Serving's order, so that bad ones fail start-up with its messages: the
    clients' CA (with verify_client), the certificate chain, then the private key with it."""
    if ssl_config is None:
        return
    if ssl_config.verify_client and ssl_config.custom_ca:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(ssl_config.custom_ca)
        except (OSError, ssl.SSLError) as err:
            raise RuntimeError(f"Serving Error: load root certificate from {ssl_config.custom_ca} failed") from err
    try:  # the certificates of the chain parse (its key is checked with the private key below)
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(ssl_config.certificate)
    except (OSError, ssl.SSLError) as err:
        raise RuntimeError(f"Serving Error: load certificate_chain from {ssl_config.certificate} failed") from err
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(ssl_config.certificate, ssl_config.private_key)
    except (OSError, ssl.SSLError) as err:  # a key that is not the certificate's too, as OpenSSL's loading checks it
        raise RuntimeError(f"Serving Error: load private_key from {ssl_config.private_key} failed") from err


def _with_tcp_proto(sock: socket.socket) -> socket.socket:
    """The same listening socket with its protocol read back from the kernel.

    uvicorn creates it with `socket.socket(family=...)`, whose `proto` is 0; accepted connections inherit that,
    and asyncio only sets TCP_NODELAY on sockets whose proto is IPPROTO_TCP. Without it every keep-alive reply
    (written in two parts) waits for the client's delayed ACK, about 40 ms."""
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.proto == 0:
        return socket.socket(fileno=sock.detach())
    return sock


class RestfulFrontend(DrainingFrontend):
    def __init__(
        self,
        address: str,
        max_msg_mb_size: int,
        ssl_config,
        dispatcher,
        app: FastAPI = None,
        llm_backend=None,
        readiness=None,
        metrics=None,
        model_control=None,
        reuse_port: bool = False,
        api_key: str | None = None,
        limits: Limits = Limits(),
        access: Access | None = None,
    ):
        check_max_msg_mb_size(max_msg_mb_size)
        access = access or Access(api_key)
        _check_ssl(ssl_config)  # before the address, as MindSpore Serving sets TLS up before binding
        if address.startswith("unix:"):
            raise RuntimeError("Serving Error: RESTful server does not support binding to unix domain socket")
        self.host, self.port = check_address(address, "RESTful server")
        self.address = address
        self.reuse_port = reuse_port  # the port is shared with front-end processes (SO_REUSEPORT)
        self.drain = Drain()
        if llm_backend is not None:
            llm_backend = GuardedBackend(llm_backend, self.drain)
        app = app or build_docs_app(llm_backend, readiness, access)
        if metrics is not None:
            add_metrics_route(app, metrics)
        self.app = RestfulApp(
            dispatcher,
            max_msg_mb_size * 1024 * 1024,
            app,
            llm_backend,
            self.drain,
            model_control,
            limits=limits,
            access=access,
        )
        protocol = limited_protocol(limits.read_timeout, limits.max_connections, self.app.refuse_connection)
        self.config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            timeout_keep_alive=limits.idle_timeout,
            access_log=False,
            lifespan="off",
            http=protocol,
            **_ssl_context_kwargs(ssl_config),
        )
        self.server = None
        self._task = None

    async def start(self):
        server = uvicorn.Server(self.config)
        server.install_signal_handlers = lambda: None  # the master owns signals
        try:
            self.config.load()
            sockets = [self._bind_shared() if self.reuse_port else _with_tcp_proto(self.config.bind_socket())]
        except (OSError, SystemExit) as err:
            raise RuntimeError(
                f"Serving Error: RESTful server start failed, bind to the socket address {self.address} failed"
            ) from err
        self._task = asyncio.ensure_future(server.serve(sockets=sockets))
        while not server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(
                    f"Serving Error: RESTful server start failed, bind to the socket address {self.address} failed"
                )
            await asyncio.sleep(0.01)
        self.server = server

    def _bind_shared(self) -> socket.socket:
        """The listening socket, with SO_REUSEPORT: every front-end process binds the same port."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.host, self.port))
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
        sock.set_inheritable(False)
        return sock

    def stop_accepting(self):
        """New requests get 503 in their protocol's shape from now on; the port stays open until the grace period
        ends, so that probes still see the server live (and not ready)."""
        self.drain.accepting = False

    def _close_port(self):
        if self.server is not None:
            for listener in self.server.servers:
                listener.close()
            self.server.should_exit = True  # uvicorn closes idle connections, then waits for its tasks

    async def drain_requests(self, grace: float) -> Counter:
        """Refuses new requests at once (`stop_accepting`), lets those in flight finish within `grace` seconds,
        then cuts the rest with the protocol's unavailable error; returns the requests cut, by kind. The port
        stays open (probes) until `close`."""
        if self.server is None:
            return collections.Counter()
        self.stop_accepting()
        return await self.drain.finish(grace)

    async def close(self):
        """Closes the port and the connections (those still busy CUT_ANSWER_S later are closed by force)."""
        server = self.server
        if server is None:
            return
        self._close_port()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), CUT_ANSWER_S)
        except TimeoutError:
            log.warning(
                f"RESTful server: {len(server.server_state.tasks)} connection(s) still busy "
                f"{CUT_ANSWER_S:g} s after the cut; closing them"
            )
            server.force_exit = True
            await self._task
        self.server = None
