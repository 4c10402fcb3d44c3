"""`--frontend_processes 2`: the master and one front-end process serve the same public ports (SO_REUSEPORT).
Against one real server (add, slow and the tiny LLM): every protocol is answered by both front ends, a front-end
process killed under load fails only its own connections, fast, and comes back, and SIGTERM drains both at once.
Which front end answered is read from `mindspore_serving_frontend_requests_total{frontend=...}`; every request
opens a connection of its own, so that the kernel spreads them over both listeners."""

import os
import shutil
import signal
import threading
import time

import grpc
import numpy as np
import psutil
import pytest
import requests
from certificates import make_certs
from llm_setup import write_config, write_servable
from serving_process import ROOT, SERVABLES, free_port, start_server, wait_until

from mindspore_serving.client import Client
from mindspore_serving.proto import grpc_predict_v2_pb2 as kserve_pb2
from mindspore_serving.proto import grpc_predict_v2_pb2_grpc as kserve_grpc

SLOW_SERVABLE = os.path.join(ROOT, "tests", "servables", "slow")
FRONTEND_MODULE = "mindspore_serving.frontend_process"
PROMPT = "And the king of"
ADD_BODY = {"instances": [{"x1": [[1.0, 2.0], [3.0, 4.0]], "x2": [[1.0, 1.0], [1.0, 1.0]]}]}
ADD_ANSWER = {"instances": [{"y": [[2.0, 3.0], [4.0, 5.0]]}]}
TRIES = 40  # requests per protocol until both front ends answered one: a miss has odds of 2 ** -39
GRACE = 4.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("frontend_processes")
    config = write_config(directory, start_port=0)
    servables = write_servable(directory, config)
    shutil.copytree(os.path.join(SERVABLES, "add"), os.path.join(servables, "add"))
    shutil.copytree(SLOW_SERVABLE, os.path.join(servables, "slow"))
    proc, grpc_addr, rest_addr = start_server(
        directory,
        servables=("add", "slow", "llama_tiny"),
        extra_args=["--servable_directory", servables, "--frontend_processes", "2", "--grace", str(GRACE)],
    )
    try:
        yield proc, grpc_addr, f"http://{rest_addr}"
    finally:
        proc.close()


def frontend_pids(proc):
    return [
        p.pid
        for p in psutil.Process(proc.proc.pid).children(recursive=True)
        if FRONTEND_MODULE in " ".join(p.cmdline())
    ]


def answered(url, **tls):
    """Requests ended so far per front end (0: the master, 1: the front-end process)."""
    counts = {}
    for line in requests.get(url + "/metrics", timeout=10, **tls).text.splitlines():
        if line.startswith("mindspore_serving_frontend_requests_total{"):
            counts[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return counts


def reaches_both(url, call, **tls):
    """Repeats `call()` (a request on a new connection, checking its own answer) until both front ends answered
    one of them."""
    before, seen = answered(url, **tls), set()
    for _ in range(TRIES):
        call()
        now = answered(url, **tls)
        seen |= {name for name, count in now.items() if count > before.get(name, 0)}
        before = now
        if seen >= {"0", "1"}:
            return
    raise AssertionError(f"only front ends {sorted(seen)} answered {TRIES} requests")


def rest_add(url):
    reply = requests.post(url + "/model/add:add_common", json=ADD_BODY, timeout=30)
    assert reply.json() == ADD_ANSWER


def grpc_add(grpc_addr):
    result = Client(grpc_addr, "add", "add_common").infer(
        [{"x1": np.ones((2, 2), np.float32), "x2": np.ones((2, 2), np.float32)}]
    )
    assert result[0]["y"].tolist() == [[2.0, 2.0], [2.0, 2.0]], result


def kserve_rest_add(url):
    data = [1.0, 2.0, 3.0, 4.0]
    body = {"inputs": [{"name": name, "shape": [2, 2], "datatype": "FP32", "data": data} for name in ("x1", "x2")]}
    reply = requests.post(url + "/v2/models/add.add_common/infer", json=body, timeout=30)
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0], reply.text


def kserve_grpc_add(grpc_addr):
    request = kserve_pb2.ModelInferRequest(model_name="add.add_common")
    for name in ("x1", "x2"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[2, 2])
        tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    with grpc.insecure_channel(grpc_addr) as channel:
        reply = kserve_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [2.0, 4.0, 6.0, 8.0]


