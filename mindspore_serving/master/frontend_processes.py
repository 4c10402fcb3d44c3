"""Front-end processes: the public ports served by more than one process, where one process's CPU is the bound.

With `frontend_processes` N > 1 the master starts N-1 processes (`mindspore_serving.frontend_process`) that open
the same public gRPC and RESTful ports beside it (SO_REUSEPORT: the kernel spreads new connections over the
listeners) and run the whole data plane for the connections they accept: parsing, checks, their own dispatcher
(batching, the Predict sockets to the workers, LLM sessions). The master keeps the control plane and tells them
what they need (frontend.proto):
- every worker registration and removal (the RegisterRequest, from which each builds its own channels), and the
  settings of the dispatcher;
- the server's readiness whenever it changes (the master's `ChangeSignal`);
- the public servers to open (StartServer: replayed to a process that was restarted);
- one drain when the server stops: the master's front ends and theirs refuse new requests at once, requests in
  flight have the grace period, then the processes end.
Model control and metrics scrapes that reach a front-end process are answered by the master (MasterFrontend).

A front-end process that dies is restarted (at most MAX_QUICK_RESTARTS times within RESTART_WINDOW); the
connections it held fail at once (reset), and the other front ends keep serving.
"""

import asyncio
import collections
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.change_signal import ChangeSignal
from mindspore_serving.common.child_process import child_env
from mindspore_serving.common.restart_budget import RestartBudget
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.master.model_control import NO_CONTROL_TEXT
from mindspore_serving.master.worker_processes import LOG_DIR, MONITOR_INTERVAL, kill_group
from mindspore_serving.proto import frontend_pb2 as pb
from mindspore_serving.proto import frontend_pb2_grpc, internal_pb2

FRONTEND_MODULE = "mindspore_serving.frontend_process.start_frontend"
START_TIMEOUT = 60.0  # seconds a front-end process has to register
READINESS_FALLBACK = 5.0  # the master compares its readiness with what the processes were told at each signalled
#                             change, and at least this often in case a change went unsignalled
CALL_TIMEOUT = 10.0  # an update or a server start the process must answer within
MAX_QUICK_RESTARTS = 5
RESTART_WINDOW = 60.0


@dataclass
class FrontendChild:
    index: int
    process: subprocess.Popen | None = None
    registered: threading.Event = field(default_factory=threading.Event)
    pid: int = 0
    address: str = ""  # its FrontendService, once registered (a unix socket the master removes when it ends)
    secret: str = field(default="", repr=False)  # what its calls to the master carry (ipc.peer_metadata)
    channel: grpc.aio.Channel | None = None
    stub: frontend_pb2_grpc.FrontendServiceStub | None = None
    updates: asyncio.Queue | None = None  # FrontendUpdates to send in order (on the master loop)
    sender: asyncio.Task | None = None
    starts: int = 0
    restarted: int = 0
    restarts: RestartBudget = field(default_factory=lambda: RestartBudget(MAX_QUICK_RESTARTS, RESTART_WINDOW))

    @property
    def log_path(self) -> str:
        return f"{LOG_DIR}/log_frontend_{self.index}.log"


