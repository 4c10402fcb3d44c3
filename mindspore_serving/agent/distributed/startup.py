"""startup_agents: one rank agent process per local rank, as ranks of a MindSpore cluster, watched as a group.

Runs in the user's serving_agent.py. It reads the config from the distributed worker (AcquireConfig), picks the
local ranks, and starts the cluster: the machine with rank 0 starts the scheduler on its own ip and publishes
its address to the worker, where the other machines' startup_agents read it. Then it starts the rank processes
and waits until each wrote its ready line ("Child <i>: Receive success"), which carries the notice token the worker
gave the rank: the notices this machine sends the worker carry one of them. Afterwards a (non-daemon) monitor thread
keeps the process alive: when any rank process or the scheduler dies, or on SIGINT/SIGTERM, it tells the
worker (AgentExit) and stops the whole group, since the other ranks would block in their next collective.
"""

import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import grpc

from mindspore_serving import log
from mindspore_serving.agent.distributed.startup_checks import (
    check_startup_args,
    resolve_model_files,
    select_local_ranks,
)
from mindspore_serving.common import check_type, cluster_registration
from mindspore_serving.common.ms_cluster import ClusterAddress, free_port, parse_address, rank_env, start_scheduler
from mindspore_serving.ipc import distributed as protocol
from mindspore_serving.ipc import internal_tls
from mindspore_serving.proto import distributed_pb2 as dpb
from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc

RANK_AGENT_MODULE = "mindspore_serving.agent.distributed.start_rank_agent"
CONFIG_WAIT_SECONDS = 60.0  # how long to retry reaching the worker and to wait for the scheduler's address
START_WAIT_SECONDS = 600.0  # how long the ranks may take to load their graphs and register
MONITOR_INTERVAL = 0.1
STOP_GRACE = 2.0


def acquire_config(distributed_address: str, need_scheduler: bool) -> dpb.AgentConfig:
    """The worker's AgentConfig, retried while the worker is not up yet (and, with need_scheduler, until rank 0's
    machine published the scheduler's address)."""
    deadline = time.monotonic() + CONFIG_WAIT_SECONDS
    with protocol.channel(distributed_address) as channel:
        stub = dpb_grpc.DistributedWorkerStub(channel)
        while True:
            try:
                config = stub.AcquireConfig(
                    dpb.AcquireConfigRequest(protocol_version=protocol.DISTRIBUTED_PROTOCOL_VERSION),
                    timeout=5,
                    wait_for_ready=True,
                )
                if config.error.error_code:
                    raise RuntimeError(config.error.error_msg.decode(errors="replace"))
                if not need_scheduler or config.scheduler_address:
                    return config
                reason = "the machine of rank 0 has not started the cluster's scheduler"
            except grpc.RpcError as err:
                reason = f"{err.code()}: {err.details()}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"Failed to get agents config from worker {distributed_address}: {reason}")
            time.sleep(0.2)  # ok-sleep: polling a peer with a deadline


def _notify_worker(distributed_address: str, agent_ip: str, reason: str, failed: bool, notice_token: str):
    try:
        with protocol.channel(distributed_address) as channel:
            stub = dpb_grpc.DistributedWorkerStub(channel)
            call = stub.AgentFailed if failed else stub.AgentExit
            call(dpb.AgentNotice(agent_ip=agent_ip, reason=reason, notice_token=notice_token), timeout=3)
    except grpc.RpcError as err:
        log.warning(f"cannot tell the distributed worker {distributed_address} that the agents stop: {err.details()}")


