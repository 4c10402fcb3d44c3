"""One front-end process: the master's data plane for the connections it accepts on the shared public ports.

It holds its own copy of the worker registry (from the master's updates, with its own channels to each worker),
its own dispatcher and LLM backend, and the public servers the master has it open (frontends/). It answers the
master on FrontendService (a unix socket beside the master's) and asks the master for what only the master
knows (model control, metrics scrapes). It ignores SIGINT and SIGTERM: the master drains and ends it, and it
exits by itself when the master is gone.
"""

import asyncio
import collections
import json
import os
import signal
import threading
import time

import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.change_signal import ChangeSignal
from mindspore_serving.common.limits import Limits
from mindspore_serving.frontends.api_groups import Access
from mindspore_serving.frontends.grpc_server import GrpcFrontend
from mindspore_serving.frontends.restful_server import RestfulFrontend
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.master.control_service import worker_record
from mindspore_serving.master.dispatcher import Dispatcher
from mindspore_serving.master.frontend_processes import frontend_key
from mindspore_serving.master.llm_backend import MasterLlmBackend
from mindspore_serving.master.master import new_event_loop
from mindspore_serving.master.metrics import MasterMetrics, frontend_samples
from mindspore_serving.master.readiness import STARTING, Readiness, readiness_from_json
from mindspore_serving.master.worker_registry import WorkerRegistry
from mindspore_serving.proto import frontend_pb2 as pb
from mindspore_serving.proto import frontend_pb2_grpc, internal_pb2

PARENT_POLL_S = 0.5


class SslFiles:
    """What the front ends read of a server's SSLConfig, as the master sent it."""

    def __init__(self, config: pb.ServerConfig):
        self.certificate = config.certificate
        self.private_key = config.private_key
        self.custom_ca = config.custom_ca or None
        self.verify_client = config.verify_client


class RemoteModelControl:
    """Model control (KServe load/unload) done by the master; called from a thread, as the front ends call it."""

    def __init__(self, process: "FrontendProcess"):
        self.process = process

    def _ask(self, action: str, name: str, version: int):
        async def ask():  # the call is made on the process's loop, where its channel lives
            return await self.process.master.ModelControl(
                pb.ModelControlRequest(action=action, name=name, version=version), metadata=self.process.credentials
            )

        reply = asyncio.run_coroutine_threadsafe(ask(), self.process.loop).result()
        if reply.error_code:
            kinds = {kind.value: kind for kind in errors.Kind}
            if reply.kind in kinds:
                raise errors.error_of_kind(kinds[reply.kind], reply.error_msg)
            raise errors.make_error(reply.error_code, reply.error_msg)

    def load_by_name(self, name: str, version: int = 0):
        self._ask("load", name, version)

    def unload(self, name: str, version: int = 0):
        self._ask("unload", name, version)


class RemoteMetrics:
    """GET /metrics: the master's scrape (every front end's and worker's metrics)."""

    def __init__(self, process: "FrontendProcess"):
        self.process = process

    async def render(self) -> bytes:
        return (
            await self.process.master.Metrics(internal_pb2.Empty(), timeout=10, metadata=self.process.credentials)
        ).text


