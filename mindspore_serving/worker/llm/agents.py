"""Starts the agents of an LLM servable, one process per rank, and waits until each reports ready.

Each agent is `python -m mindspore_serving.agent.start_agent` with a pipe on which it writes one
AgentStartupEvent (ipc/agent.py): ready once its graphs are loaded (and compiled: agents.warmup) and it listens, or
failed with its reason. A tensor-parallel group (model.tensor_parallel > 1) is a MindSpore cluster: the host of rank 0
also runs the cluster's scheduler, and every rank process gets the cluster's environment (common/ms_cluster.py).
"""

import itertools
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from mindspore_serving import log
from mindspore_serving.common import cluster_registration, ms_cluster
from mindspore_serving.common.child_process import child_env
from mindspore_serving.ipc import agent as protocol
from mindspore_serving.ipc import master_worker as ipc
from mindspore_serving.worker.llm.kv_cache import measured_num_blocks

START_TIMEOUT = float(os.environ.get("MS_SERVING_AGENT_START_TIMEOUT", "600"))
AGENT_MODULE = "mindspore_serving.agent.start_agent"
_POLL_SECONDS = 0.2


@dataclass
class AgentGroup:
    """The agent processes this process started for an LLM servable: `ranks[i]` runs in `processes[i]`;
    `addresses` are those of every rank of the servable (some may run on other hosts)."""

    addresses: list[str]
    processes: list[subprocess.Popen]
    ranks: list[int] = field(default_factory=list)
    scheduler: subprocess.Popen | None = None  # the cluster's scheduler, when this host holds rank 0
    secret: str = field(default="", repr=False)  # what Attach and Step must carry ("" for none)

    def pids(self) -> dict:
        """rank -> pid of the agents this process started (the worker checks it reached them)."""
        return {rank: process.pid for rank, process in zip(self.ranks, self.processes)}

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.processes)

    def stop(self, timeout: float = 10.0):
        """Stops every rank (and the scheduler). A rank blocked in a collective of a broken cluster does not
        answer SIGTERM: it is killed after `timeout`; the scheduler is killed at once."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.scheduler is not None and self.scheduler.poll() is None:
            self.scheduler.kill()
            self.scheduler.wait()


_GROUPS = itertools.count()


def agent_addresses(config, directory: str = "") -> list[str]:
    """Where each rank listens: host:start_port+rank with fixed ports (agents other hosts or start_agent.py
    start), else unix sockets in `directory`, the server's runtime directory (the worker starts every rank on its
    own host)."""
    agents = config.agents
    if agents.start_port:
        return [agents.address(rank) for rank in range(agents.num_ranks)]
    if not directory:
        raise ValueError("agents on unix sockets (agents.start_port 0) need the server's runtime directory")
    group = next(_GROUPS)  # a restarted group gets sockets of its own: the old one's exit removes its files
    return [
        ipc.socket_address(directory, f"serving_agent_{os.getpid()}_{group}_{rank}") for rank in range(agents.num_ranks)
    ]


def group_secret(config) -> str:
    """The secret of an agent group: MS_SERVING_AGENT_SECRET when set (agents on fixed ports, which start_agent.py
    may start, need the same on both sides; without it they take any local worker), a new one for the agents a
    worker starts on unix sockets."""
    if os.environ.get(protocol.SECRET_ENV):
        return os.environ[protocol.SECRET_ENV]
    return "" if config.agents.start_port else ipc.new_secret()


def cluster_address(config) -> ms_cluster.ClusterAddress | None:
    """The scheduler of the servable's cluster (None without tensor parallelism): agents.scheduler_address, or a
    free port on the worker's host."""
    if config.model.tensor_parallel == 1:
        return None
    agents = config.agents
    if agents.scheduler_address:
        return ms_cluster.parse_address(agents.scheduler_address, agents.num_ranks)
    return ms_cluster.ClusterAddress(agents.host, ms_cluster.free_port(agents.host), agents.num_ranks)


def _spawn(
    config_path: str,
    rank: int,
    address: str,
    cluster: ms_cluster.ClusterAddress | None,
    secret: str,
    num_blocks: int | None = None,
) -> "tuple[subprocess.Popen, int]":
    read_fd, write_fd = os.pipe()
    env = child_env() if cluster is None else ms_cluster.rank_env(cluster, rank)
    blocks = [] if num_blocks is None else [f"--num_blocks={num_blocks}"]
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                AGENT_MODULE,
                f"--config={config_path}",
                f"--rank={rank}",
                f"--address={address}",
                f"--startup_fd={write_fd}",
                f"--parent_pid={os.getpid()}",
            ]
            + blocks,
            pass_fds=(write_fd,),
            env=env,
            stdin=subprocess.PIPE,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    process.stdin.write(secret.encode() + b"\n")  # through the pipe, never on the command line
    process.stdin.close()
    return process, read_fd


