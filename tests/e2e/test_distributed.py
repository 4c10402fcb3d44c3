"""server.distributed end to end: a distributed worker, rank agents forming a MindSpore cluster, real MindIR
graphs ending in an AllReduce, gRPC and REST clients."""

import json
import os
import socket
import ssl
import subprocess
import sys

import numpy as np
import pytest
from serving_process import ROOT, SERVABLES, ServingProcess, free_port

MATMUL = os.path.join(SERVABLES, "matmul_distributed")
MODEL_DIR = os.path.join(MATMUL, "model")
PIPELINE_SERVABLES = os.path.join(ROOT, "tests", "servables")
ENV = {"PYTHONPATH": ROOT, "GLOG_v": "2"}

SERVER_SCRIPT = """
import sys
from mindspore_serving import server
from mindspore_serving.server import distributed
directory, name, rank_table, dist, grpc_addr = sys.argv[1:6]
distributed.start_servable(directory, name, rank_table_json_file=rank_table, distributed_address=dist)
server.start_grpc_server(grpc_addr)
"""

AGENT_SCRIPT = """
import sys
from mindspore_serving.server import distributed
dist, port, files = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
agent_ip = sys.argv[4] if len(sys.argv) > 4 else None
rank_start = int(sys.argv[5]) if len(sys.argv) > 5 else None
distributed.startup_agents(dist, files, agent_start_port=port, agent_ip=agent_ip, rank_start=rank_start)
"""


@pytest.fixture(scope="module", autouse=True)
def exported():
    if not all(os.path.isfile(os.path.join(MODEL_DIR, f"pipeline/stage{s}.mindir")) for s in (0, 1)):
        subprocess.run(
            [sys.executable, os.path.join(MATMUL, "export_model.py")],
            check=True,
            timeout=300,
            env=dict(os.environ, **ENV),
        )
    return np.load(os.path.join(MODEL_DIR, "weight.npy"))


def _rank_table(path, hosts):
    servers = {}
    for rank, host in enumerate(hosts):
        servers.setdefault(host, []).append({"device_id": str(rank), "device_ip": "0.0.0.0", "rank_id": str(rank)})
    path.write_text(json.dumps({"server_list": [{"server_id": h, "device": d} for h, d in servers.items()]}))
    return str(path)


class Deployment:
    """A server running one distributed servable and the agent scripts of its ranks."""

    def __init__(
        self,
        tmp_path,
        servable_directory,
        servable,
        model_files,
        hosts=("127.0.0.1", "127.0.0.1"),
        agent_hosts=None,
        rest=False,
        env=None,
        host_envs=None,
    ):
        """`host_envs`: each agent host's own additions to `env` (the server runs on the first host)."""
        self.env = dict(ENV, **(env or {}))
        host_envs = host_envs or [{}] * len(agent_hosts or [None])
        self.grpc = f"127.0.0.1:{free_port()}"
        self.dist = dist = f"127.0.0.1:{free_port()}"
        table = _rank_table(tmp_path / "rank_table.json", hosts)
        script = SERVER_SCRIPT + ("server.start_restful_server(sys.argv[6])\n" if rest else "")
        self.rest = f"127.0.0.1:{free_port()}" if rest else ""
        (tmp_path / "server.py").write_text(script)
        (tmp_path / "agent.py").write_text(AGENT_SCRIPT)
        self.procs = []
        server_dir, agent_dir = tmp_path / "server", tmp_path / "agents"
        server_dir.mkdir()
        self.server = self._start(
            [str(tmp_path / "server.py"), servable_directory, servable, table, dist, self.grpc, self.rest],
            server_dir,
            host_envs[0],
        )
        try:
            for index, (files, extra) in enumerate(agent_hosts or [(model_files, [])]):
                cwd = agent_dir / str(index)
                cwd.mkdir(parents=True)
                self._start(
                    [str(tmp_path / "agent.py"), dist, str(free_port()), ",".join(files), *extra], cwd, host_envs[index]
                )
            for agent in self.procs[1:]:
                agent.wait_for("Success to start agents", timeout=240)
            self.server.wait_for("gRPC server start success", timeout=240)
        except BaseException:
            self.close()
            raise

    def _start(self, args, cwd, host_env):
        proc = ServingProcess(args, str(cwd), dict(self.env, **host_env))
        self.procs.append(proc)
        return proc

    def close(self):
        for proc in self.procs:
            proc.close()


def _predict(grpc_addr, servable, x):
    from mindspore_serving.client import Client

    return Client(grpc_addr, servable, "predict").infer([{"x": x}])


def _refused_exit_notice(address):
    import grpc

    from mindspore_serving.proto import distributed_pb2 as dpb
    from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc

    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
        dpb_grpc.DistributedWorkerStub(channel).AgentExit(
            dpb.AgentNotice(agent_ip="127.0.0.1", reason="forged"), timeout=30
        )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED


def _files(*names):
    return [os.path.join(MODEL_DIR, name) for name in names]


