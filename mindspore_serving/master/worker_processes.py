"""Starts worker processes, waits for them to register, notices deaths and restarts them."""

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mindspore_serving import log
from mindspore_serving.common import metrics
from mindspore_serving.common.child_process import child_env
from mindspore_serving.common.restart_budget import RestartBudget
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.ipc import shm_tensors
from mindspore_serving.master.readiness import PlannedWorker

LOG_DIR = "serving_logs"
MONITOR_INTERVAL = 0.05
START_TIMEOUT = float(os.environ.get("MS_SERVING_WORKER_START_TIMEOUT", "600"))
STOP_GRACE = 10.0
MAX_QUICK_RESTARTS = 5  # restarts allowed within RESTART_WINDOW before a worker is given up
RESTART_WINDOW = 60.0
WORKER_MODULE = "mindspore_serving.worker.start_worker"  # what operators look for in `ps`
EXTRA_WORKER_MODULE = "mindspore_serving.worker.start_extra_worker"
DISTRIBUTED_WORKER_MODULE = "mindspore_serving.worker.distributed.start_distributed_worker"


@dataclass
class WorkerPlan:
    """Everything needed to (re)start one worker."""

    servable_directory: str
    servable_name: str
    version_number: int
    device_type: str | None
    device_id: int
    dec_key: bytes | None = field(repr=False)  # never in a log line
    dec_mode: str
    # an extra worker (num_parallel_workers beyond the device ids): it runs the servable's Python stages and calls
    # the models of its device workers; with no device ids at all it loads them itself and owns a device
    extra_index: int | None = None
    device_ids_empty: bool = False
    # a distributed servable's worker (server.distributed.start_servable) when rank_table_json_file is set
    rank_table_json_file: str = ""
    distributed_address: str = ""
    wait_agents_time_in_seconds: int = 0
    env: dict[str, str] = field(default_factory=dict)  # added to the child's environment (a distributed worker's TLS)
    # >0 for a worker loaded beside a running one of the same servable, version and device (a reload): its key
    # differs, so that both can be registered while the old one drains
    generation: int = 0

    @property
    def distributed(self) -> bool:
        return bool(self.rank_table_json_file)

    @property
    def extra(self) -> bool:
        return self.extra_index is not None

    @property
    def owns_device(self) -> bool:
        """Whether it counts among the workers that occupy devices: the master exits when none of them is left."""
        return not self.extra or self.device_ids_empty

    @property
    def slot(self) -> str:
        """What it serves of its servable version: `device<id>`, `extra<i>` or `distributed`."""
        if self.distributed:
            return "distributed"
        return f"extra{self.extra_index}" if self.extra else f"device{self.device_id}"

    @property
    def device_label(self) -> str:
        return metrics.device_label(self.device_id, self.extra_index)

    @property
    def where(self) -> str:
        """The worker in start-up errors: `device id:<d>` or `extra:<i>`."""
        return f"extra:{self.extra_index}" if self.extra else f"device id:{self.device_id}"

    @property
    def failure_label(self) -> str:
        """The worker in "Fail to start workers: {...}", as MindSpore Serving names it: an extra worker by its
        servable, version and index, the others by servable name and device id."""
        if self.extra:
            return f"servable:{self.servable_name}, version:{self.version_number}, extra:{self.extra_index}"
        return f"servable name:{self.servable_name}, device id:{self.device_id}"

    @property
    def repr_label(self) -> str:
        """The worker in MindSpore Serving's log lines: `servable name: <n>, version: <v>, extra: <i>` (or
        `device id: <d>`)."""
        where = f"extra: {self.extra_index}" if self.extra else f"device id: {self.device_id}"
        return f"servable name: {self.servable_name}, version: {self.version_number}, {where}"

    @property
    def restartable(self) -> bool:
        """A distributed worker is never restarted: its agents are bound to it."""
        return not self.distributed

    @property
    def key(self) -> str:
        if self.distributed:
            return f"{self.servable_name}/v{self.version_number}/distributed"
        suffix = f"/g{self.generation}" if self.generation else ""
        return f"{self.servable_name}/v{self.version_number}/{self.slot}{suffix}"

    @property
    def log_path(self) -> str:
        if self.distributed:
            return os.path.join(LOG_DIR, f"log_{self.servable_name}_distributed.log")
        return os.path.join(LOG_DIR, f"log_{self.servable_name}_{self.slot}_version{self.version_number}.log")

    @property
    def start_timeout(self) -> float:
        """A distributed worker waits for its agents as long as the user asked (0: forever)."""
        if self.distributed:
            return (
                self.wait_agents_time_in_seconds + START_TIMEOUT if self.wait_agents_time_in_seconds else float("inf")
            )
        return START_TIMEOUT

    def command(self, master_address: str) -> list[str]:
        if self.distributed:
            return [
                sys.executable,
                "-m",
                DISTRIBUTED_WORKER_MODULE,
                f"--servable_directory={self.servable_directory}",
                f"--servable_name={self.servable_name}",
                f"--version_number={self.version_number}",
                f"--rank_table_json_file={self.rank_table_json_file}",
                f"--distributed_address={self.distributed_address}",
                f"--wait_agents_time_in_seconds={self.wait_agents_time_in_seconds}",
                f"--master_address={master_address}",
                f"--worker_key={self.key}",
            ]
        cmd = [
            sys.executable,
            "-m",
            EXTRA_WORKER_MODULE if self.extra else WORKER_MODULE,
            f"--servable_directory={self.servable_directory}",
            f"--servable_name={self.servable_name}",
            f"--version_number={self.version_number}",
            f"--device_type={self.device_type or 'none'}",
        ]
        if self.extra:
            cmd.append(f"--extra_index={self.extra_index}")
            if self.device_ids_empty:
                cmd.append("--device_ids_empty")
        else:
            cmd.append(f"--device_id={self.device_id}")
        cmd += [f"--master_address={master_address}", f"--worker_key={self.key}", f"--dec_mode={self.dec_mode}"]
        if self.dec_key:
            cmd.append("--read_dec_key")
        return cmd


