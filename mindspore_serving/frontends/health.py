"""Liveness and readiness probes on both front ends, answered from the master's readiness (master/readiness.py).

REST (answered while the server drains too, and never counted as requests in flight):

    GET /health                               live: 200 {"status": "ok"} whenever the master answers
    GET /ready                                200 or 503, the body says why: {"ready", "phase", "servables", ...};
                                              each servable's workers (keys, pids) only for an operator
                                              (api_groups.py `Access.is_operator`)
    GET /v2/health/live                       KServe v2: 200 {"live": true}
    GET /v2/health/ready                      KServe v2: 200 {"ready": true}, or 400 {"error": <why not>}
    GET /v2/models/<name>[/versions/<v>]/ready  KServe v2: 200, 400 {"error"} when not ready, 404 when unknown

gRPC: grpc.health.v1.Health on the public port. The service "" (and MSService's name) is SERVING when the
server is ready; a servable's name is SERVING when that servable is; another name is NOT_FOUND (Watch:
SERVICE_UNKNOWN). Watch streams send each change of their status: one task per front end, while any stream is
open, reads the readiness when the master signals a change (`ChangeSignal`; at the latest every WATCH_FALLBACK
seconds, and every WATCH_INTERVAL seconds for a front end given no signal) and wakes the streams when it
changed, so that a thousand streams cost what one does; beyond `max_watch_streams` a new Watch ends with
RESOURCE_EXHAUSTED.
"""

import asyncio
from collections.abc import Callable

import grpc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mindspore_serving.common.change_signal import ChangeSignal
from mindspore_serving.master.readiness import SERVING, Readiness

WATCH_INTERVAL = 0.2  # how often Watch reads the readiness without a change signal
WATCH_FALLBACK = 5.0  # ... and with one, in case a change went unsignalled
PROBE_PATHS = frozenset(("/health", "/ready", "/v2/health/live", "/v2/health/ready"))
GRPC_SERVICE_NAMES = ("", "mindspore.serving.proto.MSService")  # the whole server

ReadinessSource = Callable[[], Readiness]


def always_ready() -> Readiness:
    """The readiness of a front end started without a master (tests): always ready."""
    return Readiness(True, SERVING)


def is_probe(path: str) -> bool:
    """A probe route: answered even while the server drains (a load balancer must see live, not ready)."""
    return path in PROBE_PATHS or (path.startswith("/v2/models/") and path.endswith("/ready"))


def build_health_router(
    readiness: ReadinessSource, operator: Callable[[dict], bool] = lambda _scope: True
) -> APIRouter:
    """The probe routes; `operator(scope)` says whether the caller may see /ready's worker details."""
    router = APIRouter()

    @router.get("/health", summary="Liveness: 200 whenever the server answers")
    async def _health():
        return {"status": "ok"}

    @router.get("/ready", summary="Readiness: 200 when every servable can serve, else 503; the body says why")
    async def _ready(request: Request):
        state = readiness()
        return JSONResponse(state.to_json(details=operator(request.scope)), status_code=200 if state.ready else 503)

    @router.get("/v2/health/live", summary="KServe v2 server liveness")
    async def _v2_live():
        return {"live": True}

    @router.get("/v2/health/ready", summary="KServe v2 server readiness: 200, or 400 when not ready")
    async def _v2_ready():
        state = readiness()
        if state.ready:
            return {"ready": True}
        return JSONResponse({"error": state.reason}, status_code=400)

    @router.get("/v2/models/{name}/ready", summary="KServe v2 model readiness: 200, 400 when not ready, 404 unknown")
    async def _v2_model_ready(name: str):
        return _model_ready(readiness(), name, 0)

    @router.get("/v2/models/{name}/versions/{version}/ready", summary="KServe v2 readiness of one model version")
    async def _v2_model_version_ready(name: str, version: str):
        if not version.isdigit():
            return JSONResponse(
                {"error": f"Request model {name} version {version}: the version is not an unsigned integer"},
                status_code=400,
            )
        return _model_ready(readiness(), name, int(version))

    return router


