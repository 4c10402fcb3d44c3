"""Starts the agents of an LLM servable, one process per rank, and waits until each reports ready."""
import multiprocessing
import os
import queue
import socket
import time
from dataclasses import dataclass
from typing import List, Optional

from mindspore_serving import log
from mindspore_serving.agent.agent_process import FAILED, READY, run_agent

START_TIMEOUT = float(os.environ.get("MS_SERVING_AGENT_START_TIMEOUT", "600"))


@dataclass
class AgentGroup:
    """The agent processes of one LLM servable."""
    addresses: List[str]
    processes: List[multiprocessing.Process]

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.processes)

    def stop(self, timeout: float = 10.0):
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def agent_addresses(config) -> List[str]:
    agents = config.agents
    if agents.start_port:
        return [agents.address(rank) for rank in range(agents.num_ranks)]
    return [f"{agents.host}:{_free_port(agents.host)}" for _ in range(agents.num_ranks)]


def startup_agents(config, startup_queue=None, addresses: Optional[List[str]] = None) -> AgentGroup:
    """Spawns one agent per rank and blocks until all are ready (models loaded, warmed up, listening).

    Each ready agent puts ("ready", rank, pid) on `startup_queue` (a new one when None). A rank that fails or
    dies before it is ready stops the others and raises RuntimeError with its reason.
    """
    context = multiprocessing.get_context("spawn")
    startup_queue = startup_queue or context.Queue()
    addresses = addresses or agent_addresses(config)
    processes = []
    for rank, address in enumerate(addresses):
        process = context.Process(target=run_agent, name=f"llm-agent-rank{rank}",
                                  args=(config.path, rank, address, startup_queue, os.getpid()), daemon=False)
        process.start()
        processes.append(process)
        log.info(f"agent rank {rank} (pid {process.pid}) starting on {address}")
    group = AgentGroup(addresses, processes)
    ready = set()
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while len(ready) < len(processes):
            try:
                state, rank, detail = startup_queue.get(timeout=0.2)
            except queue.Empty:
                dead = [rank for rank, p in enumerate(processes) if not p.is_alive() and rank not in ready]
                if dead:
                    raise RuntimeError(f"agent rank {dead[0]} exited with code {processes[dead[0]].exitcode} "
                                       f"before it was ready")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"agents not ready within {START_TIMEOUT} s")
                continue
            if state == FAILED:
                raise RuntimeError(f"agent rank {rank} failed to start: {detail}")
            if state == READY:
                ready.add(rank)
                log.info(f"agent rank {rank} is ready (pid {detail})")
    except BaseException:
        group.stop()
        raise
    return group
