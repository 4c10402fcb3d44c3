"""Readiness on real servers: /ready, the KServe v2 probes and grpc.health.v1 go false while the servables start,
while a killed worker restarts, while a killed LLM agent's group restarts and during a SIGTERM drain, and true
again after each; /health (live) answers throughout."""

import os
import shutil
import signal
import threading

import grpc
import numpy as np
import psutil
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llm_setup import write_config, write_servable
from serving_process import ROOT, SERVABLES, ServingProcess, free_port, wait_until

from mindspore_serving.client import Client

SLOW_SERVABLE = os.path.join(ROOT, "tests", "servables", "slow")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# front ends first, then the servables: the probes answer while the workers start
FRONTENDS_FIRST = """import sys
from mindspore_serving import server
server.start_grpc_server(sys.argv[1])
server.start_restful_server(sys.argv[2])
server.start_servables([server.ServableStartConfig(servable_directory=sys.argv[3], servable_name="add")])
"""


class Probes:
    """The server's probes, and every distinct answer seen while polling them (in order)."""

    def __init__(self, grpc_addr, rest_addr):
        self.url = f"http://{rest_addr}"
        self.channel = grpc.insecure_channel(grpc_addr)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.seen = []

    def grpc_status(self, service=""):
        return self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

    def poll(self, servable):
        """(live, ready, servable state, gRPC overall, gRPC servable); None for what does not answer."""
        try:
            live = requests.get(self.url + "/health", timeout=5).status_code == 200
            reply = requests.get(self.url + "/ready", timeout=5)
            body = reply.json()
            assert (reply.status_code == 200) == body["ready"] and body["live"]
            servable_state = body["servables"].get(servable, {}).get("state", body["phase"])
            answer = (live, body["ready"], servable_state, self.grpc_status(), self.grpc_status(servable))
        except (requests.ConnectionError, grpc.RpcError) as err:
            answer = repr(err)[:200]
        if not self.seen or self.seen[-1] != answer:
            self.seen.append(answer)
        return answer

    def wait(self, servable, expected, timeout, what):
        try:
            wait_until(lambda: self.poll(servable) == expected, timeout, what)
        except AssertionError as err:
            raise AssertionError(f"{err}; answers seen: {self.seen}") from None

    def wait_ready(self, servable, timeout):
        self.wait(servable, (True, True, "ready", SERVING, SERVING), timeout, "ready")

    def close(self):
        self.channel.close()


def workers_of(proc, module):
    return [p for p in psutil.Process(proc.proc.pid).children(recursive=True) if module in " ".join(p.cmdline())]


def test_ready_only_after_start_up_and_again_after_a_killed_worker_restarted(tmp_path):
    script = tmp_path / "frontends_first.py"
    script.write_text(FRONTENDS_FIRST)
    grpc_addr, rest_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = ServingProcess(
        [str(script), grpc_addr, rest_addr, SERVABLES],
        str(tmp_path),
        env={"PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))},
    )
    probes = None
    try:
        proc.wait_for("RESTful server start success")
        probes = Probes(grpc_addr, rest_addr)
        probes.wait_ready("add", 180)
        # the first answers came while the worker started: live, not ready (phase "starting"), NOT_SERVING
        assert probes.seen[0] == (True, False, "starting", NOT_SERVING, NOT_SERVING), probes.seen
        assert requests.get(probes.url + "/v2/health/ready", timeout=5).status_code == 200
        assert requests.get(probes.url + "/v2/models/add/ready", timeout=5).status_code == 200
        assert requests.get(probes.url + "/v2/models/nope/ready", timeout=5).status_code == 404

        # without device_ids the servable's worker is an extra worker that loads the models on CPU
        (worker,) = workers_of(proc, "mindspore_serving.worker.start_extra_worker")
        probes.seen.clear()
        worker.kill()
        wait_until(lambda: probes.poll("add")[1] is False, 30, "not ready after the kill")
        assert probes.seen[-1] == (True, False, "restarting", NOT_SERVING, NOT_SERVING), probes.seen
        reply = requests.get(probes.url + "/v2/models/add/ready", timeout=5)
        assert reply.status_code in (200, 400) and (reply.status_code == 200 or "add" in reply.json()["error"])
        probes.wait_ready("add", 120)
        assert all(answer is not None and answer[0] for answer in probes.seen), probes.seen  # live throughout
    finally:
        if probes is not None:
            probes.close()
        proc.close()


def test_not_ready_while_llm_agents_restart_and_during_a_sigterm_drain(tmp_path):
    config = write_config(tmp_path, start_port=0)
    servables = write_servable(tmp_path, config)
    shutil.copytree(SLOW_SERVABLE, os.path.join(servables, "slow"))
    grpc_addr, rest_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    grace = 6.0
    marker = tmp_path / "stage_started"
    proc = ServingProcess(
        [
            os.path.join(ROOT, "serving_server.py"),
            "--grpc",
            grpc_addr,
            "--rest",
            rest_addr,
            "--servables",
            "slow,llama_tiny",
            "--servable_directory",
            servables,
            "--grace",
            str(grace),
        ],
        str(tmp_path),
        env={"SLOW_STAGE_STARTED": str(marker)},
    )
    probes = None
    try:
        proc.wait_for("RESTful server start success")
        probes = Probes(grpc_addr, rest_addr)
        probes.wait_ready("llama_tiny", 30)

        (agent,) = workers_of(proc, "mindspore_serving.agent.start_agent")
        probes.seen.clear()
        agent.send_signal(signal.SIGKILL)
        wait_until(lambda: probes.poll("llama_tiny")[1] is False, 30, "not ready while the agents restart")
        assert probes.seen[-1] == (True, False, "not ready", NOT_SERVING, NOT_SERVING), probes.seen
        body = requests.get(probes.url + "/ready", timeout=5).json()
        if not body["ready"]:
            assert "restarting" in body["reason"], body
        assert probes.grpc_status("slow") == SERVING  # the other servable is not affected
        probes.wait_ready("llama_tiny", 120)

        # a request in flight keeps the drain open; meanwhile live, not ready, NOT_SERVING; other calls refused
        results = {}
        slow = threading.Thread(
            target=lambda: results.update(
                slow=Client(grpc_addr, "slow", "sleep").infer({"seconds": np.float32(grace - 2)})
            )
        )
        slow.start()
        wait_until(marker.exists, 30, "the slow request running")
        proc.proc.send_signal(signal.SIGTERM)
        proc.wait_for("refuse new requests", timeout=10)
        probes.seen.clear()
        draining = (True, False, "stopping", NOT_SERVING, NOT_SERVING)
        probes.wait("llama_tiny", draining, 5, "live but not ready while draining")
        assert probes.seen == [draining], probes.seen
        assert requests.get(probes.url + "/v2/health/live", timeout=5).status_code == 200
        assert requests.get(probes.url + "/v2/health/ready", timeout=5).status_code == 400
        assert (
            requests.post(
                probes.url + "/model/slow:sleep", json={"instances": [{"seconds": 0.0}]}, timeout=5
            ).status_code
            == 503
        )
        slow.join(grace + 10)
        assert proc.wait_exit(grace + 10) == 0
        assert results["slow"][0]["y"].item() == grace - 2
    finally:
        if probes is not None:
            probes.close()
        proc.close()
