"""The LLM servable end to end: start_agent.py, and serving_server.py whose worker drives agents over gRPC."""

import os

import numpy as np
import psutil
from llm_setup import offline_greedy, write_config, write_servable
from serving_process import ROOT, ServingProcess, assert_sigterm_stops_all, free_port, start_server, wait_recovered

from mindspore_serving.client import Client

PROMPT = "And God said"


def test_start_agent_script_reports_ready_and_stops(tmp_path):
    config = write_config(tmp_path, start_port=free_port())
    proc = ServingProcess([os.path.join(ROOT, "start_agent.py"), "--config", config], str(tmp_path))
    try:
        proc.wait_for("all agents started", timeout=300)
        agents = psutil.Process(proc.proc.pid).children(recursive=True)
        assert agents
        # agents.cpu_affinity: auto binds the (CPU) agent to its share of the cores, threads included
        from mindspore_serving.spec.llm_config import load_serving_config

        expected = load_serving_config(config).agents.cpus_of(0, "CPU")
        (agent,) = [p for p in agents if "mindspore_serving.agent.start_agent" in p.cmdline()]
        assert agent.cpu_affinity() == expected
        assert {tuple(os.sched_getaffinity(t.id)) for t in agent.threads()} == {tuple(expected)}
        assert_sigterm_stops_all(proc, agents)
    finally:
        proc.close()


def test_start_agent_reports_a_broken_config(tmp_path):
    config = write_config(tmp_path, start_port=free_port())
    with open(config) as stream:
        text = stream.read()
    with open(config, "w") as stream:
        stream.write(text.replace("num_blocks:", "num_blockz:"))
    proc = ServingProcess([os.path.join(ROOT, "start_agent.py"), "--config", config], str(tmp_path))
    try:
        assert proc.wait_exit(120) != 0
        assert "'engine' has unknown field(s) ['num_blockz']" in proc.output()
    finally:
        proc.close()


def test_generate_over_grpc_matches_offline_greedy(llm_server):
    _, grpc_addr, _, config = llm_server
    result = Client(grpc_addr, "llama_tiny", "generate").infer(
        {"prompt": PROMPT, "max_new_tokens": np.int32(16), "temperature": np.float32(0.0)}
    )
    expected = offline_greedy(config, PROMPT, 16)
    assert result[0]["token_ids"].tolist() == expected.token_ids
    assert result[0]["text"] == expected.text
    assert result[0]["finish_reason"] == expected.finish_reason.value
    assert result[0]["completion_tokens"].item() == len(expected.token_ids)


def test_concurrent_generation_and_bad_input(llm_server):
    _, grpc_addr, _, _ = llm_server
    client = Client(grpc_addr, "llama_tiny", "generate")
    good = {"prompt": PROMPT, "max_new_tokens": np.int32(8), "temperature": np.float32(0.0)}
    instances = [
        good,
        {"prompt": ""},
        {"prompt": PROMPT, "top_p": np.float32(1.5)},
        {"prompt": PROMPT, "temperature": np.float32(-1.0)},
        {"prompt": "x " * 400},
        good,
    ]
    result = client.infer(instances)
    assert result[0]["token_ids"].tolist() == result[5]["token_ids"].tolist()
    assert "empty" in result[1]["error"]
    assert "top_p" in result[2]["error"]
    assert "temperature" in result[3]["error"]
    assert "max_model_len" in result[4]["error"] or "longer" in result[4]["error"]
    futures = [client.infer_async({"prompt": f"{PROMPT} {i}", "max_new_tokens": np.int32(6)}) for i in range(12)]
    for future in futures:
        assert future.result()[0]["completion_tokens"].item() >= 1


def test_concurrent_greedy_requests_through_the_agents_match_each_alone(llm_server):
    # more requests than max_num_seqs: full batches run rounds planned while the agent computes the one before
    # (async scheduling), requests join as others leave, some stop on end-of-sequence inside a round
    _, grpc_addr, _, config = llm_server
    client = Client(grpc_addr, "llama_tiny", "generate")
    words = ["light", "waters", "firmament", "earth", "seed", "night", "day", "heaven"]
    requests = [(f"{PROMPT} {words[i % 8]}" + " and the" * (i % 3), 4 + (7 * i) % 37) for i in range(24)]
    futures = [
        client.infer_async({"prompt": prompt, "max_new_tokens": np.int32(n), "temperature": np.float32(0.0)})
        for prompt, n in requests
    ]
    served = [future.result()[0] for future in futures]
    for (prompt, n), got in zip(requests, served):
        expected = offline_greedy(config, prompt, n)
        assert got["token_ids"].tolist() == expected.token_ids, prompt
        assert got["finish_reason"] == expected.finish_reason.value


def test_seeded_sampling_is_reproducible(llm_server):
    _, grpc_addr, _, _ = llm_server
    client = Client(grpc_addr, "llama_tiny", "generate")
    sampled = {
        "prompt": PROMPT,
        "max_new_tokens": np.int32(12),
        "temperature": np.float32(0.9),
        "top_k": np.int32(20),
        "top_p": np.float32(0.9),
        "seed": np.int64(1234),
    }
    first, second = client.infer([sampled, sampled])
    assert first["token_ids"].tolist() == second["token_ids"].tolist()


def test_a_dead_agent_is_replaced_in_its_worker_and_a_dead_worker_is_restarted(tmp_path):
    config = write_config(tmp_path, start_port=0)
    servables = write_servable(tmp_path, config)
    proc, grpc_addr, _ = start_server(
        tmp_path,
        servables=("llama_tiny",),
        rest=False,
        extra_args=["--servable_directory", servables],
        env={"GLOG_v": "1"},
    )
    try:
        client = Client(grpc_addr, "llama_tiny", "generate")
        assert client.infer({"prompt": PROMPT, "max_new_tokens": np.int32(4)})[0]["completion_tokens"].item() == 4
        children = psutil.Process(proc.proc.pid).children(recursive=True)
        agents = [p for p in children if "mindspore_serving.agent.start_agent" in p.cmdline()]
        (worker,) = [p for p in children if any("start_worker" in part for part in p.cmdline())]
        assert agents
        for agent in agents:
            agent.kill()
        # the worker starts a new agent itself (only what died is reloaded) and stays registered meanwhile
        wait_recovered(
            lambda: client.infer({"prompt": PROMPT, "max_new_tokens": np.int32(4)})[0]["completion_tokens"].item() == 4,
            300,
        )
        assert worker.is_running() and "Register success" not in proc.output().split("all workers have registered")[-1]

        # the worker dies in the middle of a stream: the stream ends with an error, the next session works
        stream = client.infer_stream({"prompt": PROMPT, "max_new_tokens": np.int32(200), "ignore_eos": True})
        assert "token_id" in next(stream)
        worker.kill()
        rest = list(stream)
        assert "not available" in rest[-1]["error"]
        proc.wait_for("Register success", count=2, timeout=300)
        assert client.infer({"prompt": PROMPT, "max_new_tokens": np.int32(4)})[0]["completion_tokens"].item() == 4
    finally:
        proc.close()
