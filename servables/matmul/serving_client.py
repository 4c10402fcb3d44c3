"""Client of servable `matmul` (one model with two subgraphs, called from a Python stage): gRPC, then RESTful.

predict(x1 float32 [128, 96], x2 float32 [8, 96]) -> y1 = x1 @ w0 [128, 16], y2 = x2 @ w1 [8, 16]; the weights
are in 1/weights.npz next to the models.

Start the server first (`python serving_server.py`), then:

    python servables/matmul/serving_client.py [--grpc 127.0.0.1:5500] [--rest 127.0.0.1:1500]

Exits with a non-zero status when a result differs from numpy.
"""

import argparse
import base64
import json
import os
import sys
import urllib.request

import numpy as np

from mindspore_serving.client import Client

WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "1", "weights.npz")


def check(title, result, expected):
    """Prints the output shapes and compares y1 and y2 of each instance with numpy; True when all match."""
    if not isinstance(result, list) or len(result) != len(expected):
        print(f"{title}: MISMATCH, got {result}")
        return False
    ok = True
    for item, (want1, want2) in zip(result, expected):
        if "y1" not in item or "y2" not in item:
            print(f"{title}: MISMATCH, got {item}")
            return False
        y1, y2 = np.asarray(item["y1"], np.float32), np.asarray(item["y2"], np.float32)
        print(f"{title}: y1 {y1.shape}, y2 {y2.shape}, y2[0, :4] = {y2[0, :4]}")
        ok = ok and np.allclose(y1, want1, rtol=1e-4, atol=1e-4) and np.allclose(y2, want2, rtol=1e-4, atol=1e-4)
    print(f"{title}: {'ok' if ok else 'MISMATCH'}")
    return ok


def run_grpc(address, w0, w1):
    rng = np.random.default_rng(0)
    x1 = rng.random((128, 96), dtype=np.float32)
    x2 = rng.random((8, 96), dtype=np.float32)
    result = Client(address, "matmul", "predict").infer({"x1": x1, "x2": x2})
    return check("gRPC predict", result, [(x1 @ w0, x2 @ w1)])


def tensor_b64(array):
    """A typed tensor for the RESTful API: raw little-endian bytes in base64, with its type and shape."""
    return {"b64": base64.b64encode(array.tobytes()).decode(), "type": "fp32", "shape": list(array.shape)}


def run_restful(address, w0, w1):
    x1 = np.full((128, 96), 0.5, np.float32)
    x2 = np.arange(8 * 96, dtype=np.float32).reshape(8, 96) / 768
    body = json.dumps({"instances": [{"x1": tensor_b64(x1), "x2": tensor_b64(x2)}]}).encode()
    request = urllib.request.Request(
        f"http://{address}/model/matmul:predict", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        reply = json.loads(response.read())
    return check("REST predict", reply.get("instances", reply), [(x1 @ w0, x2 @ w1)])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", default="127.0.0.1:5500", help="gRPC address of the server")
    parser.add_argument("--rest", default="127.0.0.1:1500", help="RESTful address of the server")
    args = parser.parse_args()
    weights = np.load(WEIGHTS)
    w0, w1 = weights["w0"], weights["w1"]
    results = [run_grpc(args.grpc, w0, w1), run_restful(args.rest, w0, w1)]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
