"""The master: one asyncio loop (in its own thread) hosting the control service, the front ends and the
calls to workers, plus the worker processes it owns. Public `server.*` functions drive it."""

import asyncio
import collections
import os
import signal
import threading
import time

import grpc
from prometheus_client import CollectorRegistry, start_http_server

from mindspore_serving import log
from mindspore_serving.common import gc_tuning
from mindspore_serving.common.change_signal import ChangeSignal
from mindspore_serving.common.limits import Limits
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.master.control_service import MasterControlServicer
from mindspore_serving.master.dispatcher import (
    DEFAULT_MAX_ENQUEUED_BYTES,
    DEFAULT_MAX_ENQUEUED_REQUESTS,
    DEFAULT_REQUEST_TIMEOUT,
    Dispatcher,
)
from mindspore_serving.master.frontend_processes import FrontendProcesses, MasterFrontendServicer
from mindspore_serving.master.heartbeat import HeartbeatSettings, WorkerHeartbeat
from mindspore_serving.master.llm_backend import DEFAULT_TOKEN_TIMEOUT, MasterLlmBackend
from mindspore_serving.master.metrics import MasterMetrics, MetricsCollector
from mindspore_serving.master.model_control import ModelControl
from mindspore_serving.master.readiness import IDLE, SERVING, STARTING, STOPPING, Readiness
from mindspore_serving.master.readiness import readiness as server_readiness
from mindspore_serving.master.worker_processes import WorkerPlan, WorkerProcess, WorkerProcesses
from mindspore_serving.master.worker_registry import WorkerRegistry
from mindspore_serving.proto import frontend_pb2_grpc, internal_pb2_grpc

DEFAULT_STOP_GRACE = 10.0
"""Seconds the front ends give requests in flight to finish when the server stops."""
STOP_MARGIN = 4.0
"""What stopping the front ends may take beyond the grace period: cut requests answer, the servers close."""
EXIT_MARGIN = 5.0
"""Every process of the server is gone at most this long after the grace period ended."""
MASTER_EXIT_S = 1.5
"""What the master keeps for its own exit after the workers have gone."""
WORKER_STOP_MIN = 1.0
"""Workers always get at least this long to exit cleanly before they are killed."""