@dataclass
class AgentGroupProcesses:
    """The processes this machine started: the ranks and, on rank 0's machine, the cluster's scheduler."""

    distributed_address: str
    agent_ip: str
    ranks: list[subprocess.Popen] = field(default_factory=list)
    scheduler: subprocess.Popen | None = None
    stop_event: threading.Event = field(default_factory=threading.Event)
    notice_tokens: dict[int, str] = field(default_factory=dict)  # index in `ranks` -> its ready line's token

    def notice_token(self) -> str:
        """A notice token of one of these ranks ("" while none registered)."""
        return next((token for token in self.notice_tokens.values() if token), "")

    def notify_worker(self, reason: str, failed: bool):
        _notify_worker(self.distributed_address, self.agent_ip, reason, failed, self.notice_token())

    def all(self) -> list[subprocess.Popen]:
        return self.ranks + ([self.scheduler] if self.scheduler is not None else [])

    def kill_all(self):
        alive = [p for p in self.all() if p.poll() is None]
        for process in alive:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for process in alive:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def lost(self) -> str | None:
        for index, process in enumerate(self.ranks):
            if process.poll() is not None:
                return f"Child {index}, pid={process.pid} has exited"
        if self.scheduler is not None and self.scheduler.poll() is not None:
            return f"the cluster scheduler, pid={self.scheduler.pid}, has exited"
        return None

    def monitor(self):
        """After start-up: the first loss (or a stop signal) stops the whole group."""
        while not self.stop_event.wait(MONITOR_INTERVAL):
            reason = self.lost()
            if reason is not None:
                log.warning(reason)
                break
        else:
            reason = "agents stopped on signal"
        self.notify_worker(reason, failed=False)
        self.kill_all()
        log.warning(f"agents on {self.agent_ip} stopped: {reason}")


def _wait_ready(group: AgentGroupProcesses, ready_fds: list[int], restart_stuck):
    """Waits for every rank's ready line. `restart_stuck()` restarts the ranks stuck joining the cluster and returns
    their indexes, whose entries of `ready_fds` and group.ranks it replaced."""
    pending = {fd: index for index, fd in enumerate(ready_fds)}
    buffers = {fd: b"" for fd in ready_fds}
    deadline = time.monotonic() + START_WAIT_SECONDS
    while pending:
        if group.stop_event.is_set():
            raise RuntimeError("Fail to start agents because of Ctrl+C")
        for index in restart_stuck():
            pending = {fd: i for fd, i in pending.items() if i != index}
            pending[ready_fds[index]] = index
            buffers[ready_fds[index]] = b""
            group.notice_tokens.pop(index, None)
        readable, _, _ = select.select(list(pending), [], [], MONITOR_INTERVAL)
        for fd in readable:
            chunk = os.read(fd, 4096)
            buffers[fd] += chunk
            index = pending[fd]
            notice_token = protocol.read_ready_line(buffers[fd])
            if notice_token is not None:
                group.notice_tokens[index] = notice_token
                print(f"Child {index}: Receive success", flush=True)
                log.info(f"Child {index}: Receive success")
                del pending[fd]
            elif buffers[fd].startswith(protocol.FAILED_PREFIX) and buffers[fd].endswith(b"\n"):
                reason = buffers[fd][len(protocol.FAILED_PREFIX) :].decode(errors="replace").strip()
                raise RuntimeError(f"Child {index} exception happen: {reason}")
            elif not chunk:
                del pending[fd]
                raise RuntimeError("Fail to start agents because of death of one agent")
        if group.lost() is not None:
            raise RuntimeError(f"Fail to start agents because of death of one agent: {group.lost()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"Fail to start agents: not ready within {START_WAIT_SECONDS} s")


def _install_signal_handlers(group: AgentGroupProcesses):
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: group.stop_event.set())


