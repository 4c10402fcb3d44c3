"""End to end: Prometheus metrics after known traffic, scraped from the RESTful port and the --metrics port."""

import glob
import os

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from serving_process import SERVABLES, free_port, start_server

from mindspore_serving.client import Client

P, L = "mindspore_serving_", "mindspore_serving:"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    metrics_addr = f"127.0.0.1:{free_port()}"
    proc, grpc_addr, rest_addr = start_server(
        tmp_path_factory.mktemp("metrics"),
        servables=("add", "lenet", "llama_tiny"),
        extra_args=["--metrics", metrics_addr],
    )
    try:
        yield grpc_addr, f"http://{rest_addr}", f"http://{metrics_addr}"
    finally:
        proc.close()


def scrape(url: str) -> dict:
    """{(sample name, sorted labels): value} of one scrape."""
    reply = requests.get(f"{url}/metrics", timeout=10)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    """The sum of the samples named `name` whose labels include `labels` (0 when none)."""
    return sum(v for (n, lbls), v in samples.items() if n == name and set(labels.items()) <= set(lbls))


def test_requests_counted_by_outcome(served):
    grpc_addr, url, _ = served
    before = scrape(url)
    x = np.ones((2, 2), np.float32)
    for _ in range(10):
        reply = requests.post(
            f"{url}/model/add:add_common", json={"instances": [{"x1": x.tolist(), "x2": x.tolist()}]}, timeout=10
        )
        assert "error_msg" not in reply.json()
    result = Client(grpc_addr, "add", "add_common").infer({"x1": x})  # a missing input
    assert "Cannot find input x2" in str(result)
    after = scrape(url)
    labels = dict(servable="add", method="add_common")
    assert (
        value(after, P + "requests_total", outcome="success", **labels)
        - value(before, P + "requests_total", outcome="success", **labels)
        == 10
    )
    assert (
        value(after, P + "requests_total", outcome="client_error", **labels)
        - value(before, P + "requests_total", outcome="client_error", **labels)
        == 1
    )
    assert (
        value(after, P + "request_duration_seconds_count", **labels)
        - value(before, P + "request_duration_seconds_count", **labels)
        == 11
    )
    assert (
        value(after, P + "request_instances_sum", **labels) - value(before, P + "request_instances_sum", **labels) == 11
    )
    assert value(after, P + "workers_alive", servable="add") == 1
    assert value(after, P + "enqueued_requests") == 0
    assert value(after, P + "max_enqueued_requests") == 10000


def test_three_instances_through_batch_two(served):
    grpc_addr, _, metrics_url = served
    before = scrape(metrics_url)  # the separate port serves the same registry
    images = sorted(glob.glob(os.path.join(SERVABLES, "lenet", "images", "*.png")))[:3]
    result = Client(grpc_addr, "lenet", "classify_top1").infer([{"image": open(p, "rb").read()} for p in images])
    assert len(result) == 3 and all("label" in item for item in result)
    after = scrape(metrics_url)
    labels = dict(servable="lenet", device="0")

    def delta(name, **extra):
        return value(after, name, **labels, **extra) - value(before, name, **labels, **extra)

    assert delta(P + "model_batch_size_count") == 2  # two model calls: 2 instances, then 1
    assert delta(P + "model_batch_size_sum") == 3
    assert delta(P + "model_batch_size_bucket", le="1.0") == 1
    assert delta(P + "model_batch_size_bucket", le="2.0") == 2
    assert delta(P + "model_batch_padding_total") == 1
    assert delta(P + "model_execution_seconds_count") == 2
    assert value(after, P + "request_instances_bucket", servable="lenet", le="4.0") >= 1


def test_llm_request_tokens_and_latency(served):
    _, url, _ = served
    before = scrape(url)
    reply = requests.post(f"{url}/generate", timeout=60, json={"inputs": "hello", "parameters": {"max_new_tokens": 5}})
    assert reply.status_code == 200, reply.text
    after = scrape(url)

    def delta(name, **labels):
        return value(after, name, model_name="llama_tiny", **labels) - value(
            before, name, model_name="llama_tiny", **labels
        )

    assert delta(L + "generation_tokens_total") == int(reply.headers["x-generated-tokens"]) > 0
    assert delta(L + "prompt_tokens_total") >= 1
    assert delta(L + "time_to_first_token_seconds_count") == 1
    assert delta(L + "e2e_request_latency_seconds_count") == 1
    assert delta(L + "request_success_total") == 1
    blocks = value(after, L + "kv_cache_blocks_total", model_name="llama_tiny")
    assert blocks > 0
    assert value(after, L + "kv_cache_tokens_total", model_name="llama_tiny") == blocks * 16
    # every block, the scratch one too: 4 layers, K and V, 16 tokens, 2 heads of 32, float32
    assert value(after, L + "kv_cache_memory_bytes", model_name="llama_tiny") == (blocks + 1) * 4 * 2 * 16 * 2 * 32 * 4
    assert value(after, L + "num_requests_running", model_name="llama_tiny") == 0