_settings = {
    "max_enqueued_requests": DEFAULT_MAX_ENQUEUED_REQUESTS,
    "max_enqueued_bytes": DEFAULT_MAX_ENQUEUED_BYTES,
    "stop_grace": DEFAULT_STOP_GRACE,
    "heartbeat": HeartbeatSettings(),
    "request_timeout": DEFAULT_REQUEST_TIMEOUT,
    "llm_token_timeout": DEFAULT_TOKEN_TIMEOUT,
    "frontend_processes": 1,
    "api_key": os.environ.get("MS_SERVING_API_KEY") or None,
    "model_control": "none",
    "limits": Limits(),
    "restricted_api": {},
    "open_api": (),
}


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (its transports and callbacks cost far less per request), else asyncio's.
    MS_SERVING_EVENT_LOOP=asyncio forces the standard loop."""
    if os.environ.get("MS_SERVING_EVENT_LOOP", "uvloop").lower() != "asyncio":
        try:
            import uvloop  # pylint: disable=import-outside-toplevel

            return uvloop.new_event_loop()
        except ImportError:
            pass
    return asyncio.new_event_loop()


class Master:
    def __init__(self):
        log.get_level()  # a bad log variable (GLOG_v, GLOG_log_dir...) raises its ValueError before anything starts
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="serving-loop", daemon=True)
        self._thread.start()
        self.registry = WorkerRegistry()
        # bumped wherever the readiness may change: its phase, the registry, worker processes, heartbeats
        self.readiness_changes = ChangeSignal()
        self.registry.listeners.append(lambda _change, _record: self.readiness_changes.notify())
        self.metrics = MasterMetrics()
        self.dispatcher = Dispatcher(self.registry, metrics=self.metrics)
        self.llm_backend = MasterLlmBackend(self.registry, _settings["llm_token_timeout"], self.metrics)
        self.dispatcher.max_enqueued_requests = _settings["max_enqueued_requests"]
        self.dispatcher.max_enqueued_bytes = _settings["max_enqueued_bytes"]
        self.dispatcher.request_timeout = _settings["request_timeout"]
        self.address = ipc.master_address()
        self.processes = WorkerProcesses(
            self.address, self._on_worker_death, self._on_all_workers_exited, on_change=self.readiness_changes.notify
        )
        self.registry.expected = self._has_planned_workers
        self.metrics_collector = MetricsCollector(
            self.metrics, self.dispatcher, self.registry, self.processes, self.loop
        )
        self.model_control = ModelControl(self.processes, self.registry, get_stop_grace, self._close_channels)
        self.metrics_server = None  # (http server, thread) of start_metrics_server, if any
        # "grpc" / "restful" -> object with stop_accepting(), async drain_requests(grace) -> Counter of requests cut,
        # and async close() (its port stays open until then, for the probes)
        self.frontends = {}
        self.frontend_processes: FrontendProcesses | None = None  # with frontend_processes > 1, once serving
        self.stopped = threading.Event()
        self._phase = IDLE  # STARTING while start_servables runs, then SERVING (stop: STOPPING)
        self._control_server = self.run(self._start_control_server())
        self.heartbeat = WorkerHeartbeat(
            self.registry, _settings["heartbeat"], self._on_worker_unresponsive, on_change=self.readiness_changes.notify
        )
        self.loop.call_soon_threadsafe(self.heartbeat.start)
        log.info(f"Master server start success, listening on {self.address}")
        print(f"Serving: Master server start success, listening on {self.address}", flush=True)

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, phase: str):
        self._phase = phase
        self.readiness_changes.notify()

    def run(self, coro, timeout: float | None = None):
        """Runs a coroutine on the master loop from any other thread and returns its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start_control_server(self):
        server = grpc.aio.server(options=ipc.INTERNAL_CHANNEL_OPTIONS)
        internal_pb2_grpc.add_MasterControlServicer_to_server(
            MasterControlServicer(self.registry, self.processes), server
        )
        frontend_pb2_grpc.add_MasterFrontendServicer_to_server(MasterFrontendServicer(self), server)
        server.add_insecure_port(self.address)
        await server.start()
        ipc.restrict_socket(self.address)
        return server

    def frontend_count(self) -> int:
        """How many processes serve the public ports (the master included)."""
        return _settings["frontend_processes"]

    @staticmethod
    def model_control_open() -> bool:
        """Whether clients may load and unload servables (--model_control explicit)."""
        return _settings["model_control"] == "explicit"

    def ensure_frontend_processes(self) -> FrontendProcesses | None:
        """The front-end processes, started on the first public server (None with frontend_processes 1)."""
        if self.frontend_processes is None and _settings["frontend_processes"] > 1:
            processes = FrontendProcesses(
                _settings["frontend_processes"],
                self.address,
                self.loop,
                self.registry,
                self.readiness,
                self._frontend_settings,
                self.readiness_changes,
            )
            self.frontend_processes = processes
            try:
                processes.start()
            except BaseException:
                processes.terminate()
                self.frontend_processes = None
                raise
            self.metrics_collector.frontend_processes = processes
            self.frontends["front-end processes"] = processes
        return self.frontend_processes

    def _frontend_settings(self) -> dict:
        return {
            "request_timeout": self.dispatcher.request_timeout,
            "max_enqueued_requests": self.dispatcher.max_enqueued_requests,
            "max_enqueued_bytes": self.dispatcher.max_enqueued_bytes,
            "llm_token_timeout": self.llm_backend.token_timeout,
        }

    def start_metrics_server(self, host: str, port: int):
        """Serves GET /metrics on a port of its own (prometheus-client's HTTP server, in its threads)."""
        if self.metrics_server is not None:
            raise RuntimeError("Serving Error: the metrics server is already running")
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.metrics_collector)
        self.metrics_server = start_http_server(port, addr=host, registry=registry)

    def start_workers(self, plans: list[WorkerPlan]):
        self.phase = STARTING
        self.processes.start(plans)
        self.now_serving()

    def now_serving(self):
        """The server serves from now on; the collector is settled over what starting it loaded (gc_tuning)."""
        self.phase = SERVING
        gc_tuning.settle()

    def readiness(self) -> Readiness:
        """Whether the server can serve every configured servable now, and why not (any thread)."""
        phase = STOPPING if self.stopped.is_set() else self.phase
        return server_readiness(phase, self.processes.planned(), self.registry.all())

    def _has_planned_workers(self, servable_name: str, version_number: int) -> bool:
        """Whether this master runs workers of the servable (of that version; 0: any), registered or not."""
        return any(
            version_number in (0, worker.plan.version_number) for worker in self.processes.of_servable(servable_name)
        )

    def _on_worker_death(self, worker: WorkerProcess):
        record = self.registry.remove(worker.plan.key)
        if record is not None:
            log.warning(f"worker {worker.plan.key} (pid {record.pid}) is gone; its requests in flight fail")
            ipc.remove_socket(record.address)  # a killed worker could not
            if record.predict is not None:
                ipc.remove_socket(ipc.predict_address(record.address))
            self._close_channels(record)

    def _close_channels(self, record):
        if not self.loop.is_closed():
            asyncio.run_coroutine_threadsafe(record.close_channels(), self.loop)

    def _on_worker_unresponsive(self, record, reason: str):
        """A hung worker is treated as a dead one: killed, so that its requests fail and it is restarted."""
        self.processes.kill(record.key, record.pid, reason)

    def _on_all_workers_exited(self):
        stop_master()

    def stop(self, grace: float | None = None):
        """Stops the front ends (one drain: all refuse new requests at once, and requests in flight have `grace`
        seconds to finish, default the stop_grace setting), then the workers and the loop."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.readiness_changes.notify()
        grace = _settings["stop_grace"] if grace is None else grace
        exit_deadline = time.monotonic() + grace + EXIT_MARGIN
        if self.frontends:
            try:
                self.run(self._stop_frontends(grace), timeout=grace + STOP_MARGIN)
            except Exception as err:
                log.error(f"stopping the front ends failed: {describe(err)}")
        self.frontends.clear()
        if self.frontend_processes is not None:
            self.frontend_processes.terminate()  # what the drain did not end (a failed or timed-out stop)
        if self.metrics_server is not None:
            self.metrics_server[0].shutdown()
            self.metrics_server[0].server_close()
            self.metrics_server = None
        self.run(self.heartbeat.stop())
        # the workers' requests were answered or cut: they only get the time left to exit, less the master's own
        # exit (about 0.5 s, most of it the interpreter unloading MindSpore)
        self.processes.stop(max(WORKER_STOP_MIN, exit_deadline - time.monotonic() - MASTER_EXIT_S))
        for record in self.registry.clear():
            self.run(record.close_channels())
        self.run(self._control_server.stop(1))
        ipc.remove_runtime_directory(self.address)  # with what killed children left there
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()

    async def _stop_frontends(self, grace: float):
        names = list(self.frontends)
        # all at once: no front end serves new requests while another drains; the front-end processes' answers
        # are awaited, so that once this is logged none of them takes a new request
        pending = [self.frontends[name].stop_accepting() for name in names]
        await asyncio.gather(*(p for p in pending if asyncio.isfuture(p)))
        log.warning(
            f"Serving: the front ends ({', '.join(names)}) refuse new requests; requests in flight have "
            f"{grace:g} s to finish"
        )
        started = self.loop.time()
        results = await asyncio.gather(
            *(self.frontends[name].drain_requests(grace) for name in names), return_exceptions=True
        )
        # the ports close together once every front end drained: until then probes see live and not ready
        closed = await asyncio.gather(*(self.frontends[name].close() for name in names), return_exceptions=True)
        for name, failure in zip(names, closed):
            if isinstance(failure, BaseException):
                log.error(f"closing the {name} server failed: {describe(failure)}")
        cut: collections.Counter[str] = collections.Counter()
        for name, result in zip(names, results):
            if isinstance(result, BaseException):
                log.error(f"stopping the {name} server failed: {describe(result)}")
            elif result:
                cut.update(result)
        if cut:
            log.warning(
                f"Serving: the grace period of {grace:g} s ended with {sum(cut.values())} request(s) still "
                f"running, answered with an unavailable error: "
                + ", ".join(f"{count} {kind}" for kind, count in sorted(cut.items()))
            )
        else:
            log.info(f"Serving: the front ends drained in {self.loop.time() - started:.2f} s")


def describe(error: BaseException) -> str:
    """An exception's text for a log line, naming its type when its text is empty (as a timeout's is)."""
    return str(error) or repr(error)


def set_api_key(key: str | None):
    """The key every public request but the probes needs (None: none), for the servers started from now on."""
    _settings["api_key"] = key or None


def get_api_key() -> str | None:
    return _settings["api_key"]


def set_api_groups(restricted: dict, opened: tuple):
    """API group -> the key it needs instead of the server's, and the groups that need none (api_groups.py)."""
    _settings["restricted_api"] = dict(restricted)
    _settings["open_api"] = tuple(opened)


