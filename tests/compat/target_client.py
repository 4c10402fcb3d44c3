"""The client side of comparison scenarios, run by the interpreter of the serving under test (ours, or MindSpore
Serving 2.0.2's Python 3.9 venv, each with its own `mindspore_serving.client` and generated protobuf modules).

    python target_client.py REQUESTS.json OBSERVATIONS.json

REQUESTS is a JSON list; each item is one request and gives one observation, in order:

    {"kind": "rest", "address": "127.0.0.1:Q", "path": "/model/add:add_common", "body": "<raw text>",
     "method": "POST"}
        -> {"status": 200, "reason": "OK", "content_type": ..., "json": {...}} (or "text" when not JSON), or
           {"connection_error": "ConnectionRefusedError"}
    {"kind": "client", "args": [address, servable, method, version?], "instances": VALUE, "call": "infer",
     "ssl": {...SSLConfig kwargs} or absent}
        -> {"result": VALUE} or {"raise": "RuntimeError", "text": ...} (from the constructor or the call)
    {"kind": "grpc", "address": "127.0.0.1:P", "request": {PredictRequest as protobuf JSON}}
        -> {"code": "OK", "reply": {PredictReply as protobuf JSON}} or {"code": "UNAVAILABLE", "details": ...}

VALUE encodes what JSON cannot hold: {"__nd__": [dtype, shape, flat values]} is a numpy array,
{"__bytes__": base64} bytes, {"__np__": [dtype, value]} a numpy scalar; other JSON is passed as it is (a list stays a
list). Results are encoded the same way. What a request prints (MindSpore Serving's client prints a failed call's
gRPC status) is its observation's "printed". Python 3.9.
"""

import base64
import contextlib
import http.client
import io
import json
import sys
import time

import grpc
import numpy as np
from google.protobuf import json_format

from mindspore_serving.client import Client, SSLConfig
from mindspore_serving.proto import ms_service_pb2, ms_service_pb2_grpc

TIMEOUT = 60


def decode(value):
    if isinstance(value, dict):
        if "__nd__" in value:
            dtype, shape, data = value["__nd__"]
            return np.array(data, dtype=dtype).reshape(shape)
        if "__bytes__" in value:
            return base64.b64decode(value["__bytes__"])
        if "__np__" in value:
            dtype, data = value["__np__"]
            return np.dtype(dtype).type(data)
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


def encode(value):
    if isinstance(value, np.ndarray):
        return {"__nd__": [str(value.dtype), list(value.shape), value.ravel().tolist()]}
    if isinstance(value, np.generic):
        return {"__np__": [str(value.dtype), value.item()]}
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(key): encode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    return value


def rest(item):
    host, port = item["address"].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        body = item.get("body")
        try:
            connection.request(item.get("method", "POST"), item["path"], body=None if body is None else body.encode())
            response = connection.getresponse()
            raw = response.read().decode(errors="replace")
        except OSError as err:  # nothing listens there (any more)
            return {"connection_error": type(err).__name__}
        seen = {
            "status": response.status,
            "reason": response.reason,
            "content_type": response.getheader("Content-Type"),
        }
        try:
            seen["json"] = json.loads(raw)
        except ValueError:
            seen["text"] = raw
        return seen
    finally:
        connection.close()


def client(item):
    try:
        ssl = SSLConfig(**item["ssl"]) if item.get("ssl") else None
        kwargs = {"ssl_config": ssl} if ssl else {}
        target = Client(*item["args"], **kwargs)
        result = getattr(target, item.get("call", "infer"))(decode(item["instances"]))
        if item.get("call") == "infer_async":
            result = result.result()
        return {"result": encode(result)}
    except Exception as err:  # the scenario observes it
        return {"raise": type(err).__name__, "text": str(err)}


def raw_grpc(item):
    request = json_format.ParseDict(item["request"], ms_service_pb2.PredictRequest())
    with grpc.insecure_channel(item["address"]) as channel:
        try:
            reply = ms_service_pb2_grpc.MSServiceStub(channel).Predict(request, timeout=item.get("timeout", TIMEOUT))
        except grpc.RpcError as err:
            return {"code": err.code().name, "details": err.details()}
    return {"code": "OK", "reply": json_format.MessageToDict(reply)}


def observe(item):
    if item.get("sleep"):
        time.sleep(item["sleep"])  # ok-sleep: a pause the scenario asks for (a worker restarting)
    kinds = {"rest": rest, "client": client, "grpc": raw_grpc}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        seen = kinds[item["kind"]](item)
    if printed.getvalue():
        seen["printed"] = printed.getvalue()
    return seen


def main():
    with open(sys.argv[1], encoding="utf-8") as stream:
        requests = json.load(stream)
    observations = []
    for item in requests:
        # "until_served": skipped once an earlier request of the list was served (polling a restarting servable)
        served = any("instances" in (seen.get("json") or {}) for seen in observations)
        observations.append({"skipped": True} if item.get("until_served") and served else observe(item))
    with open(sys.argv[2], "w", encoding="utf-8") as stream:
        json.dump(observations, stream)


if __name__ == "__main__":
    main()
