"""Faults under load: a worker or an LLM agent that hangs (SIGSTOP) or dies (SIGKILL) while requests are in flight.

One server serves `add` and the tiny LLM. For each fault, concurrent requests run on REST, gRPC and SSE; every one
must be answered (an answer or an error, never silence) within the bound, and the service must come back by
itself within the recovery bound. At the end SIGTERM stops the server and every process it started.
"""

import json
import os
import shutil
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import requests
from llm_setup import write_config, write_servable
from prometheus_client.parser import text_string_to_metric_families
from serving_process import ROOT, assert_sigterm_stops_all, start_server, wait_recovered

from mindspore_serving.client import Client

ANSWER_BOUND_S = 5.0  # every request in flight is answered within this after the fault
RECOVERY_BOUND_S = 90.0  # the service answers again within this (a worker or agent group restarts on 2 busy cores)
UNDER_WAY_BOUND_S = 60.0  # the concurrent LLM requests are all running in the engine within this
X = [[1.0, 2.0], [3.0, 4.0]]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("faults")
    config = write_config(directory, start_port=0)
    servables = write_servable(directory, config)
    shutil.copytree(os.path.join(ROOT, "servables", "add"), os.path.join(servables, "add"))  # beside the LLM
    proc, grpc_addr, rest_addr = start_server(
        directory, servables=("add", "llama_tiny"), extra_args=["--servable_directory", servables]
    )
    try:
        yield proc, grpc_addr, f"http://{rest_addr}"
        children = psutil.Process(proc.proc.pid).children(recursive=True)
        assert_sigterm_stops_all(proc, children)
    finally:
        proc.close()


def _process_of(proc, marker):
    (found,) = [p for p in psutil.Process(proc.proc.pid).children(recursive=True) if marker in " ".join(p.cmdline())]
    return found


def _add_rest(rest):
    reply = requests.post(f"{rest}/model/add:add_common", json={"instances": [{"x1": X, "x2": X}]}, timeout=60)
    return reply.status_code, reply.json()


def _add_grpc(grpc_addr):
    return Client(grpc_addr, "add", "add_common").infer({"x1": np.array(X, np.float32), "x2": np.array(X, np.float32)})


def _sse(rest):
    with requests.post(
        f"{rest}/v1/completions",
        stream=True,
        timeout=60,
        json={"model": "llama_tiny", "prompt": "And God said", "max_tokens": 200, "stream": True, "ignore_eos": True},
    ) as reply:
        events = [line[len(b"data: ") :] for line in reply.iter_lines() if line.startswith(b"data: ")]
    return reply.status_code, [json.loads(e) for e in events if e != b"[DONE]"]


def _under_fault(calls, victim, sig, under_way=None):
    """Starts `calls` (name -> function) concurrently, sends `sig` to `victim` once they are under way (`under_way()`
    is true, or 0.3 s passed where there is no such signal), and returns name -> (seconds from the fault to the
    answer, answer or exception)."""
    answers, started = {}, threading.Barrier(len(calls) + 1)

    def run(name, call):
        started.wait()
        try:
            result = call()
        except Exception as err:  # an answer too: the failure the client sees
            result = err
        answers[name] = (time.monotonic(), result)

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    started.wait()
    if under_way is None:
        time.sleep(0.3)  # ok-sleep: let the calls reach the worker before the fault
    else:
        wait_recovered(under_way, UNDER_WAY_BOUND_S)
    fault_at = time.monotonic()
    victim.send_signal(sig)
    for thread in threads:
        thread.join(ANSWER_BOUND_S + 30)
    return {name: (at - fault_at, result) for name, (at, result) in answers.items()}


def _add_works(rest):
    status, body = _add_rest(rest)
    return status == 200 and "instances" in body


def _llm_running(rest, count):
    """Whether the engine runs `count` requests: read from GET /metrics, which reads the engine's scheduler."""
    text = requests.get(f"{rest}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mindspore_serving:num_requests_running" and sample.labels["model_name"] == "llama_tiny":
                return sample.value >= count
    return False


def _llm_works(rest):
    reply = requests.post(
        f"{rest}/v1/completions", timeout=30, json={"model": "llama_tiny", "prompt": "And God", "max_tokens": 4}
    )
    return reply.status_code == 200


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["hung", "killed"])
def test_a_classic_worker_that_hangs_or_dies_under_load_fails_its_requests_fast_and_comes_back(server, sig):
    proc, grpc_addr, rest = server
    victim = _process_of(proc, "--servable_name=add")
    calls = {f"rest{i}": (lambda: _add_rest(rest)) for i in range(3)}
    calls.update({f"grpc{i}": (lambda: _add_grpc(grpc_addr)) for i in range(3)})
    answers = _under_fault(calls, victim, sig)
    assert set(answers) == set(calls)  # none lost
    for name, (after, result) in answers.items():
        assert after < ANSWER_BOUND_S, (name, after, result)
        assert not isinstance(result, BaseException), (name, result)
    wait_recovered(lambda: _add_works(rest), RECOVERY_BOUND_S)
    if sig == signal.SIGSTOP:
        assert not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE  # killed, not left stopped


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["hung", "killed"])
def test_an_llm_agent_that_hangs_or_dies_ends_every_stream_fast_and_the_group_comes_back(server, sig):
    proc, grpc_addr, rest = server
    victim = _process_of(proc, "mindspore_serving.agent.start_agent")
    calls = {f"sse{i}": (lambda: _sse(rest)) for i in range(2)}
    calls["grpc_stream"] = lambda: list(
        Client(grpc_addr, "llama_tiny", "generate").infer_stream(
            {"prompt": "And God said", "max_new_tokens": np.int32(200), "ignore_eos": True}
        )
    )
    calls["classic_rest"] = lambda: requests.post(
        f"{rest}/model/llama_tiny:generate",
        timeout=60,
        json={"instances": [{"prompt": "And God said", "max_new_tokens": 200, "ignore_eos": True}]},
    ).json()
    answers = _under_fault(calls, victim, sig, under_way=lambda: _llm_running(rest, len(calls)))
    assert set(answers) == set(calls)
    for name, (after, result) in answers.items():
        assert after < ANSWER_BOUND_S, (name, after, result)
        assert not isinstance(result, BaseException), (name, result)
    for name in ("sse0", "sse1"):
        status, events = answers[name][1]
        assert status == 200 and "error" in events[-1], events[-1:]
    assert "error" in answers["grpc_stream"][1][-1]
    assert "error" in json.dumps(answers["classic_rest"][1])
    wait_recovered(lambda: _llm_works(rest), RECOVERY_BOUND_S)
    _add_works(rest)  # the other servable never noticed
