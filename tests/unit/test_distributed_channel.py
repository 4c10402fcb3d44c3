"""The distributed worker's and rank agents' services (real gRPC here). With MS_SERVING_DISTRIBUTED_SECRET they
refuse calls without it with PERMISSION_DENIED, and channels made by `protocol.channel` send it; with
MS_SERVING_DISTRIBUTED_TLS_* (ipc.internal_tls) they speak mutual TLS and take only clients with a certificate of
the group's CA. Without either, a worker or rank agents listening beyond loopback log what is exposed."""

import os
from concurrent import futures

import grpc
import pytest
from certificates import make_host_certs
from serving_process import free_port

from mindspore_serving.agent.distributed import startup
from mindspore_serving.ipc import distributed as protocol
from mindspore_serving.ipc import internal_tls
from mindspore_serving.proto import distributed_pb2 as dpb
from mindspore_serving.proto import distributed_pb2_grpc as dpb_grpc
from mindspore_serving.server import SSLConfig
from mindspore_serving.worker.distributed import process

PORT = free_port()  # an address the warnings name (nothing listens)

PREFIX = internal_tls.DISTRIBUTED_PREFIX
CERT, KEY, CA = internal_tls.variable_names(PREFIX)


class _Worker(dpb_grpc.DistributedWorkerServicer):
    def __init__(self):
        self.notices = []
        self.tokens = []

    def AgentExit(self, request, context):
        self.notices.append(request.reason)
        self.tokens.append(request.notice_token)
        return dpb.Reply()


@pytest.fixture
def served(monkeypatch):
    def serve(secret):
        if secret is None:
            monkeypatch.delenv(protocol.SECRET_ENV, raising=False)
        else:
            monkeypatch.setenv(protocol.SECRET_ENV, secret)
        server = protocol.server(futures.ThreadPoolExecutor(max_workers=2))
        worker = _Worker()
        dpb_grpc.add_DistributedWorkerServicer_to_server(worker, server)
        port = protocol.listen(server, "127.0.0.1:0")  # with mutual TLS when the test set its variables
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", worker

    servers = []
    yield serve
    for server in servers:
        server.stop(0)


def _exit(channel, reason="rank 1 lost"):
    return dpb_grpc.DistributedWorkerStub(channel).AgentExit(
        dpb.AgentNotice(agent_ip="127.0.0.1", reason=reason), timeout=10
    )


def test_calls_without_the_secret_are_refused_and_change_nothing(served, monkeypatch):
    address, worker = served("shared-secret")
    for metadata in ((), ((protocol.SECRET_METADATA, "wrong"),)):
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                dpb_grpc.DistributedWorkerStub(channel).AgentExit(
                    dpb.AgentNotice(reason="forged"), timeout=10, metadata=metadata
                )
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert protocol.SECRET_ENV in refused.value.details()
    monkeypatch.setenv(protocol.SECRET_ENV, "another")
    with protocol.channel(address) as channel, pytest.raises(grpc.RpcError):
        _exit(channel, "forged")
    assert worker.notices == []
    monkeypatch.setenv(protocol.SECRET_ENV, "shared-secret")
    with protocol.channel(address) as channel:
        _exit(channel)
    assert worker.notices == ["rank 1 lost"]


def test_without_a_secret_the_services_are_open(served):
    address, worker = served(None)
    with protocol.channel(address) as channel:
        _exit(channel)
    assert worker.notices == ["rank 1 lost"]


def test_the_starter_keeps_its_ranks_notice_tokens_from_their_ready_lines_and_sends_one(served):
    address, worker = served(None)
    group = startup.AgentGroupProcesses(address, "127.0.0.1")
    pipes = [os.pipe(), os.pipe()]
    try:
        os.write(pipes[0][1], protocol.ready_line("a" * 64)[:10])  # a line may come in pieces
        os.write(pipes[1][1], protocol.ready_line("b" * 64))
        os.write(pipes[0][1], protocol.ready_line("a" * 64)[10:])
        startup._wait_ready(group, [pipes[0][0], pipes[1][0]], lambda: [])
    finally:
        for fd in (*pipes[0], *pipes[1]):
            os.close(fd)
    assert group.notice_tokens == {0: "a" * 64, 1: "b" * 64}
    group.notify_worker("rank 1 lost", failed=False)
    assert worker.notices == ["rank 1 lost"] and worker.tokens == ["a" * 64]
    assert protocol.read_ready_line(protocol.READY_LINE) == "" and protocol.read_ready_line(b"ready abc") is None
    assert protocol.read_ready_line(b"readyx\n") is None


@pytest.fixture
def logged(monkeypatch):
    lines = []
    for module in (process, startup):
        monkeypatch.setattr(module.log, "warning", lines.append)
    return lines


