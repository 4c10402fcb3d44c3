"""A killed LLM agent, end to end: every request in flight or queued gets "unavailable, retry later" (HTTP 503 +
Retry-After, or an error event of the unavailable type) whose text names the model and what happened, and the
service comes back on its own. Also: garbage sent to MSService/Predict is INVALID_ARGUMENT."""

import json
import signal
import threading
import time

import grpc
import psutil
import pytest
import requests
from llm_setup import write_config, write_servable
from serving_process import start_server

MODEL = "llama_tiny"
RECOVERY_S = 120


def agents_of(proc):
    return [
        p
        for p in psutil.Process(proc.proc.pid).children(recursive=True)
        if "mindspore_serving.agent.start_agent" in p.cmdline()
    ]


def completion(url, **extra):
    return requests.post(
        f"{url}/v1/completions",
        timeout=60,
        json={"model": MODEL, "prompt": "And the king of", "max_tokens": 8, **extra},
    )


def assert_retry_later(reply):
    assert reply.status_code == 503, reply.text
    assert int(reply.headers["retry-after"]) >= 1
    return reply.json()


def assert_names_the_loss(text):
    assert f"of {MODEL}" in text and "<" not in text and "model step failed" not in text, text


@pytest.fixture(name="server")
def _server(tmp_path):
    # one sequence at a time: the second and third requests wait in the engine's queue
    config = write_config(tmp_path, start_port=0, max_num_seqs=1, max_queue_size=4)
    proc, grpc_addr, rest_addr = start_server(
        tmp_path, servables=(MODEL,), extra_args=["--servable_directory", write_servable(tmp_path, config)]
    )
    try:
        yield proc, grpc_addr, f"http://{rest_addr}"
    finally:
        proc.close()


def test_a_killed_agent_fails_every_request_as_unavailable_then_service_recovers(server):
    proc, _, url = server
    (agent,) = agents_of(proc)
    results = {}
    stream = requests.post(
        f"{url}/v1/completions",
        stream=True,
        timeout=60,
        json={"model": MODEL, "prompt": "And the king of", "max_tokens": 240, "temperature": 0, "stream": True},
    )
    events = (line[len("data: ") :] for line in stream.iter_lines(decode_unicode=True) if line.startswith("data: "))
    next(events)  # the stream is running

    def tgi():
        results["tgi"] = requests.post(
            f"{url}/generate", timeout=60, json={"inputs": "Once", "parameters": {"max_new_tokens": 8}}
        )

    def queued():
        results["queued"] = completion(url)

    threads = [threading.Thread(target=tgi), threading.Thread(target=queued)]
    for thread in threads:
        thread.start()
    for _ in range(5):  # a few more tokens: the other two requests have reached the engine's queue meanwhile
        next(events)
    agent.send_signal(signal.SIGKILL)
    rest = list(events)
    for thread in threads:
        thread.join(60)

    assert rest[-1] == "[DONE]"
    error = json.loads(rest[-2])["error"]
    assert (error["type"], error["code"]) == ("server_error", "service_unavailable")
    assert error["message"].startswith(f"LLM agent rank 0 of {MODEL} ")  # is gone / did not answer the step
    assert "Rendezvous" not in error["message"] and "<" not in error["message"]
    assert_names_the_loss(error["message"])
    body = assert_retry_later(results["tgi"])
    assert body["error_type"] == "unavailable"
    assert_names_the_loss(body["error"])
    body = assert_retry_later(results["queued"])
    assert body["error"]["code"] == "service_unavailable"
    assert_names_the_loss(body["error"]["message"])

    # while the worker restarts every answer is "retry later", never "no such model"; then it serves again
    deadline = time.monotonic() + RECOVERY_S
    while True:
        reply = completion(url)
        if reply.status_code == 200:
            break
        assert_retry_later(reply)
        assert time.monotonic() < deadline, "the LLM service did not come back"
        time.sleep(0.2)  # ok-sleep: polling with a deadline
    assert reply.json()["usage"]["completion_tokens"] == 8
    unknown = requests.post(f"{url}/v1/completions", timeout=60, json={"model": "nope", "prompt": "Hi"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_garbage_to_predict_is_invalid_argument(server):
    _, grpc_addr, _ = server
    with grpc.insecure_channel(grpc_addr) as channel:
        predict = channel.unary_unary("/mindspore.serving.proto.MSService/Predict")
        with pytest.raises(grpc.RpcError) as info:
            predict(b"\x0a\xff\xff\xff\x0f not a protobuf", timeout=30)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid mindspore.serving.proto.PredictRequest" in info.value.details()
