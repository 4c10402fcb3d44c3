"""SIGTERM drains both front ends at once within one grace period (`--grace`), against a real server serving a
slow classic servable and the tiny LLM: requests in flight that fit finish, new ones are refused on both front
ends, those cut at the end get their protocol's error, and every process is gone within grace + 5 s."""

import json
import os
import shutil
import signal
import threading
import time

import numpy as np
import psutil
import requests
from llm_setup import write_config, write_servable
from serving_process import ROOT, start_server, wait_until

from mindspore_serving.client import Client

SLOW_SERVABLE = os.path.join(ROOT, "tests", "servables", "slow")
PROMPT = "And the king of"
REFUSED_MARK = "refuse new requests"
EXIT_MARGIN_S = 5.0


class Background:
    """Runs calls in threads and keeps each one's result (or the exception it raised) by name."""

    def __init__(self):
        self.results, self._threads = {}, []

    def start(self, name, fn, *args):
        def run():
            try:
                self.results[name] = fn(*args)
            except Exception as err:  # the test asserts on it
                self.results[name] = err

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self, timeout):
        for thread in self._threads:
            thread.join(timeout)
        return self.results


def start(tmp_path, grace, **engine):
    """serving_server.py with the slow classic servable and the tiny LLM, `--grace grace`."""
    config = write_config(tmp_path, start_port=0, **engine)
    servables = write_servable(tmp_path, config)
    shutil.copytree(SLOW_SERVABLE, os.path.join(servables, "slow"))
    marker = tmp_path / "stage_started"
    proc, grpc_addr, rest_addr = start_server(
        tmp_path,
        servables=("slow", "llama_tiny"),
        extra_args=["--servable_directory", servables, "--grace", str(grace)],
        env={"SLOW_STAGE_STARTED": str(marker)},
    )
    return proc, grpc_addr, f"http://{rest_addr}", marker


def stage_starts(marker):
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def open_sse(url, path, body, first_event: threading.Event):
    """POSTs a streamed request; returns (status, content type, the JSON of every data event)."""
    with requests.post(url + path, json=body, stream=True, timeout=60) as response:
        events = []
        for line in response.iter_lines(decode_unicode=True):
            if line.startswith("data:"):
                first_event.set()
                payload = line[len("data:") :].strip()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        return response.status_code, response.headers.get("content-type"), events


def grpc_stream(grpc_addr, max_new_tokens, first_reply: threading.Event):
    replies = []
    for reply in Client(grpc_addr, "llama_tiny", "generate").infer_stream(
        {"prompt": PROMPT, "max_new_tokens": np.int32(max_new_tokens), "ignore_eos": np.bool_(True)}
    ):
        first_reply.set()
        replies.append(reply)
    return replies


def rest_connections(proc, port):
    """Connections the server process has accepted on `port` (a request sent on one is being served)."""
    return sum(
        1
        for conn in psutil.Process(proc.proc.pid).net_connections("tcp")
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_ESTABLISHED
    )


def sigterm_and_time(proc):
    children = psutil.Process(proc.proc.pid).children(recursive=True)
    assert children
    proc.proc.send_signal(signal.SIGTERM)
    return time.monotonic(), children


def assert_all_gone(proc, sent, children, grace):
    code = proc.wait_exit(grace + EXIT_MARGIN_S + 5)
    exited_after = time.monotonic() - sent
    _, alive = psutil.wait_procs(children, timeout=max(0.1, sent + grace + EXIT_MARGIN_S - time.monotonic()))
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert code == 0
    assert exited_after < grace + EXIT_MARGIN_S, f"exited {exited_after:.1f} s after SIGTERM (grace {grace} s)"
    print(f"exited {exited_after:.2f} s after SIGTERM with --grace {grace}")


def assert_refused_rest(response_or_error, shape):
    """A new REST request while stopping: connection refused/reset, or HTTP 503 in the protocol's shape."""
    if isinstance(response_or_error, requests.ConnectionError):
        return
    assert not isinstance(response_or_error, Exception), repr(response_or_error)
    assert response_or_error.status_code == 503, (response_or_error.status_code, response_or_error.text)
    assert response_or_error.headers["content-type"].startswith("application/json")
    shape(response_or_error.json())


def assert_unavailable_grpc(result):
    error = result["error"] if isinstance(result, dict) else result[-1]["error"]
    assert "(14, 'unavailable')" in error, error  # StatusCode.UNAVAILABLE