def test_listening_beyond_loopback_without_secret_or_tls_is_logged_with_what_is_open_and_the_fix(logged, monkeypatch):
    monkeypatch.delenv(protocol.SECRET_ENV, raising=False)
    for address in (
        f"127.0.0.1:{PORT}",
        f"127.0.0.2:{PORT}",
        f"localhost:{PORT}",
        f"[::1]:{PORT}",
        "unix:/tmp/worker.sock",
    ):
        assert protocol.exposure_warning(address, "it", "all") is None
    process.warn_if_exposed(f"127.0.0.1:{PORT}")
    startup._warn_if_exposed("127.0.0.1", 7000, 2)
    assert logged == []
    process.warn_if_exposed(f"0.0.0.0:{PORT}")
    startup._warn_if_exposed("10.0.0.2", 7000, 2)
    worker, agents = logged
    assert worker.startswith(
        f"the distributed worker on 0.0.0.0:{PORT} can be reached beyond this host, and neither "
        f"{protocol.SECRET_ENV} nor {CERT}/{KEY}/{CA} is set: any process that reaches it "
        "can read the rank table"
    )
    assert agents.startswith("the rank agents on 10.0.0.2:7000-7001 can be reached beyond this host")
    for text in (worker, agents):
        assert f"Set {protocol.SECRET_ENV} to the same random value on every host" in text
    for address in (f"[2001:db8::1]:{PORT}", f"serving-host:{PORT}"):
        assert protocol.exposure_warning(address, "it", "all") is not None
    monkeypatch.setenv(protocol.SECRET_ENV, "shared-secret")
    assert protocol.exposure_warning(f"0.0.0.0:{PORT}", "it", "all") is None


def test_tls_alone_also_silences_the_warning(certs, monkeypatch):
    monkeypatch.delenv(protocol.SECRET_ENV, raising=False)
    _use(monkeypatch, certs[0])
    assert protocol.exposure_warning(f"0.0.0.0:{PORT}", "it", "all") is None


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("certs"))
    return make_host_certs(directory, ["127.0.0.1"]), make_host_certs(directory, ["127.0.0.1"], ca="other")


def _use(monkeypatch, paths, ip="127.0.0.1"):
    monkeypatch.setenv(CERT, paths[ip][0])
    monkeypatch.setenv(KEY, paths[ip][1])
    monkeypatch.setenv(CA, paths["ca"])


@pytest.fixture
def tls_worker(certs, monkeypatch, served):
    _use(monkeypatch, certs[0])
    return served(None)


def test_a_host_with_the_group_s_certificate_gets_through(tls_worker):
    address, worker = tls_worker
    with protocol.channel(address) as channel:
        _exit(channel, "rank 1 lost")
    assert worker.notices == ["rank 1 lost"]


def test_plaintext_no_certificate_or_another_ca_is_refused(tls_worker, certs, monkeypatch):
    address, worker = tls_worker
    own = internal_tls.from_env(PREFIX)
    with open(certs[1]["127.0.0.1"][0], "rb") as cert, open(certs[1]["127.0.0.1"][1], "rb") as key:
        foreign = grpc.ssl_channel_credentials(own.ca, key.read(), cert.read())  # trusts the server, wrong CA
    callers = [
        grpc.insecure_channel(address),
        grpc.secure_channel(address, grpc.ssl_channel_credentials(own.ca)),  # no client certificate
        grpc.secure_channel(address, foreign),
    ]
    for channel in callers:
        with channel, pytest.raises(grpc.RpcError) as refused:
            _exit(channel, "forged")
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    _use(monkeypatch, certs[1])  # a peer of another CA does not trust this server either
    with protocol.channel(address) as channel, pytest.raises(grpc.RpcError):
        _exit(channel, "forged")
    assert worker.notices == []


def test_half_a_setting_or_an_unreadable_file_is_an_error(certs, tmp_path):
    paths = certs[0]
    assert internal_tls.from_env(PREFIX, {}) is None
    with pytest.raises(RuntimeError, match=f"{KEY}, {CA} not set"):
        internal_tls.from_env(PREFIX, {CERT: paths["127.0.0.1"][0]})
    with pytest.raises(RuntimeError, match=f"{CA}: cannot read"):
        internal_tls.from_env(
            PREFIX, {CERT: paths["127.0.0.1"][0], KEY: paths["127.0.0.1"][1], CA: str(tmp_path / "missing.crt")}
        )
    (tmp_path / "text.crt").write_text("not a certificate")
    with pytest.raises(RuntimeError, match="not a PEM file"):
        internal_tls.from_env(
            PREFIX, {CERT: paths["127.0.0.1"][0], KEY: paths["127.0.0.1"][1], CA: str(tmp_path / "text.crt")}
        )


def test_an_ssl_config_stands_for_the_variables_and_needs_the_group_s_ca(certs):
    cert, key = certs[0]["127.0.0.1"]
    env = internal_tls.ssl_config_env(PREFIX, SSLConfig(cert, key, custom_ca=certs[0]["ca"], verify_client=True))
    assert env == {CERT: cert, KEY: key, CA: certs[0]["ca"]}
    with pytest.raises(RuntimeError, match="needs custom_ca"):
        internal_tls.ssl_config_env(PREFIX, SSLConfig(cert, key))


def test_unix_sockets_stay_plaintext(certs, monkeypatch, tmp_path):
    _use(monkeypatch, certs[0])
    tls = internal_tls.from_env(PREFIX)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    address = f"unix:{tmp_path}/agent.sock"
    assert internal_tls.add_port(server, address, tls)
    server.start()
    try:
        with internal_tls.open_channel(address, [], tls) as channel:
            grpc.channel_ready_future(channel).result(timeout=5)
    finally:
        server.stop(0)