class FrontendProcesses:
    """The master's front-end processes; also one of its front ends (stop_accepting / drain_requests / close)."""

    def __init__(
        self,
        count: int,
        master_address: str,
        loop: asyncio.AbstractEventLoop,
        registry,
        readiness: Callable,
        settings: Callable[[], dict],
        readiness_changes: ChangeSignal | None = None,
    ):
        self.master_address = master_address
        self.loop = loop
        self.registry = registry
        self.readiness = readiness  # () -> Readiness
        self.readiness_changes = readiness_changes or ChangeSignal()  # bumped where the readiness may change
        self.settings = (
            settings  # () -> {"request_timeout", "max_enqueued_requests", "max_enqueued_bytes", "llm_token_timeout"}
        )
        self.children: dict[int, FrontendChild] = {index: FrontendChild(index) for index in range(1, count)}
        self.servers: list[pb.ServerConfig] = []
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self._told_readiness = ""
        self._readiness_task: asyncio.Task | None = None
        registry.listeners.append(self._on_worker_change)

    # ---- start ----
    def start(self):
        """Starts the processes and blocks until every one has registered (any thread but the master loop's)."""
        for child in self.children.values():
            self._spawn(child)
        deadline = time.monotonic() + START_TIMEOUT
        for child in self.children.values():
            while not child.registered.wait(0.05):
                if child.process.poll() is not None:
                    raise RuntimeError(
                        f"Serving Error: front-end process {child.index} exited at start "
                        f"(code {child.process.returncode}), see {child.log_path}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Serving Error: front-end process {child.index} did not register within "
                        f"{START_TIMEOUT:g} s, see {child.log_path}"
                    )
        self._readiness_task = asyncio.run_coroutine_threadsafe(self._follow_readiness(), self.loop)
        self._monitor = threading.Thread(target=self._watch, name="frontend-monitor", daemon=True)
        self._monitor.start()
        log.info(
            f"Serving: {len(self.children)} front-end process(es) serve beside the master: "
            + ", ".join(f"{c.index} (pid {c.pid})" for c in self.children.values())
        )

    def _spawn(self, child: FrontendChild):
        child.registered.clear()
        with log.open_private(child.log_path, "w" if child.starts == 0 else "a") as log_file:
            child.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    FRONTEND_MODULE,
                    f"--index={child.index}",
                    f"--master_address={self.master_address}",
                ],
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=child_env(),
            )
        child.secret = ipc.new_secret()  # through the pipe, never on the command line; new for each start
        child.process.stdin.write(child.secret.encode() + b"\n")
        child.process.stdin.close()
        child.starts += 1
        log.info(f"started front-end process {child.index} pid {child.process.pid}, log {child.log_path}")

    async def register(self, hello: pb.FrontendHello):
        """A front-end process is up (MasterFrontend.Register, on the master loop): it learns the workers, the
        readiness and the servers to open before the call returns."""
        child = self.children.get(hello.index)
        if child is None or child.process is None or child.process.pid != hello.pid:
            raise errors.InvalidInputs(f"no front-end process {hello.index} with pid {hello.pid} was started")
        await self._forget(child)
        child.pid, child.address = hello.pid, hello.address
        child.channel = grpc.aio.insecure_channel(hello.address, options=ipc.INTERNAL_CHANNEL_OPTIONS)
        child.stub = frontend_pb2_grpc.FrontendServiceStub(child.channel)
        update = self._update()
        update.added.extend(record.registration for record in self.registry.all() if record.registration)
        self._told_readiness = update.readiness_json = _readiness_json(self.readiness())
        await child.stub.Update(update, timeout=CALL_TIMEOUT)
        for config in self.servers:
            await self._start_server(child, config)
        child.updates = asyncio.Queue()
        child.sender = asyncio.ensure_future(self._send_updates(child))
        child.registered.set()
        if child.starts > 1:
            log.warning(f"front-end process {child.index} (pid {child.pid}) serves again")

    async def _forget(self, child: FrontendChild):
        child.registered.clear()
        if child.sender is not None:
            child.sender.cancel()
            child.sender = None
        if child.channel is not None:
            await child.channel.close()
        child.channel = child.stub = child.updates = None

    def _update(self) -> pb.FrontendUpdate:
        return pb.FrontendUpdate(**self.settings())

    async def _send_updates(self, child: FrontendChild):
        while True:
            update = await child.updates.get()
            try:
                await child.stub.Update(update, timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError as err:  # a dying process: its restart brings a full update
                log.warning(f"front-end process {child.index} missed an update: {err.code().name} {err.details()}")

    def _tell(self, update: pb.FrontendUpdate):
        for child in self.children.values():
            if child.registered.is_set() and child.updates is not None:
                child.updates.put_nowait(update)

    def _on_worker_change(self, change: str, record):
        """A registry listener (any thread): the change travels to every process in order."""
        update = self._update()
        if change == "added":
            if record.registration is None:
                return
            update.added.append(record.registration)
        else:
            update.removed.append(record.key)
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._tell, update)

    async def _follow_readiness(self):
        seen = self.readiness_changes.version
        while not self._stopping.is_set():
            text = _readiness_json(self.readiness())  # read after `seen`: a change from now on is signalled anew
            if text != self._told_readiness:
                self._told_readiness = text
                update = self._update()
                update.readiness_json = text
                self._tell(update)
            seen = await self.readiness_changes.wait(seen, READINESS_FALLBACK)

    # ---- servers ----
    async def start_server(self, config: pb.ServerConfig):
        """Opens a public server in every process (after the master opened its own); raises RuntimeError with
        the first process's reason when one cannot."""
        self.servers.append(config)
        for child in self.children.values():
            if child.registered.is_set():
                await self._start_server(child, config)

    async def _start_server(self, child: FrontendChild, config: pb.ServerConfig):
        reply = await child.stub.StartServer(config, timeout=CALL_TIMEOUT)
        if reply.error:
            raise RuntimeError(f"{reply.error} (front-end process {child.index})")

    # ---- deaths ----
    def _watch(self):
        while not self._stopping.wait(MONITOR_INTERVAL):
            for child in self.children.values():
                process = child.process
                if process is None or process.poll() is None:
                    continue
                kill_group(process)
                child.process = None
                ipc.remove_socket(child.address)
                if self._stopping.is_set():
                    return
                asyncio.run_coroutine_threadsafe(self._forget(child), self.loop)
                if not child.restarts.spend():
                    log.error(
                        f"front-end process {child.index} died {MAX_QUICK_RESTARTS} times within "
                        f"{RESTART_WINDOW:.0f} s; it is not restarted again, see {child.log_path}"
                    )
                    continue
                log.warning(
                    f"front-end process {child.index} (pid {process.pid}) died unexpectedly (exit code "
                    f"{process.returncode}); its connections are lost, restarting it"
                )
                try:
                    self._spawn(child)
                    child.restarted += 1
                except OSError as err:
                    log.error(f"cannot restart front-end process {child.index}: {err}")

    def restart_counts(self) -> dict[int, int]:
        return {child.index: child.restarted for child in self.children.values()}

    # ---- metrics ----
    async def metrics(self, timeout: float) -> list:
        """The MetricsReply of every process that answers within `timeout` seconds."""
        children = self._live()
        replies = await asyncio.gather(
            *(c.stub.Metrics(internal_pb2.Empty(), timeout=timeout) for c in children), return_exceptions=True
        )
        return [reply for reply in replies if not isinstance(reply, BaseException)]

    # ---- stop: one of the master's front ends ----
    def _live(self) -> list[FrontendChild]:
        return [c for c in self.children.values() if c.registered.is_set() and c.stub is not None]

    def stop_accepting(self) -> asyncio.Future:
        """Every process refuses new requests from now on (on the master loop: the calls leave at once); the
        returned future is done once each process has answered (or failed to)."""
        self._stopping.set()
        return asyncio.gather(
            *(_quietly(child.stub.StopAccepting(internal_pb2.Empty(), timeout=CALL_TIMEOUT)) for child in self._live())
        )

    async def drain_requests(self, grace: float) -> Counter:
        """The processes' drains, together; the requests they cut, by kind."""
        self._stopping.set()
        children = self._live()
        replies = await asyncio.gather(
            *(c.stub.Drain(pb.DrainRequest(grace=grace), timeout=grace + CALL_TIMEOUT) for c in children),
            return_exceptions=True,
        )
        cut: Counter = collections.Counter()
        for child, reply in zip(children, replies):
            if isinstance(reply, BaseException):
                log.error(f"front-end process {child.index} did not drain: {reply!r}")
            else:
                cut.update(dict(reply.cut))
        return cut

    async def close(self):
        """Closes the processes' ports, then ends them."""
        self._stopping.set()
        children = self._live()
        await asyncio.gather(
            *(c.stub.Close(internal_pb2.Empty(), timeout=CALL_TIMEOUT) for c in children), return_exceptions=True
        )
        if self._readiness_task is not None:
            self._readiness_task.cancel()
        for child in self.children.values():
            await self._forget(child)
        self.terminate()  # SIGKILL: their ports are closed and nothing of theirs is left to finish

    def terminate(self):
        """Ends every process now (any thread; they are stateless: what they held was drained or is lost)."""
        self._stopping.set()
        for child in self.children.values():
            process, child.process = child.process, None
            if process is not None:
                kill_group(process)
                process.wait()
            ipc.remove_socket(child.address)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=2)
        if self._on_worker_change in self.registry.listeners:
            self.registry.listeners.remove(self._on_worker_change)


