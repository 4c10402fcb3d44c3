"""KServe v2 checks run with the real Triton client (`tritonclient[http,grpc]`, installed in .venv-clients by
`make`, apart from the server's virtualenv: see requirements-clients.txt). Run by tests/e2e/test_kserve_v2.py:

    python triton_checks.py --http HOST:PORT --grpc HOST:PORT --images DIR CHECK...

Prints `PASS <check>` for each check, and exits non-zero at the first failure.
"""

import argparse
import asyncio
import os
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

X1 = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
X2 = np.array([[5.0, 6.0], [7.0, 8.0]], np.float32)
IMAGES = ("digit_7_0.png", "digit_2_1.png")


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def add_inputs(module, dtype="FP32", x1=X1, x2=X2, binary=True):
    inputs = []
    for name, value in (("x1", x1), ("x2", x2)):
        tensor = module.InferInput(name, list(value.shape), dtype)
        if module is grpcclient:
            tensor.set_data_from_numpy(value)
        else:
            tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    return inputs


def images(args):
    return np.array([open(os.path.join(args.images, name), "rb").read() for name in IMAGES], dtype=object)


def check_metadata(args):
    http = httpclient.InferenceServerClient(args.http)
    server = http.get_server_metadata()
    expect(server["name"] == "mindspore_serving" and "binary_tensor_data" in server["extensions"], server)
    meta = http.get_model_metadata("add.add_common")
    expect(
        meta["inputs"]
        == [{"name": "x1", "datatype": "FP32", "shape": [2, 2]}, {"name": "x2", "datatype": "FP32", "shape": [2, 2]}],
        meta,
    )
    expect(meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 2]}], meta)
    expect(http.get_model_metadata("add.add_common", model_version="1")["versions"] == ["1"], "version route")
    grpc = grpcclient.InferenceServerClient(args.grpc)
    meta = grpc.get_model_metadata("lenet.classify_top1", as_json=True)
    expect(meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": ["-1"]}], meta)
    expect(grpc.is_server_live() and grpc.is_server_ready(), "gRPC live/ready")
    expect(grpc.is_model_ready("add.add_common") and not grpc.is_model_ready("missing"), "gRPC model ready")


def check_http_infer(args):
    http = httpclient.InferenceServerClient(args.http)
    for binary in (True, False):
        outputs = [httpclient.InferRequestedOutput("y", binary_data=binary)]
        result = http.infer("add.add_common", add_inputs(httpclient, binary=binary), outputs=outputs)
        expect(np.array_equal(result.as_numpy("y"), X1 + X2), f"binary={binary}: {result.as_numpy('y')}")
    # INT32 into the method whose Python stage casts: its inputs accept any datatype
    ints = [X1.astype(np.int32), X2.astype(np.int32)]
    result = http.infer("add.add_cast", add_inputs(httpclient, "INT32", *ints))
    expect(np.array_equal(result.as_numpy("y"), X1 + X2), result.as_numpy("y"))
    # BYTES: two PNG images make two instances of lenet's batched method
    for binary in (True, False):
        image = httpclient.InferInput("image", [2], "BYTES")
        image.set_data_from_numpy(images(args), binary_data=True)
        outputs = [httpclient.InferRequestedOutput("label", binary_data=binary)]
        labels = http.infer("lenet.classify_top1", [image], outputs=outputs).as_numpy("label")
        expect([bytes(x) if isinstance(x, bytes) else x.encode() for x in labels] == [b"7", b"2"], labels)


def check_async_http(args):
    async def run():
        client = aiohttpclient.InferenceServerClient(args.http)
        try:
            results = await asyncio.gather(
                *(client.infer("add.add_common", add_inputs(aiohttpclient)) for _ in range(4))
            )
            for result in results:
                expect(np.array_equal(result.as_numpy("y"), X1 + X2), result.as_numpy("y"))
            expect((await client.get_model_metadata("add.add_cast"))["name"] == "add.add_cast", "async metadata")
        finally:
            await client.close()

    asyncio.run(run())


def check_grpc_infer(args):
    grpc = grpcclient.InferenceServerClient(args.grpc)
    result = grpc.infer("add.add_common", add_inputs(grpcclient), model_version="1")
    expect(np.array_equal(result.as_numpy("y"), X1 + X2), result.as_numpy("y"))
    image = grpcclient.InferInput("image", [2], "BYTES")
    image.set_data_from_numpy(images(args))
    labels = grpc.infer("lenet.classify_top1_batch", [image]).as_numpy("label")
    expect(list(labels) == [b"7", b"2"], labels)
    index = grpc.get_model_repository_index(as_json=True)["models"]
    names = {model["name"] for model in index}
    expect(names == {"add.add_common", "add.add_cast", "lenet.classify_top1", "lenet.classify_top1_batch"}, names)
    expect(all(model["state"] == "READY" for model in index), index)
    expect(len(httpclient.InferenceServerClient(args.http).get_model_repository_index()) == 4, "REST index")


def failure(call):
    try:
        call()
    except InferenceServerException as err:
        return err
    raise AssertionError("the call did not fail")


def check_bad_inputs(args):
    http = httpclient.InferenceServerClient(args.http)
    grpc = grpcclient.InferenceServerClient(args.grpc)
    x64 = X1.astype(np.float64)
    err = failure(lambda: http.infer("add.add_common", add_inputs(httpclient, "FP64", x64, x64)))
    expect(err.status() == "400" and "input 'x1' has datatype FP64" in err.message(), (err.status(), err.message()))
    err = failure(lambda: grpc.infer("add.add_common", add_inputs(grpcclient, "FP64", x64, x64)))
    expect(err.status() == "StatusCode.INVALID_ARGUMENT" and "input 'x1'" in err.message(), err.message())
    wide = np.zeros((2, 3), np.float32)
    err = failure(lambda: http.infer("add.add_common", add_inputs(httpclient, "FP32", wide, wide)))
    expect(err.status() == "400" and "input 'x1' has shape [2, 3]" in err.message(), err.message())
    err = failure(lambda: grpc.infer("add.add_common", add_inputs(grpcclient, "FP32", wide, wide)))
    expect(err.status() == "StatusCode.INVALID_ARGUMENT" and "shape [2, 3]" in err.message(), err.message())
    err = failure(lambda: http.infer("missing", add_inputs(httpclient)))
    expect(err.status() == "404", (err.status(), err.message()))
    err = failure(lambda: grpc.infer("missing", add_inputs(grpcclient)))
    expect(err.status() == "StatusCode.NOT_FOUND", err.status())
    err = failure(lambda: grpc.load_model("missing"))
    expect(err.status() == "StatusCode.NOT_FOUND" and "missing" in err.message(), (err.status(), err.message()))
    err = failure(lambda: http.unload_model("missing"))
    expect(err.status() == "400" and "not loaded" in err.message(), (err.status(), err.message()))


def check_repository(args):
    """A load/unload round trip through the Triton clients (run last: lenet is reloaded)."""
    http = httpclient.InferenceServerClient(args.http)
    grpc = grpcclient.InferenceServerClient(args.grpc)
    http.unload_model("lenet")
    names = {model["name"] for model in http.get_model_repository_index()}
    expect(names == {"add.add_common", "add.add_cast"}, names)
    expect(not grpc.is_model_ready("lenet.classify_top1"), "unloaded lenet is not ready")
    grpc.load_model("lenet")
    expect(grpc.is_model_ready("lenet.classify_top1"), "lenet back (gRPC)")
    expect(http.is_model_ready("lenet.classify_top1"), "lenet back (HTTP)")
    image = httpclient.InferInput("image", [2], "BYTES")
    image.set_data_from_numpy(images(args))
    labels = http.infer("lenet.classify_top1_batch", [image]).as_numpy("label")
    expect(list(labels) == [b"7", b"2"], labels)


def check_api_key(args):
    """A server started with --api_key: the clients' `headers=` carry it; without them, 401 / UNAUTHENTICATED."""

    def headers():  # a new dict per call: the HTTP client adds its own entries to the one it is given
        return {"authorization": f"Bearer {args.api_key}"}

    http = httpclient.InferenceServerClient(args.http)
    grpc = grpcclient.InferenceServerClient(args.grpc)
    result = http.infer("add.add_common", add_inputs(httpclient), headers=headers())
    expect(np.array_equal(result.as_numpy("y"), X1 + X2), result.as_numpy("y"))
    result = grpc.infer("add.add_common", add_inputs(grpcclient), headers=headers())
    expect(np.array_equal(result.as_numpy("y"), X1 + X2), result.as_numpy("y"))
    expect(http.is_server_ready() and grpc.is_server_ready(), "the probes need no key")
    err = failure(lambda: http.infer("add.add_common", add_inputs(httpclient)))
    expect(err.status() == "401", (err.status(), err.message()))
    err = failure(lambda: grpc.infer("add.add_common", add_inputs(grpcclient)))
    expect(err.status() == "StatusCode.UNAUTHENTICATED", (err.status(), err.message()))
    err = failure(lambda: grpc.get_model_metadata("add.add_common", headers={"authorization": "Bearer wrong"}))
    expect(err.status() == "StatusCode.UNAUTHENTICATED", (err.status(), err.message()))


CHECKS = {name[len("check_") :]: function for name, function in globals().items() if name.startswith("check_")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", required=True)
    parser.add_argument("--grpc", required=True)
    parser.add_argument("--images", required=True)
    parser.add_argument("--api_key", default="")
    parser.add_argument("checks", nargs="+", choices=sorted(CHECKS))
    args = parser.parse_args()
    for name in args.checks:
        CHECKS[name](args)
        print(f"PASS {name}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