@dataclass
class WorkerProcess:
    plan: WorkerPlan
    process: subprocess.Popen | None = None
    registered: threading.Event = field(default_factory=threading.Event)
    failure: str | None = None
    starts: int = 0
    restarts: RestartBudget = field(default_factory=lambda: RestartBudget(MAX_QUICK_RESTARTS, RESTART_WINDOW))
    expected_exit: bool = False
    restarting: bool = False  # between its death and its new process: readiness says "restarting", not "stopped"
    restarted: int = 0  # times the master restarted it after it died
    python_stages: bool = True  # as registered: some method has a stage that is not a model (extra workers help)
    secret: str = field(default="", repr=False)  # what its calls to the master carry (ipc.peer_metadata)


class WorkerProcesses:
    """The set of worker processes of one master."""

    def __init__(
        self,
        master_address: str,
        on_death: Callable[[WorkerProcess], None],
        on_all_exited: Callable[[], None],
        on_change: Callable[[], None] = lambda: None,
    ):
        self.master_address = master_address
        self.on_death = on_death
        self.on_all_exited = on_all_exited
        self.on_change = on_change  # what planned() says may have changed (the master's readiness)
        self.workers: dict[str, WorkerProcess] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        shm_tensors.remove_orphan_blocks()  # model-call memory of a master killed before it could remove it

    # ---- start ----
    def spawn(self, worker: WorkerProcess):
        plan = worker.plan
        ipc.private_directory(LOG_DIR)  # 0700, this user's, not a link: the logs hold what clients sent
        log_file = log.open_private(plan.log_path, "w" if worker.starts == 0 else "a")
        cmd = plan.command(self.master_address)
        worker.registered.clear()
        worker.failure = None
        worker.expected_exit = False
        worker.secret = ipc.new_secret()  # a new one for each start: a dead worker's no longer opens anything
        worker.process = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**child_env(), **plan.env},
        )
        log_file.close()
        # the secret, and the decryption key, travel through a pipe, never on the command line
        worker.process.stdin.write(worker.secret.encode() + b"\n")
        if plan.dec_key:
            worker.process.stdin.write(plan.dec_key.hex().encode() + b"\n")
        worker.process.stdin.close()
        worker.starts += 1
        self.on_change()
        log.info(f"started worker {plan.key} pid {worker.process.pid}, log {plan.log_path}")

    def start(self, plans: list[WorkerPlan]):
        """Starts the workers and blocks until all have registered; raises with the reason otherwise.

        As in MindSpore Serving, the extra workers start once the device workers have registered, and none starts
        for a servable version whose device workers have only model stages: an extra worker would only forward."""
        self._start_and_wait([plan for plan in plans if not plan.extra])
        self._start_and_wait(self._useful_extras([plan for plan in plans if plan.extra]))
        self.ensure_monitor()

    def _useful_extras(self, plans: list[WorkerPlan]) -> list[WorkerPlan]:
        with self._lock:
            model_only = {
                (w.plan.servable_name, w.plan.version_number)
                for w in self.workers.values()
                if not w.plan.extra and w.registered.is_set() and not w.python_stages
            }
        skipped = sorted(
            {plan.servable_name for plan in plans if (plan.servable_name, plan.version_number) in model_only}
        )
        for name in skipped:
            log.warning(
                f"There is no need to startup additional worker processes, all stages are models, servable: {name}"
            )
        return [plan for plan in plans if (plan.servable_name, plan.version_number) not in model_only]

    def _start_and_wait(self, plans: list[WorkerPlan]):
        new = []
        with self._lock:
            for plan in plans:
                worker = WorkerProcess(plan)
                self.workers[plan.key] = worker
                new.append(worker)
        for worker in new:
            self.spawn(worker)
        start = time.monotonic()
        for worker in new:
            plan = worker.plan
            deadline = start + plan.start_timeout
            while not worker.registered.wait(0.05):
                if worker.failure is not None:
                    raise RuntimeError(f"Fail to start workers: {{{plan.failure_label}, <{worker.failure}>}}")
                if worker.process.poll() is not None:
                    raise RuntimeError(
                        f"Fail to start workers because of death of one worker "
                        f"(servable {plan.servable_name}, {plan.where}, "
                        f"exit code {worker.process.returncode}, see {plan.log_path})"
                    )
                if self._stop.is_set():
                    raise RuntimeError("Fail to start workers because of signal SIGINT or SIGTERM")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Fail to start workers: {{{plan.failure_label}, "
                        f"<no registration within {plan.start_timeout} s>}}"
                    )

    def load(self, plans: list[WorkerPlan]):
        """Starts more workers while the others serve and blocks until they have registered; when one fails,
        every worker of this call is killed and forgotten before the error is raised (the others are untouched)."""
        try:
            self.start(plans)
        except BaseException:
            keys = {plan.key for plan in plans}
            for worker in self.detach(keys):
                if worker.process is not None:
                    kill_group(worker.process)
                    worker.process.wait()
            raise

    def of_servable(self, servable_name: str) -> list[WorkerProcess]:
        with self._lock:
            return [w for w in self.workers.values() if w.plan.servable_name == servable_name]

    def detach(self, keys) -> list[WorkerProcess]:
        """Forgets workers `keys` (an unload): the monitor neither restarts them nor counts them any more."""
        with self._lock:
            detached = [self.workers.pop(key) for key in list(keys) if key in self.workers]
        for worker in detached:
            worker.expected_exit = True
        self.on_change()
        return detached

    @staticmethod
    def terminate(worker: WorkerProcess, grace: float):
        """SIGTERM to a detached worker, SIGKILL to its process group when it is still alive after `grace` s."""
        process = worker.process
        if process is None:
            return
        try:
            process.send_signal(signal.SIGTERM)
            process.wait(grace)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            log.warning(f"worker {worker.plan.key} (pid {process.pid}) did not exit in {grace:g} s; killing it")
        kill_group(process)  # what it started goes with it
        process.wait()
        worker.process = None  # a detached worker: planned() no longer shows it
        _remove_call_blocks(worker.plan, process.pid)

    def planned(self) -> list[PlannedWorker]:
        """The workers this master runs, for its readiness (a worker given up has no process any more)."""
        with self._lock:
            workers = list(self.workers.values())
        return [
            PlannedWorker(
                key=w.plan.key,
                servable_name=w.plan.servable_name,
                running=w.process is not None or w.starts == 0 or w.restarting,
                starts=w.starts + int(w.restarting),
            )
            for w in workers
        ]

    # ---- notices from workers (called from the control service) ----
    def find(self, key: str) -> WorkerProcess | None:
        with self._lock:
            return self.workers.get(key)

    def secret_of(self, key: str) -> str:
        """The secret of the worker started under `key` ("" for a key this master did not start)."""
        worker = self.find(key)
        return worker.secret if worker is not None else ""

    def mark_registered(self, key: str, python_stages: bool = True):
        worker = self.find(key)
        if worker is not None:
            worker.python_stages = python_stages
            worker.registered.set()

    def mark_failed(self, key: str, pid: int, message: str):
        """A worker reported why it could not start: MindSpore Serving's two ERROR lines, and its start fails."""
        worker = self.find(key)
        if worker is None:
            log.error(f"worker {key} (pid {pid}) failed to start: {message}")
            return
        plan = worker.plan
        log.error(f"Worker notify failed, worker pid: {pid}, error reported: <{{{plan.failure_label}, <{message}>}}>")
        log.error(f"Notify worker start-up error, {plan.repr_label}, worker pid: {pid}")
        worker.failure = message

    def restart_counts(self) -> list:
        """[(key, (plan, restarts))] of every worker this master runs."""
        with self._lock:
            return [(key, (worker.plan, worker.restarted)) for key, worker in self.workers.items()]

    def kill(self, key: str, pid: int, reason: str):
        """Kills worker `key` if it still runs as `pid` (a hung worker); the monitor then handles its death."""
        worker = self.find(key)
        process = worker.process if worker is not None else None
        if process is None or process.pid != pid or process.poll() is not None:
            return
        log.warning(f"killing worker {key} (pid {pid}) and the processes it started: {reason}")
        kill_group(process)

    def mark_exiting(self, key: str):
        worker = self.find(key)
        if worker is not None:
            worker.expected_exit = True

    # ---- monitor ----
    def ensure_monitor(self):
        if self._monitor is None or not self._monitor.is_alive():
            self._stop.clear()
            # non-daemon: like MindSpore Serving, it keeps serving_server.py alive until stop()
            self._monitor = threading.Thread(target=self._watch, name="serving-monitor", daemon=False)
            self._monitor.start()

    def _watch(self):
        while not self._stop.wait(MONITOR_INTERVAL):
            with self._lock:
                workers = list(self.workers.values())
            for worker in workers:
                if worker.process is None or worker.process.poll() is None:
                    continue
                if worker.starts == 1 and not worker.registered.is_set():
                    continue  # a first start is judged by start(), which reports why it failed
                self._handle_death(worker)
            if device_owners_gone(workers) and not self._stop.is_set():
                log.error("Serving server begin to exit: all worker processes that occupy devices have exited")
                self._stop.set()
                threading.Thread(target=self.on_all_exited, name="serving-exit").start()
                return

    def _handle_death(self, worker: WorkerProcess):
        plan = worker.plan
        code = worker.process.returncode
        worker.restarting = True  # until it is decided otherwise below
        self.on_change()
        try:
            self._restart_after_death(worker, plan, code)
        finally:
            worker.restarting = False
            self.on_change()

    def _restart_after_death(self, worker: WorkerProcess, plan: WorkerPlan, code: int | None):
        kill_group(worker.process)  # what it started (LLM agents) goes with it, even if stopped or hung
        _remove_call_blocks(plan, worker.process.pid)
        worker.process = None
        self.on_death(worker)
        if self._stop.is_set():
            return
        if worker.expected_exit:
            log.warning(f"worker {plan.key} exited (code {code})")
            return
        if not plan.restartable:
            log.error(
                f"worker {plan.key} exited (code {code}); a distributed worker is not restarted, see {plan.log_path}"
            )
            return
        if not worker.restarts.spend():
            log.error(
                f"worker {plan.key} died {MAX_QUICK_RESTARTS} times within {RESTART_WINDOW:.0f} s; "
                f"it is not restarted again, see {plan.log_path}"
            )
            return
        log.warning(f"worker {plan.key} died unexpectedly (exit code {code}); restarting it")
        try:
            self.spawn(worker)
            worker.restarted += 1
        except OSError as err:
            log.error(f"cannot restart worker {plan.key}: {err}")

    # ---- stop ----
    def stop(self, grace: float = STOP_GRACE):
        """Asks every worker to exit (SIGINT, as MindSpore Serving), then kills the ones still alive after `grace`
        seconds; each second of the wait says so, in MindSpore Serving's words."""
        self._stop.set()
        with self._lock:
            workers = list(self.workers.values())  # kept until they are gone: their Exit notices are heard
        alive = [w for w in workers if w.process is not None and w.process.poll() is None]
        for worker in alive:
            log.warning(
                f"Send signal {int(signal.SIGINT)} to worker, {worker.plan.repr_label}, pid: {worker.process.pid}"
            )
            try:
                worker.process.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        pending = [w.process for w in alive]
        while pending and time.monotonic() < deadline:
            try:
                pending[0].wait(min(1.0, max(0.0, deadline - time.monotonic())))
                pending.pop(0)
            except subprocess.TimeoutExpired:
                log.warning(
                    "Wait for all worker processes to exit, otherwise they will be forcibly killed in "
                    f"{max(0, round(deadline - time.monotonic()))} seconds."
                )
        for process in pending:
            if process.poll() is None:
                log.warning(f"worker pid {process.pid} did not exit in {grace:g} s; killing it")
                kill_group(process)
            process.wait()
        with self._lock:
            self.workers.clear()
        self.on_change()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=5)
        self._monitor = None
        shm_tensors.remove_blocks(os.getpid())  # what killed extra workers left


def device_owners_gone(workers: list[WorkerProcess]) -> bool:
    """Whether no worker that occupies a device runs any more (then the server exits). Extra workers that call
    other workers' models do not count, unless no worker owns a device."""
    owners = [w for w in workers if w.plan.owns_device] or workers
    # a worker being started (starts == 0) has no process yet but is not gone
    return bool(owners) and all(w.process is None and w.starts for w in owners)


def _remove_call_blocks(plan: WorkerPlan, pid: int):
    """The shared memory of the model calls an extra worker was making when it died (it unlinks its own)."""
    if plan.extra:
        shm_tensors.remove_blocks(os.getpid(), pid)


def kill_group(process: subprocess.Popen):
    """SIGKILL to a worker's process group: the worker (started in a session of its own) and every process it
    started that did not leave the group (its LLM agents and their cluster scheduler). A stopped process dies
    too, where one waiting to notice its parent's death never would."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        try:
            process.kill()
        except ProcessLookupError:
            pass