def get_api_groups() -> tuple:
    """(restricted groups' keys, opened groups)."""
    return dict(_settings["restricted_api"]), tuple(_settings["open_api"])


def set_request_limits(limits: Limits):
    """What one client may hold of the servers started from now on (common/limits.py)."""
    _settings["limits"] = limits


def get_request_limits() -> Limits:
    return _settings["limits"]


MODEL_CONTROL_MODES = ("none", "explicit", "poll")


def set_model_control(mode: str):
    """Whether the front ends offer model control (KServe v2 repository load/unload): "none" (the default: they
    answer 403 / PERMISSION_DENIED), "explicit" (load and unload on request) or "poll" (the servable directory is
    followed; requests to load or unload are refused, as Triton's poll mode does)."""
    _settings["model_control"] = mode


def set_frontend_processes(count: int):
    """How many processes serve the public ports (1: the master alone), for the servers started from now on."""
    _settings["frontend_processes"] = int(count)


def get_frontend_processes() -> int:
    return _settings["frontend_processes"]


def set_stop_grace(seconds: float):
    """Seconds requests in flight get to finish when the server stops (SIGTERM, SIGINT, server.stop())."""
    _settings["stop_grace"] = float(seconds)


def get_stop_grace() -> float:
    return _settings["stop_grace"]


