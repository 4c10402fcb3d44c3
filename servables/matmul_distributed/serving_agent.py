"""Starts the 2 rank agents of `matmul_distributed` on this machine (start serving_server.py first).

    python servables/matmul_distributed/serving_agent.py [--distributed 127.0.0.1:6200] [--agent_start_port 7000]

Model files are relative to this script. Ctrl-C or SIGTERM stops the agents (and then the server's worker).
"""

import argparse

from mindspore_serving.server import distributed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distributed", default="127.0.0.1:6200", help="the server's distributed address")
    parser.add_argument("--agent_start_port", type=int, default=7000, help="port of the first agent")
    parser.add_argument("--model_dir", default="model/device{}", help="folder of rank i's matmul.mindir")
    parser.add_argument("--model_name", default="matmul.mindir", help="the model file of each rank")
    parser.add_argument("--agent_ip", default=None, help="this machine's ip (with --rank_start)")
    parser.add_argument("--rank_start", type=int, default=None, help="first rank of this machine (with --agent_ip)")
    parser.add_argument("--ranks", type=int, default=2, help="how many ranks this machine runs")
    args = parser.parse_args()
    first = args.rank_start or 0
    model_files = [f"{args.model_dir.format(first + i)}/{args.model_name}" for i in range(args.ranks)]
    distributed.startup_agents(
        distributed_address=args.distributed,
        model_files=model_files,
        agent_start_port=args.agent_start_port,
        agent_ip=args.agent_ip,
        rank_start=args.rank_start,
    )


if __name__ == "__main__":
    main()
