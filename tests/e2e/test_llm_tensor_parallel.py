"""The tiny LLaMA split over two tensor-parallel agents that form a MindSpore cluster (config/llama_tiny_tp2.yaml).

Its logits equal the single-rank model's, its greedy outputs under continuous batching with n-gram speculative
decoding (verified in the ranks' step graphs) equal each request alone on one rank without it, and the group
survives the loss of a rank: here rank 1 plays a second host (bound to 127.0.0.2, started by start_agent.py
--rank_start 1, speaking mutual TLS with the worker, and MindSpore's cluster channel over its own TLS), is killed
mid-stream, and both hosts start their ranks again.
"""

import collections
import socket
import threading
import time

import grpc
import numpy as np
import psutil
import pytest
import requests
import yaml
from certificates import make_cluster_ssl, make_host_certs
from llm_setup import TP2_CONFIG, bundled_config, offline_greedy, write_config, write_servable
from prometheus_client.parser import text_string_to_metric_families
from serving_process import ROOT, ServingProcess, assert_sigterm_stops_all, free_port, start_server, wait_recovered

from mindspore_serving.client import Client
from mindspore_serving.common.cluster_registration import MAX_RESTARTS
from mindspore_serving.ipc import internal_tls
from mindspore_serving.proto import agent_pb2, agent_pb2_grpc

PROMPT = "And God said"
ATOL = 1e-4
SECOND_HOST = "127.0.0.2"


@pytest.fixture(scope="module")
def tp1_config(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("tp1"), start_port=0)


def tp2_config(directory, **agents):
    return write_config(
        directory,
        start_port=agents.pop("start_port", 0),
        agents=agents,
        data=bundled_config(TP2_CONFIG),
        name="tp2.yaml",
    )


def tokens(seed, n):
    return np.random.default_rng(seed).integers(3, 2000, n).tolist()


def test_tensor_parallel_logits_equal_the_single_rank_model_and_sigterm_stops_the_group(tmp_path, tp1_config):
    """The group as start_agent.py starts it (the cluster scheduler and every rank; a worker starts its own group
    the same way, see tp2_server): its logits equal the single rank's, and SIGTERM stops every process of it."""
    # lazy: MindSpore loads in the test process only for the tests that run a model in it
    from mindspore_serving.agent.graph_runner import GraphRunner
    from mindspore_serving.llm.model_io import SeqStep
    from mindspore_serving.spec.llm_config import load_serving_config
    from mindspore_serving.worker.llm.agent_client import AgentRunner
    from mindspore_serving.worker.llm.agents import agent_addresses

    path = tp2_config(tmp_path, start_port=free_port(), scheduler_address=f"127.0.0.1:{free_port()}")
    config = load_serving_config(path)
    proc = ServingProcess(
        [f"{ROOT}/start_agent.py", "--config", path], str(tmp_path), env={"MS_SERVING_AGENT_SECRET": "tp-test"}
    )
    runner = None
    try:
        reference = GraphRunner(
            load_serving_config(tp1_config).model.graphs[0], num_blocks=config.engine.num_blocks, warmup=False
        )
        proc.wait_for("all agents started", timeout=120)
        children = psutil.Process(proc.proc.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in children]
        assert sum("mindspore_serving.agent.start_agent" in c for c in commands) == 2
        assert sum("mindspore_serving.common.ms_cluster" in c for c in commands) == 1
        runner = AgentRunner(agent_addresses(config), secret="tp-test")
        a, b, c = tokens(0, 20), tokens(1, 150), tokens(2, 70)
        steps = [
            [SeqStep(a, 0, [1, 2])],  # prefill
            [SeqStep(b, 0, list(range(3, 13)))],  # a long prompt
            [SeqStep([a[-1]], 20, [1, 2]), SeqStep([b[-1]], 150, list(range(3, 13)))],  # decode
            [SeqStep(c[:40], 0, [13, 14, 15, 16, 17])],  # chunked prefill: a first chunk ...
            [SeqStep([a[0]], 21, [1, 2]), SeqStep(c[40:], 40, [13, 14, 15, 16, 17])],  # ... the rest beside a decode
        ]
        for i, seqs in enumerate(steps):
            np.testing.assert_allclose(runner.run(seqs), reference.run(seqs), rtol=0, atol=ATOL, err_msg=f"step {i}")
        # every position's logits, in chunks
        scored = [SeqStep(tokens(3, 150), 0, list(range(18, 28)), all_logits=True)]
        got, want = runner.run(scored), reference.run(scored)
        np.testing.assert_allclose(got.every[0], want.every[0], rtol=0, atol=ATOL)
        np.testing.assert_allclose(got.last, want.last, rtol=0, atol=ATOL)
        assert runner.score_refusal() is None
        greedy = [SeqStep([a[1]], 22, [1, 2]), SeqStep([c[0]], 70, [13, 14, 15, 16, 17])]
        got_tokens, got_logprobs = runner.run_greedy(greedy, 4)  # multi-step rounds run in the agents
        want_tokens, want_logprobs = reference.run_greedy(greedy, 4)
        assert got_tokens.tolist() == want_tokens.tolist()
        np.testing.assert_allclose(got_logprobs, want_logprobs, rtol=0, atol=ATOL)
        assert_sigterm_stops_all(proc, children)
    finally:
        if runner is not None:
            runner.close()
        proc.close()


