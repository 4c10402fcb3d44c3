"""Client of servable `add_sub` (two models and Python stages in one method): gRPC, then RESTful.

* add_sub_only_model(x1, x2, x3) -> y = (x1 + x2) - x3
* add_sub_complex(x1, x2, x3)    -> y = 2 * ((x1 + 1) + x2 - x3)

Start the server first (`python serving_server.py`), then:

    python servables/add_sub/serving_client.py [--grpc 127.0.0.1:5500] [--rest 127.0.0.1:1500]

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


def make_inputs(count):
    rng = np.random.default_rng(0)
    return [{name: rng.random((2, 2), dtype=np.float32) for name in ("x1", "x2", "x3")} for _ in range(count)]


def run_grpc(address):
    instances = make_inputs(2)
    only_model = Client(address, "add_sub", "add_sub_only_model").infer(instances)
    ok = check("gRPC add_sub_only_model", only_model, [i["x1"] + i["x2"] - i["x3"] for i in instances])
    complex_ = Client(address, "add_sub", "add_sub_complex").infer(instances)
    return check("gRPC add_sub_complex", complex_, [2 * (i["x1"] + 1 + i["x2"] - i["x3"]) for i in instances]) and ok


def run_restful(address):
    """RESTful: POST /model/<servable>:<method> with nested JSON lists (floats become float32)."""
    x1, x2, x3 = [[1.0, 2.0], [3.0, 4.0]], [[1.0, 1.0], [1.0, 1.0]], [[0.5, 0.5], [0.5, 0.5]]
    body = json.dumps({"instances": [{"x1": x1, "x2": x2, "x3": x3}]}).encode()
    request = urllib.request.Request(
        f"http://{address}/model/add_sub:add_sub_complex", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        reply = json.loads(response.read())
    expected = 2 * (np.add(x1, 1) + np.array(x2) - np.array(x3))
    return check("REST add_sub_complex", reply.get("instances", reply), [expected])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", default="127.0.0.1:5500", help="gRPC address of the server")
    parser.add_argument("--rest", default="127.0.0.1:1500", help="RESTful address of the server")
    args = parser.parse_args()
    results = [run_grpc(args.grpc), run_restful(args.rest)]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