class FrontendProcess(frontend_pb2_grpc.FrontendServiceServicer):
    def __init__(self, index: int, master_address: str, secret: str = ""):
        self.index = index
        self.loop = None
        self.registry = WorkerRegistry()
        self.metrics = MasterMetrics()
        self.dispatcher = Dispatcher(self.registry, metrics=self.metrics)
        self.llm_backend = MasterLlmBackend(self.registry, metrics=self.metrics)
        self.state = Readiness(False, STARTING)
        self.readiness_changes = ChangeSignal()  # bumped when the master tells a new readiness
        # a servable the master runs but whose workers are all gone now: "retry later", not an unknown servable
        self.registry.expected = lambda name, _version: name in self.state.servables
        self.master_address = master_address
        self.address = ipc.socket_address(
            ipc.runtime_directory_of(master_address), f"serving_frontend_{index}_{os.getpid()}"
        )
        self.master = None
        # the secret the master gave this process, on every call to the master
        self.credentials = ipc.peer_metadata(frontend_key(index), secret)
        self.frontends = {}
        self.done: asyncio.Event | None = None  # set by Close (on the loop, once serving)

    # ---- FrontendService ----
    async def Update(self, request, context):
        for key in request.removed:
            record = self.registry.remove(key)
            if record is not None:
                await record.close_channels()
        for registration in request.added:
            old = self.registry.add(worker_record(registration))
            if old is not None:
                await old.close_channels()
        if request.readiness_json:
            self.state = readiness_from_json(json.loads(request.readiness_json))
            self.readiness_changes.notify()
        self.dispatcher.request_timeout = request.request_timeout
        self.dispatcher.max_enqueued_requests = request.max_enqueued_requests
        self.dispatcher.max_enqueued_bytes = request.max_enqueued_bytes
        self.llm_backend.token_timeout = request.llm_token_timeout
        return internal_pb2.Empty()

    async def StartServer(self, request, context):
        try:
            await self._start_server(request)
        except Exception as err:  # the master reports it as the server's start failure
            log.error(f"front-end process {self.index}: {request.kind} server on {request.address} failed: {err}")
            return pb.StartServerReply(error=str(err) or repr(err))
        log.info(f"front-end process {self.index}: {request.kind} server listening on {request.address}")
        return pb.StartServerReply()

    async def _start_server(self, config: pb.ServerConfig):
        ssl_config = SslFiles(config) if config.tls else None
        common = dict(
            llm_backend=self.llm_backend,
            readiness=lambda: self.state,
            model_control=RemoteModelControl(self) if config.model_control else None,
            reuse_port=True,
            access=Access(config.api_key or None, dict(config.restricted_api), tuple(config.open_api)),
            limits=Limits.from_proto(config.limits),
        )
        if config.kind == "grpc":
            frontend = GrpcFrontend(
                config.address,
                config.max_msg_mb_size,
                ssl_config,
                self.dispatcher,
                readiness_changes=self.readiness_changes,
                **common,
            )
        else:
            frontend = RestfulFrontend(
                config.address,
                config.max_msg_mb_size,
                ssl_config,
                self.dispatcher,
                metrics=RemoteMetrics(self),
                **common,
            )
        await frontend.start()
        self.frontends[config.kind] = frontend

    async def StopAccepting(self, request, context):
        for frontend in self.frontends.values():
            frontend.stop_accepting()
        return internal_pb2.Empty()

    async def Drain(self, request, context):
        results = await asyncio.gather(
            *(f.drain_requests(request.grace) for f in self.frontends.values()), return_exceptions=True
        )
        cut = collections.Counter()
        for result in results:
            if isinstance(result, BaseException):
                log.error(f"front-end process {self.index}: a drain failed: {result!r}")
            elif result:
                cut.update(result)
        return pb.DrainReply(cut=dict(cut))

    async def Close(self, request, context):
        await asyncio.gather(*(f.close() for f in self.frontends.values()), return_exceptions=True)
        self.frontends.clear()
        self.done.set()
        return internal_pb2.Empty()

    async def Metrics(self, request, context):
        return internal_pb2.MetricsReply(samples=frontend_samples(self.metrics, self.dispatcher, self.index))

    # ---- life ----
    async def serve(self):
        self.done = asyncio.Event()
        server = grpc.aio.server(options=ipc.INTERNAL_CHANNEL_OPTIONS)
        frontend_pb2_grpc.add_FrontendServiceServicer_to_server(self, server)
        server.add_insecure_port(self.address)
        await server.start()
        ipc.restrict_socket(self.address)
        channel = grpc.aio.insecure_channel(self.master_address, options=ipc.INTERNAL_CHANNEL_OPTIONS)
        self.master = frontend_pb2_grpc.MasterFrontendStub(channel)
        await self.master.Register(
            pb.FrontendHello(index=self.index, pid=os.getpid(), address=self.address),
            metadata=self.credentials,
            timeout=60,
        )
        log.info(f"front-end process {self.index} (pid {os.getpid()}) registered with the master")
        await self.done.wait()
        await server.stop(0.5)
        ipc.remove_socket(self.address)


def _watch_parent(parent: int):
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    log.warning("the master is gone; the front-end process exits")
    os._exit(1)  # pylint: disable=protected-access


def main(index: int, master_address: str):
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    process = FrontendProcess(index, master_address, ipc.read_secret())  # stdin's first line, from the master
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    process.loop = loop
    try:
        loop.run_until_complete(process.serve())
    finally:
        ipc.remove_socket(process.address)