@pytest.fixture(scope="module")
def tp2_server(tmp_path_factory):
    """The TP=2 servable with n-gram speculative decoding on in every step."""
    directory = tmp_path_factory.mktemp("tp2")
    config = tp2_config(directory)
    with open(config, encoding="utf-8") as stream:
        data = yaml.safe_load(stream)
    data["engine"]["speculative"] = {"num_speculative_tokens": 4, "prompt_lookup_max": 3}
    with open(config, "w", encoding="utf-8") as stream:
        yaml.safe_dump(data, stream)
    servables = write_servable(directory, config, name="llama_tiny_tp2")
    proc, grpc_addr, rest_addr = start_server(
        directory, servables=("llama_tiny_tp2",), extra_args=["--servable_directory", servables]
    )
    try:
        yield grpc_addr, rest_addr
    finally:
        proc.close()


def test_concurrent_greedy_requests_on_two_ranks_equal_each_alone_on_one(tp2_server, tp1_config):
    """With speculation on the two ranks (their layer graphs all-reduce), the greedy tokens are those of each
    request alone on one rank without it; the acceptance is scraped under vLLM's metric names."""
    before = _spec_metrics(tp2_server[1])
    client = Client(tp2_server[0], "llama_tiny_tp2", "generate")
    words = ["light", "waters", "firmament", "earth", "seed", "night", "day", "heaven"]
    requests = [(f"{PROMPT} {words[i % 8]}" + " and the" * (i % 3), 4 + (7 * i) % 29) for i in range(16)]
    futures = [
        client.infer_async({"prompt": prompt, "max_new_tokens": np.int32(n), "temperature": np.float32(0.0)})
        for prompt, n in requests
    ]
    for (prompt, n), future in zip(requests, futures):
        got = future.result()[0]
        expected = offline_greedy(tp1_config, prompt, n)
        assert got["token_ids"].tolist() == expected.token_ids, prompt
        assert got["finish_reason"] == expected.finish_reason.value
    after = _spec_metrics(tp2_server[1])
    drafts, proposed, accepted = (after[name] - before[name] for name in ("drafts", "draft_tokens", "accepted_tokens"))
    assert drafts > 0 and 0 < accepted <= proposed <= 4 * drafts
    per_position = [after[("per_pos", str(j))] - before[("per_pos", str(j))] for j in range(4)]
    assert sum(per_position) == accepted and per_position == sorted(per_position, reverse=True)


def _spec_metrics(rest_addr: str) -> dict:
    """The speculative decoding counters of the served model, from /metrics."""
    reply = requests.get(f"http://{rest_addr}/metrics", timeout=10)
    assert reply.status_code == 200
    found = collections.Counter()
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            if sample.labels.get("model_name") != "llama_tiny_tp2":
                continue
            name = sample.name[len("mindspore_serving:spec_decode_num_") :]
            if name in ("drafts_total", "draft_tokens_total", "accepted_tokens_total"):
                found[name[: -len("_total")]] += sample.value
            elif name == "accepted_tokens_per_pos_total":
                found[("per_pos", sample.labels["position"])] += sample.value
    return found