def startup_agents(
    distributed_address,
    model_files,
    group_config_files=None,
    agent_start_port=7000,
    agent_ip=None,
    rank_start=None,
    dec_key=None,
    dec_mode="AES-GCM",
    ssl_config=None,
):
    """See server.distributed.startup_agents."""
    log.get_level()  # a bad log variable raises its ValueError before anything starts
    if ssl_config is not None:  # this process's channels and, inherited, its ranks'
        os.environ.update(internal_tls.ssl_config_env(internal_tls.DISTRIBUTED_PREFIX, ssl_config))
    internal_tls.from_env(internal_tls.DISTRIBUTED_PREFIX)  # half a TLS setting fails before anything starts
    model_files, _ = check_startup_args(
        distributed_address, model_files, group_config_files, agent_start_port, dec_key, dec_mode
    )
    if (agent_ip is None) != (rank_start is None):
        select_local_ranks([], agent_ip, rank_start, agent_start_port)  # raises the pairing error
    config = acquire_config(distributed_address, need_scheduler=False)
    rank_ips = [rank.ip for rank in config.rank_list]
    local_ip, local_ranks = select_local_ranks(rank_ips, agent_ip, rank_start, agent_start_port)
    paths = resolve_model_files(model_files, local_ranks, check_type.script_directory())
    group = AgentGroupProcesses(distributed_address, local_ip)
    _warn_if_exposed(local_ip, agent_start_port, len(local_ranks))
    _install_signal_handlers(group)
    ready_fds = []
    summary = (
        f"distributed worker_address: {distributed_address}, agent_ip: {local_ip}, agent_start_port: "
        f"{agent_start_port}, device ids: {[config.rank_list[r].device_id for r in local_ranks]}, rank ids: "
        f"{local_ranks}, model files: {paths}"
    )
    try:
        cluster = _cluster_address(group, config, local_ranks, local_ip)
        registrations = cluster_registration.watching(cluster)

        def spawn(index: int) -> tuple[subprocess.Popen, int]:
            rank_id = local_ranks[index]
            read_fd, write_fd = os.pipe()
            cmd = [
                sys.executable,
                "-m",
                RANK_AGENT_MODULE,
                f"--rank_id={rank_id}",
                f"--device_id={config.rank_list[rank_id].device_id}",
                f"--model_file={paths[index]}",
                f"--agent_address={local_ip}:{agent_start_port + index}",
                f"--distributed_address={distributed_address}",
                f"--ready_fd={write_fd}",
                f"--dec_mode={dec_mode}",
            ]
            if dec_key:
                cmd.append("--read_dec_key")
            process = subprocess.Popen(
                cmd,
                env=rank_env(cluster, rank_id),
                pass_fds=(write_fd,),
                stdin=subprocess.PIPE if dec_key else subprocess.DEVNULL,
            )
            os.close(write_fd)
            if dec_key:  # the key travels through a pipe, never on the command line
                process.stdin.write(dec_key.hex().encode() + b"\n")
                process.stdin.close()
            return process, read_fd

        for index, rank_id in enumerate(local_ranks):
            process, read_fd = spawn(index)
            group.ranks.append(process)
            ready_fds.append(read_fd)
            registrations.started(rank_id, process.pid)

        def restart(rank_id: int) -> int:
            index = local_ranks.index(rank_id)
            group.ranks[index].kill()
            group.ranks[index].wait()
            os.close(ready_fds[index])
            group.ranks[index], ready_fds[index] = spawn(index)
            return group.ranks[index].pid

        _wait_ready(
            group, ready_fds, lambda: [local_ranks.index(rank) for rank in registrations.restart_stuck(restart)]
        )
    except BaseException as err:
        log.error(f"Failed to start agents, {summary}: {err}")
        print(f"Failed to start agents, {summary}", flush=True)
        group.notify_worker(str(err), failed=True)
        group.kill_all()
        raise
    finally:
        for fd in ready_fds:
            os.close(fd)
    print(f"Success to start agents, {summary}", flush=True)
    threading.Thread(target=group.monitor, name="agents-monitor", daemon=False).start()
    return group


def _warn_if_exposed(local_ip: str, agent_start_port: int, count: int):
    ports = f"{agent_start_port}" if count == 1 else f"{agent_start_port}-{agent_start_port + count - 1}"
    exposed = protocol.exposure_warning(
        f"{local_ip}:{ports}",
        "the rank agents",
        "their inputs, outputs and call tokens travel in plaintext, so a host that sees the traffic can read them "
        "and call the ranks with those tokens",
    )
    if exposed:
        log.warning(exposed)


def _cluster_address(
    group: AgentGroupProcesses, config: dpb.AgentConfig, local_ranks: list[int], local_ip: str
) -> ClusterAddress:
    """Rank 0's machine starts the scheduler on its ip and publishes it; the others read it from the worker."""
    if 0 not in local_ranks:
        config = acquire_config(group.distributed_address, need_scheduler=True)
        return parse_address(config.scheduler_address, config.rank_size)
    cluster = ClusterAddress(local_ip, free_port(local_ip), config.rank_size)
    group.scheduler = start_scheduler(cluster)
    with protocol.channel(group.distributed_address) as channel:
        dpb_grpc.DistributedWorkerStub(channel).PublishScheduler(
            dpb.PublishSchedulerRequest(scheduler_address=str(cluster)), timeout=5
        )
    log.info(f"the cluster scheduler of the agents listens on {cluster}")
    return cluster