def set_max_enqueued_requests(max_enqueued_requests: int):
    """The most requests the master holds at once, now and for a master started later."""
    _settings["max_enqueued_requests"] = max_enqueued_requests
    master = get_master(create=False)
    if master is not None:
        master.dispatcher.max_enqueued_requests = max_enqueued_requests


def set_max_enqueued_bytes(max_enqueued_bytes: int):
    """The most bytes of requests (serialized instances) the master holds at once, now and later."""
    _settings["max_enqueued_bytes"] = max_enqueued_bytes
    master = get_master(create=False)
    if master is not None:
        master.dispatcher.max_enqueued_bytes = max_enqueued_bytes


def get_max_enqueued_requests() -> int:
    return _settings["max_enqueued_requests"]


def set_request_timeout(seconds: float):
    """How long a request without a deadline of its own (RESTful) may take, 0 for no limit (now and later)."""
    _settings["request_timeout"] = float(seconds)
    master = get_master(create=False)
    if master is not None:
        master.dispatcher.request_timeout = float(seconds)


def set_llm_token_timeout(seconds: float):
    """How long an LLM worker's engine may show no progress while it has generations before they end with an
    error (0: no limit); a generation waiting its turn behind work that progresses never times out."""
    _settings["llm_token_timeout"] = float(seconds)
    master = get_master(create=False)
    if master is not None:
        master.llm_backend.token_timeout = float(seconds)


def set_heartbeat(interval: float, misses: int):
    """How often the master pings each worker and after how many missed pings it gives one up (now and for a
    master started later)."""
    settings = _settings["heartbeat"]
    settings.interval, settings.misses = float(interval), int(misses)


def get_heartbeat() -> HeartbeatSettings:
    return _settings["heartbeat"]


_master: Master | None = None
_master_lock = threading.Lock()


def get_master(create: bool = True) -> Master | None:
    global _master
    with _master_lock:
        if _master is None and create:
            _master = Master()
        return _master


def stop_master(grace: float | None = None):
    global _master
    with _master_lock:
        master, _master = _master, None
    if master is not None:
        master.stop(grace)


def install_signal_handlers():
    """SIGINT/SIGTERM stop everything (only possible from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, _frame):
        log.warning("Serving server begin to exit: receive exit signal")
        threading.Thread(target=stop_master, name="serving-stop").start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