def startup_agents(
    config,
    addresses: list[str] | None = None,
    ranks: Sequence[int] | None = None,
    cluster: ms_cluster.ClusterAddress | None = None,
    directory: str = "",
) -> AgentGroup:
    """Starts the agents of `ranks` (default: every rank) and blocks until all are ready (models loaded, warmed
    up, listening), at `addresses` (default: agent_addresses in `directory`). With tensor parallelism the ranks
    form a cluster at `cluster` (default: `cluster_address`), whose scheduler starts here when rank 0 is among
    `ranks`; a rank is ready only once every rank of the cluster joined, those on other hosts included.

    A rank that fails or exits before it is ready stops the others and raises RuntimeError with its reason.
    With engine.kv_cache_memory_fraction the memory is measured once here, before any rank loads, and every rank
    gets the blocks it holds (RuntimeError when it holds too little).
    """
    addresses = addresses or agent_addresses(config, directory)
    ranks = list(range(len(addresses)) if ranks is None else ranks)
    num_blocks = measured_num_blocks(config, ranks)
    if cluster is None:
        cluster = cluster_address(config)
    processes, pipes = [], {}
    group = AgentGroup(addresses, processes, ranks, secret=group_secret(config))
    if not group.secret:
        log.warning(
            f"the LLM agents on {', '.join(addresses[r] for r in ranks)} take any worker that reaches them: "
            f"set {protocol.SECRET_ENV} for them and their worker"
        )
    try:
        if cluster is not None and 0 in ranks:
            group.scheduler = ms_cluster.start_scheduler(cluster, stdout=subprocess.DEVNULL)
            log.info(f"cluster scheduler (pid {group.scheduler.pid}) of {cluster.ranks} ranks on {cluster}")
        elif cluster is not None:
            log.info(f"waiting for the cluster scheduler at {cluster} (it starts with rank 0)")
            if not ms_cluster.wait_listening(cluster, START_TIMEOUT):
                raise RuntimeError(f"no cluster scheduler listens on {cluster} within {START_TIMEOUT:.0f} s")
        registrations = cluster_registration.watching(cluster)

        def spawn(rank: int) -> subprocess.Popen:
            process, read_fd = _spawn(config.path, rank, addresses[rank], cluster, group.secret, num_blocks)
            pipes[read_fd] = (rank, protocol.StartupEventReader())
            log.info(
                f"agent rank {rank} (pid {process.pid}) starting on {addresses[rank]}"
                + (f", joining the cluster at {cluster}" if cluster is not None else "")
            )
            return process

        for rank in ranks:
            processes.append(spawn(rank))
            if registrations is not None:
                registrations.started(rank, processes[-1].pid)
        _wait_ready(processes, ranks, pipes, group.scheduler, registrations, spawn)
    except BaseException:
        group.stop()
        raise
    finally:
        for read_fd in pipes:
            os.close(read_fd)
    return group


def _wait_ready(
    processes: list[subprocess.Popen],
    ranks: list[int],
    pipes: dict,
    scheduler: subprocess.Popen | None,
    registrations: cluster_registration.RankRegistrations | None,
    spawn,
):
    ready = set()
    deadline = time.monotonic() + START_TIMEOUT
    open_fds = set(pipes)

    def restart(rank: int) -> int:
        index = ranks.index(rank)
        processes[index].kill()
        processes[index].wait()
        for read_fd in [fd for fd, (r, _) in pipes.items() if r == rank]:
            del pipes[read_fd]
            open_fds.discard(read_fd)
            os.close(read_fd)
        processes[index] = spawn(rank)
        open_fds.update(fd for fd, (r, _) in pipes.items() if r == rank)
        return processes[index].pid

    while len(ready) < len(processes):
        if registrations is not None:
            registrations.restart_stuck(restart)
        readable, _, _ = select.select(list(open_fds), [], [], _POLL_SECONDS)
        for read_fd in readable:
            rank, reader = pipes[read_fd]
            data = os.read(read_fd, 4096)
            if not data:
                open_fds.discard(read_fd)
                continue
            for event in reader.feed(data):
                if event.WhichOneof("state") == "failed_reason":
                    raise RuntimeError(f"agent rank {event.rank} failed to start: {event.failed_reason}")
                ready.add(event.rank)
                log.info(f"agent rank {event.rank} is ready (pid {event.ready_pid})")
        dead = [(rank, p) for rank, p in zip(ranks, processes) if p.poll() is not None and rank not in ready]
        if dead and not readable:
            raise RuntimeError(f"agent rank {dead[0][0]} exited with code {dead[0][1].returncode} before it was ready")
        if scheduler is not None and scheduler.poll() is not None:
            raise RuntimeError(
                f"the cluster scheduler exited with code {scheduler.returncode} before the agents were ready"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"agents not ready within {START_TIMEOUT} s")
