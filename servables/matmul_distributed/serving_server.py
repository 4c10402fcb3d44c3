"""Serves the distributed servable `matmul_distributed`: its worker waits on 127.0.0.1:6200 for the agents
started by serving_agent.py, then gRPC and RESTful front ends open.

    python servables/matmul_distributed/serving_server.py [--grpc 127.0.0.1:5500] [--rest 127.0.0.1:1500]
                                                          [--distributed 127.0.0.1:6200]
"""

import argparse
import os

from mindspore_serving import server
from mindspore_serving.server import distributed

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", default="127.0.0.1:5500", help="gRPC address")
    parser.add_argument("--rest", default="127.0.0.1:1500", help="RESTful address ('' to disable)")
    parser.add_argument("--distributed", default="127.0.0.1:6200", help="where the worker waits for the agents")
    parser.add_argument("--rank_table", default=os.path.join(HERE, "rank_table_2pcs.json"), help="rank table file")
    args = parser.parse_args()
    distributed.start_servable(
        os.path.dirname(HERE),
        "matmul_distributed",
        rank_table_json_file=args.rank_table,
        version_number=1,
        distributed_address=args.distributed,
    )
    server.start_grpc_server(args.grpc)
    if args.rest:
        server.start_restful_server(args.rest)


if __name__ == "__main__":
    main()