def openai_completion(url):
    reply = requests.post(
        url + "/v1/completions",
        timeout=60,
        json={"model": "llama_tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0},
    )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3, reply.text


def grpc_token_stream(grpc_addr):
    replies = list(
        Client(grpc_addr, "llama_tiny", "generate").infer_stream(
            {"prompt": PROMPT, "max_new_tokens": np.int32(3), "ignore_eos": np.bool_(True)}
        )
    )
    assert replies[-1].get("finished"), replies[-1]


def test_every_protocol_through_every_front_end(server):
    proc, grpc_addr, url = server
    assert len(frontend_pids(proc)) == 1
    reaches_both(url, lambda: rest_add(url))
    reaches_both(url, lambda: grpc_add(grpc_addr))
    reaches_both(url, lambda: kserve_rest_add(url))
    reaches_both(url, lambda: kserve_grpc_add(grpc_addr))
    reaches_both(url, lambda: openai_completion(url))
    reaches_both(url, lambda: grpc_token_stream(grpc_addr))
    for _ in range(8):  # the probes, wherever they land
        assert requests.get(url + "/ready", timeout=10).json()["ready"] is True


def test_front_end_killed_under_load_fails_fast_and_comes_back(server):
    proc, grpc_addr, url = server
    (victim,) = frontend_pids(proc)
    outcomes, stop = [], threading.Event()

    def load(call):
        while not stop.is_set():
            started = time.monotonic()
            try:
                call()
                outcomes.append((started, time.monotonic(), None))
            except Exception as err:  # a connection the killed process held
                outcomes.append((started, time.monotonic(), err))

    threads = [
        threading.Thread(target=load, args=(call,), daemon=True)
        for call in (lambda: rest_add(url), lambda: grpc_add(grpc_addr))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(outcomes) > 30, 30, "load running")
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        proc.wait_for("serves again", timeout=30)
        wait_until(lambda: frontend_pids(proc) and frontend_pids(proc)[0] != victim, 10, "a new front-end process")
        recovered = time.monotonic()
        wait_until(lambda: len([o for o in outcomes if o[0] > recovered]) > 30, 30, "load after the restart")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    failed = [o for o in outcomes if o[2] is not None]
    assert all(end - start < 2.0 for start, end, _ in failed), failed  # nothing hangs on the dead process
    assert all(o[2] is None for o in outcomes if o[0] > recovered), failed  # the others served throughout
    assert [o for o in outcomes if killed_at < o[0] < recovered and o[2] is None]
    reaches_both(url, lambda: rest_add(url))  # the new process serves
    assert "front-end process 1 (pid" in proc.output() and "died unexpectedly" in proc.output()


def test_sigterm_drains_every_front_end(server):
    """Last: it stops the server. Token streams in flight on both front ends finish within the grace period,
    new requests are refused, and every process is gone in time."""
    proc, grpc_addr, url = server
    rest_port = int(url.rsplit(":", 1)[1])
    pids = [proc.proc.pid] + frontend_pids(proc)
    results, threads = [], []

    def stream():
        with requests.post(
            url + "/v1/completions",
            stream=True,
            timeout=60,
            json={"model": "llama_tiny", "prompt": PROMPT, "max_tokens": 60, "ignore_eos": True, "stream": True},
        ) as response:
            results.append([line for line in response.iter_lines(decode_unicode=True) if line.startswith("data:")])

    def connections(pid):
        return sum(
            1
            for conn in psutil.Process(pid).net_connections("tcp")
            if conn.laddr and conn.laddr.port == rest_port and conn.status == psutil.CONN_ESTABLISHED
        )

    for _ in range(12):  # until both processes hold one
        thread = threading.Thread(target=stream, daemon=True)
        thread.start()
        threads.append(thread)
        wait_until(lambda: sum(connections(pid) for pid in pids) >= len(threads), 30, "the stream accepted")
        if all(connections(pid) for pid in pids):
            break
    assert all(connections(pid) for pid in pids)
    children = psutil.Process(proc.proc.pid).children(recursive=True)
    sent = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    proc.wait_for("refuse new requests", timeout=10)
    refused = []
    for _ in range(6):
        try:
            refused.append(requests.post(url + "/model/add:add_common", json=ADD_BODY, timeout=10).status_code)
        except requests.ConnectionError:
            refused.append("closed")
    assert proc.wait_exit(GRACE + 10) == 0
    exited_after = time.monotonic() - sent
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for thread in threads:
        thread.join(10)
    assert exited_after < GRACE + 5, exited_after
    assert set(refused) <= {503, "closed"}, refused
    assert len(results) == len(threads) and all(events[-1] == "data: [DONE]" for events in results), results


def test_tls_with_client_verification_through_every_front_end(tmp_path, monkeypatch):
    """The server API in this process with two front ends: the front-end process opens the same TLS servers (its
    certificate, key and client CA), and a client without a certificate is refused by both."""
    from mindspore_serving import server  # pylint: disable=import-outside-toplevel
    from mindspore_serving.client import SSLConfig as ClientSSLConfig  # pylint: disable=import-outside-toplevel

    monkeypatch.chdir(tmp_path)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    certs = make_certs(str(tmp_path))
    ssl_config = server.SSLConfig(
        certificate=certs["server.crt"], private_key=certs["server.key"], custom_ca=certs["ca.crt"], verify_client=True
    )
    client_ssl = ClientSSLConfig(
        certificate=certs["client.crt"], private_key=certs["client.key"], custom_ca=certs["ca.crt"]
    )
    grpc_addr, rest_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    url, tls = f"https://{rest_addr}", dict(verify=certs["ca.crt"], cert=(certs["client.crt"], certs["client.key"]))

    def rest_call():
        assert requests.post(url + "/model/add:add_common", json=ADD_BODY, timeout=30, **tls).json() == ADD_ANSWER

    def grpc_call():
        result = Client(grpc_addr, "add", "add_common", ssl_config=client_ssl).infer(
            {"x1": np.ones((2, 2), np.float32), "x2": np.ones((2, 2), np.float32)}
        )
        assert result[0]["y"].tolist() == [[2.0, 2.0], [2.0, 2.0]], result

    try:
        server.master.context.set_frontend_processes(2)
        server.start_servables(server.ServableStartConfig(SERVABLES, "add", device_ids=0))
        server.start_grpc_server(grpc_addr, ssl_config=ssl_config)
        server.start_restful_server(rest_addr, ssl_config=ssl_config)
        reaches_both(url, rest_call, **tls)
        reaches_both(url, grpc_call, **tls)
        no_cert = ClientSSLConfig(custom_ca=certs["ca.crt"])
        for _ in range(8):  # wherever the connection lands
            assert (
                "Grpc Error"
                in Client(grpc_addr, "add", "add_common", ssl_config=no_cert).infer(
                    {"x1": np.ones((2, 2), np.float32), "x2": np.ones((2, 2), np.float32)}
                )["error"]
            )
            with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
                requests.post(url + "/model/add:add_common", verify=certs["ca.crt"], json=ADD_BODY, timeout=10)
    finally:
        server.stop()
        server.master.context.set_frontend_processes(1)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
