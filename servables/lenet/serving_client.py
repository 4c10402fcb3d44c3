"""Client of servable `lenet` (handwritten digit classifier): sends the bundled PNG files by gRPC and RESTful.

* classify_top1(image bytes) -> label str, called by gRPC with the raw PNG bytes;
* classify_top1_batch(image bytes) -> label str, called by RESTful with the PNG in base64.

Start the server first (`python serving_server.py`), then:

    python servables/lenet/serving_client.py [--grpc 127.0.0.1:5500] [--rest 127.0.0.1:1500]

The file names hold the true digit (images/digit_<label>_<n>.png). Exits with a non-zero status when the two
protocols disagree or when fewer than 80% of the digits are recognised.
"""

import argparse
import base64
import glob
import json
import os
import sys
import urllib.request

from mindspore_serving.client import Client

IMAGES = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "images", "*.png")))
MIN_ACCURACY = 0.8


def read(path):
    with open(path, "rb") as file:
        return file.read()


def labels_of(title, result):
    """The predicted labels, in the order of IMAGES; None when the request failed."""
    if not isinstance(result, list) or len(result) != len(IMAGES) or not all("label" in item for item in result):
        print(f"{title}: FAILED, got {result}")
        return None
    labels = [item["label"] for item in result]
    print(f"{title:>26}: {' '.join(labels)}")
    return labels


def run_grpc(address):
    client = Client(address, "lenet", "classify_top1")
    return labels_of("gRPC classify_top1", client.infer([{"image": read(path)} for path in IMAGES]))


def run_restful(address):
    """Bytes travel in JSON as {"b64": ...} (the type defaults to bytes)."""
    instances = [{"image": {"b64": base64.b64encode(read(path)).decode()}} for path in IMAGES]
    request = urllib.request.Request(
        f"http://{address}/model/lenet:classify_top1_batch",
        data=json.dumps({"instances": instances}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        reply = json.loads(response.read())
    return labels_of("REST classify_top1_batch", reply.get("instances", reply))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", default="127.0.0.1:5500", help="gRPC address of the server")
    parser.add_argument("--rest", default="127.0.0.1:1500", help="RESTful address of the server")
    args = parser.parse_args()
    grpc_labels, rest_labels = run_grpc(args.grpc), run_restful(args.rest)
    if grpc_labels is None or rest_labels is None:
        sys.exit(1)
    truth = [os.path.basename(path).split("_")[1] for path in IMAGES]
    print(f"{'true digits':>26}: {' '.join(truth)}")
    accuracy = sum(label == want for label, want in zip(grpc_labels, truth)) / len(truth)
    print(f"accuracy: {accuracy:.0%} of {len(truth)} digits; gRPC and REST agree: {grpc_labels == rest_labels}")
    sys.exit(0 if grpc_labels == rest_labels and accuracy >= MIN_ACCURACY else 1)


if __name__ == "__main__":
    main()
