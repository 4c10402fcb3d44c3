"""Client of servable `add` (y = x1 + x2 on [2, 2] float32): gRPC with mindspore_serving.client, then RESTful.

Start the server first (`python serving_server.py`), then:

    python servables/add/serving_client.py [--grpc 127.0.0.1:5500] [--rest 127.0.0.1:1500]

Exits with a non-zero status when a result differs from numpy.
"""

import argparse
import json
import sys
import urllib.request

import numpy as np

from mindspore_serving.client import Client


def check(title, result, expected):
    """Prints the outputs and compares output 'y' of each instance with numpy; True when all match."""
    print(f"{title}: {result}")
    if not isinstance(result, list) or len(result) != len(expected):
        print(f"{title}: MISMATCH, expected {len(expected)} instances")
        return False
    ok = all("y" in item and np.allclose(np.asarray(item["y"]), want) for item, want in zip(result, expected))
    print(f"{title}: {'ok' if ok else 'MISMATCH'}")
    return ok


def run_add_common(address):
    """Three instances in one request, each [2, 2] float32."""
    client = Client(address, "add", "add_common")
    x1 = np.asarray([[1, 2], [3, 4]], np.float32)
    x2 = np.asarray([[5, 6], [7, 8]], np.float32)
    instances = [{"x1": x1 * i, "x2": x2} for i in range(3)]
    return check("gRPC add_common", client.infer(instances), [x1 * i + x2 for i in range(3)])


def run_add_cast_async(address):
    """add_cast casts any numeric input to float32 in a Python stage; infer_async returns at once."""
    client = Client(address, "add", "add_cast")
    x1 = np.arange(4, dtype=np.int32).reshape(2, 2)
    x2 = np.ones((2, 2), np.float64)
    future = client.infer_async({"x1": x1, "x2": x2})
    return check("gRPC add_cast (async)", future.result(), [(x1 + x2).astype(np.float32)])


def run_restful(address):
    """RESTful: POST /model/<servable>:<method> with nested JSON lists (floats become float32)."""
    x1 = [[1.0, 2.0], [3.0, 4.0]]
    x2 = [[0.5, 0.5], [0.5, 0.5]]
    body = json.dumps({"instances": [{"x1": x1, "x2": x2}]}).encode()
    request = urllib.request.Request(
        f"http://{address}/model/add:add_common", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        reply = json.loads(response.read())
    return check("REST add_common", reply.get("instances", reply), [np.add(x1, x2)])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", default="127.0.0.1:5500", help="gRPC address of the server")
    parser.add_argument("--rest", default="127.0.0.1:1500", help="RESTful address of the server")
    args = parser.parse_args()
    results = [run_add_common(args.grpc), run_add_cast_async(args.grpc), run_restful(args.rest)]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
