"""Starts the LLM agents of a configuration: one process per device rank, each loading its graphs.

    python start_agent.py --config config/llama_tiny.yaml

Prints "all agents started" once every agent has loaded and warmed up its graphs and is listening.
The agents exit with this script (Ctrl-C / SIGTERM), or when the worker that attached to them exits.
"""
import argparse
import signal
import sys
import threading

from mindspore_serving.worker.llm.agents import startup_agents
from mindspore_serving.spec.llm_config import load_serving_config


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="LLM configuration YAML, e.g. config/llama_tiny.yaml")
    args = parser.parse_args()
    config = load_serving_config(args.config)
    if not config.agents.start_port:
        sys.exit("agents.start_port is 0 in the configuration: standalone agents need fixed ports for the worker "
                 "to find them; set agents.start_port")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    group = startup_agents(config)
    print(f"all agents started: {', '.join(group.addresses)}", flush=True)
    while not stop.wait(0.2):
        if not group.alive():
            print("an agent exited; stopping the others", flush=True)
            break
    group.stop()


if __name__ == "__main__":
    main()
