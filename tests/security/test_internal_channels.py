"""The secured server's internal sockets, attacked by a process of the same user (the directory and socket modes
keep other users out: test_private_files.py): a fake worker cannot register in a servable's place or retire one,
a fake worker cannot attach to the LLM agent, not even while a stream runs, and error replies name no absolute
path of the server's, no memory address and no repr of an object."""

import json
import os
import re

import grpc
import numpy as np
import pytest
import requests
from secured_server import ADD_BODY, ADMIN, AUTH, KEY, PROMPT, X

from mindspore_serving.client import Client
from mindspore_serving.proto import agent_pb2, agent_pb2_grpc, internal_pb2, internal_pb2_grpc


def _socket(server_directory, prefix: str) -> str:
    (runtime,) = os.listdir(server_directory / "unix_socket_files")
    sockets = server_directory / "unix_socket_files" / runtime
    (name,) = [n for n in os.listdir(sockets) if n.startswith(prefix) and not n.endswith(".predict")]
    return f"unix:{sockets / name}"


def _workers(url: str) -> dict:
    ready = requests.get(url + "/ready", headers=ADMIN, timeout=30).json()
    return {name: [(w["key"], w.get("pid")) for w in state["workers"]] for name, state in ready["servables"].items()}


def _add_works(grpc_addr: str):
    result = Client(grpc_addr, "add", "add_common", api_key=KEY).infer({"x1": X, "x2": X})
    np.testing.assert_array_equal(result[0]["y"], X * 2)


def test_a_fake_worker_cannot_take_over_or_retire_a_servable(server, server_directory):
    grpc_addr, url = server
    before = _workers(url)
    ((key, pid),) = before["add"]
    with grpc.insecure_channel(_socket(server_directory, "serving_master_")) as channel:
        stub = internal_pb2_grpc.MasterControlStub(channel)
        forged = [
            (
                stub.Register,
                internal_pb2.RegisterRequest(
                    protocol_version=1,
                    worker_pid=os.getpid(),
                    address="unix:/tmp/evil",
                    servable_name="add",
                    version_number=1,
                    worker_key=key,
                ),
            ),
            (stub.Exit, internal_pb2.ExitRequest(worker_pid=pid, worker_key=key, reason="forged")),
        ]
        for call, request in forged:
            for metadata in ((), (("ms-serving-peer", key), ("ms-serving-secret", "0" * 64))):
                with pytest.raises(grpc.RpcError) as refused:
                    call(request, metadata=metadata, timeout=10)
                assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert _workers(url) == before
    _add_works(grpc_addr)
    assert requests.post(url + "/model/add:add_common", json=ADD_BODY, headers=AUTH, timeout=30).status_code == 200


def test_a_fake_worker_cannot_attach_to_the_agent_while_a_stream_runs(server, server_directory):
    _, url = server
    body = {"model": "llama_tiny", "prompt": PROMPT, "max_tokens": 48, "stream": True, "ignore_eos": True}
    with requests.post(url + "/v1/completions", json=body, headers=AUTH, stream=True, timeout=60) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        first = next(line for line in lines if line.startswith(b"data: "))
        with grpc.insecure_channel(_socket(server_directory, "serving_agent_")) as channel:
            stub = agent_pb2_grpc.LlmAgentStub(channel)
            for secret in ("", "guessed"):
                with pytest.raises(grpc.RpcError) as refused:
                    next(stub.Attach(agent_pb2.AttachRequest(worker_pid=os.getpid(), secret=secret), timeout=10))
                assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        chunks = [first] + [line for line in lines if line.startswith(b"data: ")]
    assert chunks[-1] == b"data: [DONE]"
    events = [json.loads(chunk[len(b"data: ") :]) for chunk in chunks[:-1]]
    assert "error" not in events[-1] and events[-1]["choices"][0]["finish_reason"] == "length", events[-1]
    assert sum(1 for event in events if event["choices"][0]["text"]) >= 40  # every token came, none lost


def test_error_replies_name_no_absolute_path_address_or_repr(server, server_directory):
    grpc_addr, url = server
    where = str(server_directory)
    bad_add = {"instances": [{"x1": "not a tensor", "x2": {"b64": "!"}}, {"x1": X.tolist(), "x3": X.tolist()}]}
    texts = [
        requests.post(url + "/model/nope:predict", json=ADD_BODY, headers=AUTH, timeout=30).text,
        requests.post(url + "/model/add:add_common", json=bad_add, headers=AUTH, timeout=30).text,
        requests.post(url + "/v2/models/nope/infer", json={"inputs": []}, headers=AUTH, timeout=30).text,
        requests.post(
            url + "/v2/models/add/infer",
            json={"inputs": [{"name": "x1", "datatype": "FP32", "shape": [2], "data": ["x", {}]}]},
            headers=AUTH,
            timeout=30,
        ).text,
        requests.post(url + "/v1/completions", json={"model": "nope", "prompt": "x"}, headers=AUTH, timeout=30).text,
        requests.post(url + "/v2/repository/models/nope/load", headers=ADMIN, timeout=30).text,
    ]
    texts.append(str(Client(grpc_addr, "nope", "predict", api_key=KEY).infer({"x": X})))  # MindSpore's {"error"}
    texts.append(str(Client(grpc_addr, "add", "add_common", api_key=KEY).infer({"x1": X, "x3": X})))
    for text in texts:
        assert "error" in text, text
        assert where not in text and "/tmp/" not in text, text
        assert not re.search(r"0x[0-9a-fA-F]{4,}", text) and "object at" not in text, text
