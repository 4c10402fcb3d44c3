"""`mindspore-serving agent` (and `python start_agent.py`): starts the LLM agents of a configuration on this host,
one process per device rank, each loading its graphs.

    mindspore-serving agent --config config/llama_tiny.yaml                   # every rank, here
    mindspore-serving agent --config llm.yaml --rank_start 1 [--scheduler_address 10.0.0.1:7090]
                                                                              # a second host joins the group

Prints "all agents started" once every agent it started has loaded (and compiled: agents.warmup) its graphs and is
listening.

Without --rank_start it starts every rank (and, for a tensor-parallel model, the cluster scheduler); they exit with
this command (Ctrl-C / SIGTERM), or when the worker that attached to them exits, and so does this command.

With --rank_start K it starts rank K and the following ranks that run on the same host (agents.rank_hosts), which
join the cluster whose scheduler runs beside rank 0 (agents.scheduler_address, or the flag). It keeps them
running: when one of them exits (the group failed, or its worker went away and will restart the group) it stops
the others and starts them again, to join the next cluster.
"""

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from mindspore_serving import log
from mindspore_serving.common import ms_cluster
from mindspore_serving.spec.llm_config import load_serving_config
from mindspore_serving.worker.llm.agents import agent_addresses, startup_agents

RESTART_DELAY = 1.0  # seconds between a failed group on this host and its next start


def local_ranks(config, rank_start: int):
    agents = config.agents
    if not 0 <= rank_start < agents.num_ranks:
        sys.exit(f"--rank_start {rank_start} is not a rank of the configuration (ranks 0..{agents.num_ranks - 1})")
    host = agents.host_of(rank_start)
    return [rank for rank in agents.ranks_on(host) if rank >= rank_start]


def cluster_of(config, scheduler_address: str):
    if config.model.tensor_parallel == 1:
        return None
    address = scheduler_address or config.agents.scheduler_address
    if not address:
        sys.exit(
            "a rank other than 0 joins the cluster of rank 0's host: give --scheduler_address host:port or set "
            "agents.scheduler_address"
        )
    try:
        return ms_cluster.parse_address(address, config.agents.num_ranks)
    except ValueError as err:
        sys.exit(str(err))


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The flags of the command."""
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="LLM configuration YAML, e.g. config/llama_tiny.yaml")
    parser.add_argument(
        "--rank_start",
        type=int,
        default=None,
        help="first rank to start here (a host joining the group); default: every rank",
    )
    parser.add_argument(
        "--scheduler_address", default="", help="host:port of the cluster scheduler (default: agents.scheduler_address)"
    )
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> None:
    """Starts the agents and keeps them (or, joining a group, their restarts) until Ctrl-C or SIGTERM."""
    args = build_parser(prog).parse_args(argv)
    log.get_level()  # a bad log variable raises its ValueError before anything starts
    config = load_serving_config(args.config)
    if not config.agents.start_port:
        sys.exit(
            "agents.start_port is 0 in the configuration: standalone agents need fixed ports for the worker "
            "to find them; set agents.start_port"
        )
    stop = threading.Event()
    starting = threading.Event()

    def on_signal(*_):
        stop.set()
        if starting.is_set():  # startup_agents stops what it started
            raise SystemExit(0)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    joining = args.rank_start is not None and args.rank_start > 0
    ranks = local_ranks(config, args.rank_start or 0)
    cluster = cluster_of(config, args.scheduler_address) if joining else None
    if not joining and args.scheduler_address and config.model.tensor_parallel > 1:
        cluster = cluster_of(config, args.scheduler_address)
    addresses = agent_addresses(config)
    while not stop.is_set():
        starting.set()
        try:
            group = startup_agents(config, addresses, ranks=ranks, cluster=cluster)
        except RuntimeError as err:
            starting.clear()
            if not joining:
                sys.exit(str(err))
            log.warning(f"agents of ranks {ranks} failed to start ({err}); starting them again")
            stop.wait(RESTART_DELAY)
            continue
        starting.clear()
        print(f"all agents started: {', '.join(addresses[r] for r in ranks)}", flush=True)
        while not stop.wait(0.2) and group.alive():
            pass
        if not stop.is_set():
            print("an agent exited; stopping the others", flush=True)
        group.stop(timeout=3.0)
        if not joining:
            break