def test_sigterm_finishes_requests_in_flight_and_refuses_new_ones(tmp_path):
    grace = 4.0
    proc, grpc_addr, url, marker = start(tmp_path, grace)
    rest_port = int(url.rsplit(":", 1)[1])
    background = Background()
    sse_started, stream_started = threading.Event(), threading.Event()
    try:
        keep_alive = requests.Session()
        assert keep_alive.get(url + "/v1/models", timeout=10).status_code == 200
        grpc_client = Client(grpc_addr, "slow", "sleep")
        assert grpc_client.infer({"seconds": np.float32(0)})[0]["y"].item() == 0.0
        stages_before = stage_starts(marker)
        # in flight: a gRPC Predict in the slow stage, a classic REST call queued behind it, an OpenAI SSE stream,
        # a TGI unary generation and a gRPC token stream; all fit in the grace period
        background.start("grpc_predict", grpc_client.infer, {"seconds": np.float32(1.0)})
        wait_until(lambda: stage_starts(marker) > stages_before, 60, "the slow stage started")
        background.start("classic", requests.post, url + "/model/slow:sleep", None, {"instances": [{"seconds": 0.5}]})
        background.start(
            "tgi", requests.post, url + "/generate", None, {"inputs": PROMPT, "parameters": {"max_new_tokens": 100}}
        )
        background.start(
            "sse",
            open_sse,
            url,
            "/v1/completions",
            {"model": "llama_tiny", "prompt": PROMPT, "max_tokens": 100, "stream": True},
            sse_started,
        )
        background.start("grpc_stream", grpc_stream, grpc_addr, 100, stream_started)
        assert sse_started.wait(60) and stream_started.wait(60)
        # the keep-alive session's connection, the classic call's, the TGI call's and the stream's
        wait_until(lambda: rest_connections(proc, rest_port) >= 4, 30, "the REST requests accepted")

        sent, children = sigterm_and_time(proc)
        proc.wait_for(REFUSED_MARK, timeout=10)
        try:
            refused_rest = requests.post(url + "/model/slow:sleep", json={"instances": [{"seconds": 0.0}]}, timeout=10)
        except requests.ConnectionError as err:
            refused_rest = err
        try:
            refused_keep_alive = keep_alive.post(
                url + "/v1/completions", timeout=10, json={"model": "llama_tiny", "prompt": PROMPT, "max_tokens": 2}
            )
        except requests.ConnectionError as err:
            refused_keep_alive = err
        refused_grpc_open = grpc_client.infer({"seconds": np.float32(0)})
        refused_grpc_new = Client(grpc_addr, "slow", "sleep").infer({"seconds": np.float32(0)})

        assert_all_gone(proc, sent, children, grace)
        results = background.join(10)
    finally:
        proc.close()

    assert_refused_rest(refused_rest, lambda body: body["error_msg"])
    assert_refused_rest(refused_keep_alive, lambda body: body["error"]["type"] == "server_error")
    assert_unavailable_grpc(refused_grpc_open)
    assert_unavailable_grpc(refused_grpc_new)

    assert results["grpc_predict"][0]["y"].item() == 1.0, results["grpc_predict"]
    assert results["classic"].status_code == 200 and results["classic"].json() == {"instances": [{"y": 0.5}]}
    assert results["tgi"].status_code == 200, results["tgi"].text
    status, _, events = results["sse"]
    assert status == 200 and events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert results["grpc_stream"][-1].get("finished"), results["grpc_stream"][-1]
    assert "still running" not in proc.output()


def test_requests_past_the_grace_period_get_their_protocols_error(tmp_path):
    grace = 1.0
    # one engine step per scheduler call: 250 tokens take a few seconds, well past the grace period
    proc, grpc_addr, url, marker = start(tmp_path, grace, num_scheduler_steps=1, async_scheduling=False)
    background = Background()
    sse_started, stream_started = threading.Event(), threading.Event()
    try:
        background.start("classic", requests.post, url + "/model/slow:sleep", None, {"instances": [{"seconds": 30}]})
        background.start(
            "sse",
            open_sse,
            url,
            "/v1/completions",
            {"model": "llama_tiny", "prompt": PROMPT, "max_tokens": 250, "ignore_eos": True, "stream": True},
            sse_started,
        )
        background.start("grpc_stream", grpc_stream, grpc_addr, 250, stream_started)
        wait_until(lambda: stage_starts(marker) > 0, 60, "the slow stage started")
        assert sse_started.wait(60) and stream_started.wait(60)

        sent, children = sigterm_and_time(proc)
        assert_all_gone(proc, sent, children, grace)
        results = background.join(10)
    finally:
        proc.close()

    classic = results["classic"]
    # unavailable, retry elsewhere: 503 + Retry-After with MindSpore's JSON body
    assert classic.status_code == 503 and classic.headers["content-type"].startswith("application/json")
    assert classic.headers["retry-after"]
    assert "grace period of 1 s ended" in classic.json()["error_msg"]
    status, content_type, events = results["sse"]
    assert status == 200 and content_type.startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "server_error" and events[-2]["error"]["code"] == "service_unavailable"
    assert "grace period" in events[-2]["error"]["message"]
    assert_unavailable_grpc(results["grpc_stream"])
    log = proc.output()
    assert (
        "the grace period of 1 s ended with 3 request(s) still running, answered with an unavailable error: "
        "1 RESTful POST /model/slow:sleep, 1 RESTful POST /v1/completions, 1 gRPC PredictStream llama_tiny"
    ) in log
    assert "Internal Server Error" not in log