async def _quietly(call):
    try:
        await call
    except grpc.aio.AioRpcError:
        pass


def _readiness_json(readiness) -> str:
    return json.dumps(readiness.to_json(), sort_keys=True)


def frontend_key(index: int) -> str:
    """How front-end process `index` names itself in its calls to the master (ipc.peer_metadata)."""
    return f"frontend/{index}"


class MasterFrontendServicer(frontend_pb2_grpc.MasterFrontendServicer):
    """What front-end processes ask the master: to register, model control, a metrics scrape. Only the processes
    this master started are heard (their secret in each call's metadata); any other caller gets PERMISSION_DENIED."""

    def __init__(self, master):
        self.master = master

    def _secret_of(self, key: str) -> str:
        processes = self.master.frontend_processes
        for child in processes.children.values() if processes is not None else ():
            if frontend_key(child.index) == key:
                return child.secret
        return ""

    async def _check_caller(self, context, index=None):
        caller = ipc.peer_of(context.invocation_metadata(), self._secret_of)
        if caller is None or (index is not None and caller != frontend_key(index)):
            log.warning(
                "refused a call on the master's front-end socket: the caller is not a front-end process "
                "this master started"
            )
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not a front-end process this master started")

    async def Register(self, request, context):
        await self._check_caller(context, request.index)
        processes = self.master.frontend_processes
        if processes is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this master runs no front-end processes")
        try:
            await processes.register(request)
        except errors.ServingError as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, err.message)
        log.info(f"front-end process {request.index} (pid {request.pid}) registered")
        return internal_pb2.Empty()

    async def ModelControl(self, request, context):
        await self._check_caller(context)
        if not self.master.model_control_open():
            return pb.ModelControlReply(
                error_code=errors.Forbidden.CODE, error_msg=NO_CONTROL_TEXT, kind=errors.Kind.FORBIDDEN.value
            )
        control = self.master.model_control
        action = control.load_by_name if request.action == "load" else control.unload
        try:
            await asyncio.get_running_loop().run_in_executor(None, action, request.name, request.version)
        except errors.ServingError as err:
            return pb.ModelControlReply(error_code=err.code, error_msg=err.message, kind=errors.kind_of(err).value)
        return pb.ModelControlReply()

    async def Metrics(self, request, context):
        await self._check_caller(context)
        return pb.MetricsText(text=await self.master.metrics_collector.render())