def test_matmul_distributed_grpc_and_rest_equal_numpy(tmp_path, exported):
    deployment = Deployment(
        tmp_path, SERVABLES, "matmul_distributed", _files("device0/matmul.mindir", "device1/matmul.mindir"), rest=True
    )
    try:
        output = deployment.procs[1].output()
        assert "Child 0: Receive success" in output and "Child 1: Receive success" in output
        client = subprocess.run(
            [
                sys.executable,
                os.path.join(MATMUL, "serving_client.py"),
                "--grpc",
                deployment.grpc,
                "--rest",
                deployment.rest,
            ],
            cwd=str(tmp_path),
            timeout=120,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, **ENV),
        )
        text = client.stdout.decode(errors="replace")
        assert client.returncode == 0 and "MISMATCH" not in text, text
        x = np.random.default_rng(5).random((4, 8), dtype=np.float32)
        for _ in range(3):
            result = _predict(deployment.grpc, "matmul_distributed", x)
            np.testing.assert_allclose(result[0]["y"], x @ exported, rtol=1e-5, atol=1e-5)
        # a wrong input shape is refused by the worker before it reaches the ranks
        bad = _predict(deployment.grpc, "matmul_distributed", np.ones((2, 8), np.float32))
        assert "error" in (bad if isinstance(bad, dict) else bad[0])
        # without the secret, an exit notice without a registered rank's notice token is refused all the same
        _refused_exit_notice(deployment.dist)
        np.testing.assert_allclose(
            _predict(deployment.grpc, "matmul_distributed", x)[0]["y"], x @ exported, rtol=1e-5, atol=1e-5
        )
        # losing a rank stops the agent group, whose notice (with a rank's token) stops the worker; the master
        # exits with it
        deployment.procs[1].remember_children()
        rank = next(p for p in deployment.procs[1].descendants if "start_rank_agent" in " ".join(p.cmdline()))
        rank.kill()
        assert deployment.server.wait_exit(60) is not None
    finally:
        deployment.close()


def test_two_stage_pipeline_equals_one_stage_result_and_refuses_a_forged_rank(tmp_path, exported):
    """With MS_SERVING_DISTRIBUTED_SECRET on both sides, a caller without it (a fake rank) is refused: it cannot
    register, nor stop the group with a forged AgentExit."""
    import grpc

    from mindspore_serving.ipc import distributed as protocol
    from mindspore_serving.proto import distributed_pb2 as dpb
    from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc

    deployment = Deployment(
        tmp_path,
        PIPELINE_SERVABLES,
        "matmul_pipeline",
        _files("pipeline/stage0.mindir", "pipeline/stage1.mindir"),
        env={protocol.SECRET_ENV: "shared-between-hosts"},
    )
    try:
        x = np.random.default_rng(6).random((4, 8), dtype=np.float32)
        result = _predict(deployment.grpc, "matmul_pipeline", x)
        np.testing.assert_allclose(result[0]["y"], x @ exported, rtol=1e-5, atol=1e-5)
        with grpc.insecure_channel(deployment.dist) as channel:
            stub = dpb_grpc.DistributedWorkerStub(channel)
            for call, request in (
                (stub.AgentExit, dpb.AgentNotice(agent_ip="127.0.0.1", reason="forged")),
                (stub.RegisterAgent, dpb.RegisterAgentRequest(rank_id=0, address="127.0.0.1:1")),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    call(request, timeout=30)
                assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        result = _predict(deployment.grpc, "matmul_pipeline", x)
        np.testing.assert_allclose(result[0]["y"], x @ exported, rtol=1e-5, atol=1e-5)
    finally:
        deployment.close()


def test_second_host_joins_with_agent_ip_and_rank_start_over_mutual_tls(tmp_path, exported):
    """Each host has its own certificate (its IP as subjectAltName) of one CA: the worker and the agents speak
    mutual TLS, and a caller without such a certificate cannot reach the worker's service. MindSpore's cluster
    channel runs over its own TLS (MS_SERVING_CLUSTER_SSL_CONFIG): its scheduler answers a TLS handshake."""
    import grpc
    import psutil
    from certificates import make_cluster_ssl, make_host_certs

    from mindspore_serving.ipc import internal_tls
    from mindspore_serving.proto import distributed_pb2 as dpb
    from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc

    hosts = ("127.0.0.1", "127.0.0.2")
    certs = make_host_certs(str(tmp_path), hosts)
    cluster_ssl = make_cluster_ssl(str(tmp_path), hosts)
    host_envs = [
        dict(
            zip(internal_tls.variable_names(internal_tls.DISTRIBUTED_PREFIX), (*certs[ip], certs["ca"])), **cluster_ssl
        )
        for ip in hosts
    ]
    agent_hosts = [
        (_files("device0/matmul.mindir"), ["127.0.0.1", "0"]),
        (_files("device1/matmul.mindir"), ["127.0.0.2", "1"]),
    ]
    deployment = Deployment(
        tmp_path, SERVABLES, "matmul_distributed", None, hosts=hosts, agent_hosts=agent_hosts, host_envs=host_envs
    )
    try:
        x = np.random.default_rng(7).random((4, 8), dtype=np.float32)
        result = _predict(deployment.grpc, "matmul_distributed", x)
        np.testing.assert_allclose(result[0]["y"], x @ exported, rtol=1e-5, atol=1e-5)
        with grpc.insecure_channel(deployment.dist) as channel, pytest.raises(grpc.RpcError) as refused:
            dpb_grpc.DistributedWorkerStub(channel).AgentExit(dpb.AgentNotice(reason="forged"), timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        scheduler = next(
            p
            for p in psutil.Process(deployment.procs[1].proc.pid).children(recursive=True)
            if "mindspore_serving.common.ms_cluster" in " ".join(p.cmdline())
        )
        port = next(c.laddr.port for c in scheduler.net_connections(kind="tcp") if c.status == "LISTEN")
        with open(tmp_path / "cluster_server.pem") as pem:
            assert _tls_certificate("127.0.0.1", port) == ssl.PEM_cert_to_DER_cert(pem.read())
        result = _predict(deployment.grpc, "matmul_distributed", x)
        np.testing.assert_allclose(result[0]["y"], x @ exported, rtol=1e-5, atol=1e-5)
    finally:
        deployment.close()


def _tls_certificate(host, port):
    """The certificate (DER) a TLS server at host:port presents: unverified, only whether it speaks TLS and as
    whom."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True)