def _model_ready(state: Readiness, name: str, version: int) -> JSONResponse:
    if name not in state.servables and "." in name:  # a v2 model `<servable>.<method>` is as ready as its servable
        name = name.rsplit(".", 1)[0]
    ready = state.model_ready(name, version)
    label = f"model {name}" + (f" version {version}" if version else "")
    if ready is None:
        return JSONResponse({"error": f"{label} is not found"}, status_code=404)
    if not ready:
        servable = state.servables[name]
        why = (
            f"{servable.state} ({servable.reason})"
            if not servable.ready
            else f"no worker serves it (ready versions: {', '.join(map(str, servable.versions))})"
        )
        return JSONResponse({"error": f"{label} is not ready: {why}"}, status_code=400)
    return JSONResponse({"name": name, "ready": True})


_Status = health_pb2.HealthCheckResponse.ServingStatus


def grpc_status(state: Readiness, service: str):
    """The grpc.health.v1 status of `service` ("" or MSService: the server; a servable's name: that servable),
    None for an unknown service."""
    if service in GRPC_SERVICE_NAMES:
        ready = state.ready
    else:
        ready = state.model_ready(service)
        if ready is None:
            return None
    return _Status.SERVING if ready else _Status.NOT_SERVING


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health, whose statuses follow the master's readiness (Check and List compute it on each
    call; Watch streams share one reader, `_follow`)."""

    def __init__(self, readiness: ReadinessSource, max_watch_streams: int = 1000, changes: ChangeSignal | None = None):
        self.readiness = readiness
        self.changes = changes  # bumped where the readiness may have changed
        self.max_watch_streams = max_watch_streams
        self._closed = asyncio.Event()
        self._watchers = 0
        self._state = None  # the readiness the streams last saw
        self._changed = asyncio.Event()  # set (and replaced) when it changes
        self._follower = None

    def add_to_server(self, server):
        health_pb2_grpc.add_HealthServicer_to_server(self, server)

    def close(self):
        """Ends the Watch streams (the server stops after its drain)."""
        self._closed.set()
        self._changed.set()
        if self._follower is not None:
            self._follower.cancel()

    async def Check(self, request, context):  # pylint: disable=invalid-name
        status = grpc_status(self.readiness(), request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def List(self, request, context):  # pylint: disable=invalid-name
        state = self.readiness()
        names = list(GRPC_SERVICE_NAMES) + list(state.servables)
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=grpc_status(state, name)) for name in names}
        )

    async def Watch(self, request, context):  # pylint: disable=invalid-name
        if self._watchers >= self.max_watch_streams:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the server has reached its limit of {self.max_watch_streams} health Watch streams "
                f"(--max_watch_streams)",
            )
        self._watchers += 1
        try:
            if self._follower is None or self._follower.done():
                self._state = self.readiness()
                self._follower = asyncio.ensure_future(self._follow())
            last = None
            while not self._closed.is_set():
                status = grpc_status(self._state, request.service)
                status = _Status.SERVICE_UNKNOWN if status is None else status
                if status != last:
                    last = status
                    yield health_pb2.HealthCheckResponse(status=status)
                await self._changed.wait()
        finally:
            self._watchers -= 1

    async def _follow(self):
        """Reads the readiness at each signalled change while streams are open; wakes them when it changed."""
        seen = self.changes.version if self.changes is not None else 0
        while self._watchers and not self._closed.is_set():
            state = self.readiness()  # read after `seen`: a change from now on is signalled anew
            if state != self._state:
                self._state = state
                changed, self._changed = self._changed, asyncio.Event()
                changed.set()
            if self.changes is not None:
                seen = await self.changes.wait(seen, WATCH_FALLBACK)
                continue
            try:
                await asyncio.wait_for(self._closed.wait(), WATCH_INTERVAL)
            except TimeoutError:
                pass
