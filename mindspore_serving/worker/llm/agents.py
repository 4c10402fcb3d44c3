"""Starts the agents of an LLM servable, one process per rank, and waits until each reports ready.

Each agent is `python -m mindspore_serving.agent.start_agent` with a pipe on which it writes one
AgentStartupEvent (ipc/agent.py): ready once its graphs are loaded and warmed up and it listens, or failed with
its reason.
"""
import os
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

from mindspore_serving import log
from mindspore_serving.common.child_process import child_env
from mindspore_serving.ipc import agent as protocol

START_TIMEOUT = float(os.environ.get("MS_SERVING_AGENT_START_TIMEOUT", "600"))
AGENT_MODULE = "mindspore_serving.agent.start_agent"
_POLL_SECONDS = 0.2


@dataclass
class AgentGroup:
    """The agent processes of one LLM servable."""
    addresses: List[str]
    processes: List[subprocess.Popen]

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.processes)

    def stop(self, timeout: float = 10.0):
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


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def agent_addresses(config) -> List[str]:
    agents = config.agents
    if agents.start_port:
        return [agents.address(rank) for rank in range(agents.num_ranks)]
    return [f"{agents.host}:{_free_port(agents.host)}" for _ in range(agents.num_ranks)]


def _spawn(config_path: str, rank: int, address: str) -> "tuple[subprocess.Popen, int]":
    read_fd, write_fd = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", AGENT_MODULE, f"--config={config_path}", f"--rank={rank}", f"--address={address}",
             f"--startup_fd={write_fd}", f"--parent_pid={os.getpid()}"],
            pass_fds=(write_fd,), env=child_env(), stdin=subprocess.DEVNULL)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return process, read_fd


def startup_agents(config, addresses: Optional[List[str]] = None) -> AgentGroup:
    """Starts one agent per rank and blocks until all are ready (models loaded, warmed up, listening).

    A rank that fails or exits before it is ready stops the others and raises RuntimeError with its reason.
    """
    addresses = addresses or agent_addresses(config)
    processes, pipes = [], {}
    group = AgentGroup(addresses, processes)
    try:
        for rank, address in enumerate(addresses):
            process, read_fd = _spawn(config.path, rank, address)
            processes.append(process)
            pipes[read_fd] = (rank, protocol.StartupEventReader())
            log.info(f"agent rank {rank} (pid {process.pid}) starting on {address}")
        _wait_ready(processes, pipes)
    except BaseException:
        group.stop()
        raise
    finally:
        for read_fd in pipes:
            os.close(read_fd)
    return group


def _wait_ready(processes: List[subprocess.Popen], pipes: dict):
    ready = set()
    deadline = time.monotonic() + START_TIMEOUT
    open_fds = set(pipes)
    while len(ready) < len(processes):
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
        dead = [rank for rank, p in enumerate(processes) if p.poll() is not None and rank not in ready]
        if dead and not readable:
            raise RuntimeError(f"agent rank {dead[0]} exited with code {processes[dead[0]].returncode} "
                               f"before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"agents not ready within {START_TIMEOUT} s")