def _ports_for_two_hosts():
    """A port p free on 127.0.0.1 with p + 1 free on the second host (rank r listens on start_port + r)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind((SECOND_HOST, port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no pair of free ports")


def _agents_of(process, rank):
    return [
        p
        for p in psutil.Process(process.proc.pid).children(recursive=True)
        if "mindspore_serving.agent.start_agent" in " ".join(p.cmdline()) and f"--rank={rank}" in p.cmdline()
    ]


def test_a_rank_on_a_second_host_joins_and_its_loss_fails_streams_fast_then_the_group_recovers(tmp_path, tp1_config):
    config = tp2_config(
        tmp_path,
        start_port=_ports_for_two_hosts(),
        rank_hosts=["127.0.0.1", SECOND_HOST],
        scheduler_address=f"127.0.0.1:{free_port()}",
    )
    servables = write_servable(tmp_path, config, name="llama_tiny_tp2")
    # the hosts share the group's secret and speak mutual TLS, each with a certificate for its own IP
    certs = make_host_certs(str(tmp_path), ["127.0.0.1", SECOND_HOST])
    names = internal_tls.variable_names(internal_tls.AGENT_PREFIX)
    cluster_ssl = make_cluster_ssl(str(tmp_path), ["127.0.0.1", SECOND_HOST])  # MindSpore's channel too
    envs = [
        dict(zip(names, (*certs[ip], certs["ca"])), MS_SERVING_AGENT_SECRET="between-hosts", **cluster_ssl)
        for ip in ("127.0.0.1", SECOND_HOST)
    ]
    second_host = ServingProcess(
        [f"{ROOT}/start_agent.py", "--config", config, "--rank_start", "1"], str(tmp_path), env=envs[1]
    )
    server = None
    try:
        server, grpc_addr, _ = start_server(
            tmp_path,
            servables=("llama_tiny_tp2",),
            rest=False,
            extra_args=["--servable_directory", servables],
            env=dict(envs[0], GLOG_v="1"),
        )
        second_host.wait_for("all agents started", timeout=60)
        assert f"{SECOND_HOST}:" in second_host.output()
        (remote,) = _agents_of(second_host, 1)
        listening = [c for c in remote.net_connections(kind="tcp") if c.status == "LISTEN"]
        assert any(c.laddr.ip.endswith(SECOND_HOST) for c in listening), listening  # may show it IPv4-mapped
        with grpc.insecure_channel(f"{SECOND_HOST}:{listening[0].laddr.port}") as plain:
            with pytest.raises(grpc.RpcError) as refused:  # a plaintext caller does not reach the agent
                agent_pb2_grpc.LlmAgentStub(plain).Info(agent_pb2.AgentInfoRequest(), timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        client = Client(grpc_addr, "llama_tiny_tp2", "generate")
        expected = offline_greedy(tp1_config, PROMPT, 8)
        request = {"prompt": PROMPT, "max_new_tokens": np.int32(8), "temperature": np.float32(0.0)}
        assert client.infer(request)[0]["token_ids"].tolist() == expected.token_ids

        streams = [
            client.infer_stream({"prompt": f"{PROMPT} {i}", "max_new_tokens": np.int32(200), "ignore_eos": True})
            for i in range(3)
        ]
        for stream in streams:
            assert "token_id" in next(stream)
        ended = {}

        def drain(i, stream):
            events = list(stream)
            ended[i] = (time.monotonic(), events[-1] if events else None)

        readers = [threading.Thread(target=drain, args=(i, s)) for i, s in enumerate(streams)]
        for reader in readers:
            reader.start()
        killed_at = time.monotonic()
        remote.kill()
        for reader in readers:
            reader.join(30)
        assert len(ended) == 3
        for at, last in ended.values():
            assert at - killed_at < 5.0
            assert "error" in last and "rank 1" in last["error"], last

        # the worker starts a new group on its host; the second host starts its rank again and joins
        wait_recovered(lambda: client.infer(request)[0]["token_ids"].tolist() == expected.token_ids, 240)
    finally:
        if server is not None:
            server.close()
        second_host.close()


def test_a_rank_that_does_not_register_in_time_is_started_again_then_the_start_fails_naming_it(tmp_path):
    # MindSpore's rank client can keep failing to connect to the scheduler for minutes; its starter restarts such a
    # rank. A timeout shorter than MindSpore's import makes every start of a rank count as stuck.
    config = tp2_config(tmp_path, start_port=free_port(), scheduler_address=f"127.0.0.1:{free_port()}")
    proc = ServingProcess(
        [f"{ROOT}/start_agent.py", "--config", config],
        str(tmp_path),
        env={"MS_SERVING_CLUSTER_REGISTER_TIMEOUT": "0.3"},
    )
    try:
        assert proc.wait_exit(60) != 0
        out = proc.output()
        assert out.count("did not register with the cluster scheduler") >= MAX_RESTARTS + 1, out[-3000:]
        assert out.count("starting it again") >= MAX_RESTARTS  # each rank's; the first to run out ends the start
        assert f"it was started {MAX_RESTARTS + 1} times" in out
        assert "MS_SERVING_CLUSTER_REGISTER_TIMEOUT" in out
        assert not [
            p
            for p in psutil.process_iter(["cmdline"])
            if config in " ".join(p.info["cmdline"] or []) and p.pid != proc.proc.pid
        ]
    finally:
        proc.close()
