"""Client of the distributed servable `matmul_distributed`: gRPC, then RESTful; checked against numpy.

predict(x float32 [4, 8]) -> y = x @ w [4, 8]; w is in model/weight.npy (written by export_model.py).
Start serving_server.py and serving_agent.py first, then:

    python servables/matmul_distributed/serving_client.py [--grpc 127.0.0.1:5500] [--rest 127.0.0.1:1500]

Exits with a non-zero status when a result differs from numpy.
"""

import argparse
import json
import os
import sys
import urllib.request

import numpy as np

from mindspore_serving.client import Client

WEIGHT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model", "weight.npy")


def check(title, y, expected):
    ok = y is not None and np.allclose(np.asarray(y, np.float32), expected, rtol=1e-4, atol=1e-4)
    print(f"{title}: {'ok' if ok else 'MISMATCH'}, y[0] = {None if y is None else np.asarray(y)[0]}")
    return ok


def run_grpc(address, servable, weight):
    x = np.random.default_rng(0).random((4, 8), dtype=np.float32)
    result = Client(address, servable, "predict").infer([{"x": x}])
    y = result[0].get("y") if isinstance(result, list) else None
    if y is None:
        print(f"gRPC predict: MISMATCH, got {result}")
    return check("gRPC predict", y, x @ weight)


def run_restful(address, servable, weight):
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 8
    body = json.dumps({"instances": [{"x": x.tolist()}]}).encode()
    request = urllib.request.Request(
        f"http://{address}/model/{servable}:predict", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        reply = json.loads(response.read())
    instances = reply.get("instances")
    if not instances or "y" not in instances[0]:
        print(f"REST predict: MISMATCH, got {reply}")
        return False
    return check("REST predict", instances[0]["y"], x @ weight)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", default="127.0.0.1:5500", help="gRPC address of the server")
    parser.add_argument("--rest", default="127.0.0.1:1500", help="RESTful address of the server ('' to skip)")
    parser.add_argument("--servable", default="matmul_distributed", help="servable name")
    args = parser.parse_args()
    weight = np.load(WEIGHT)
    results = [run_grpc(args.grpc, args.servable, weight)]
    if args.rest:
        results.append(run_restful(args.rest, args.servable, weight))
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
