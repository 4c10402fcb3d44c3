"""Metric bookkeeping: histograms, outcomes, and families built from master and worker samples."""

from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mindspore_serving.common import errors
from mindspore_serving.common import metrics as m
from mindspore_serving.master.metrics import MasterMetrics, MetricsCollector, _Families, frontend_samples
from mindspore_serving.worker.metrics import WorkerMetrics


def test_histogram_buckets_are_inclusive_upper_bounds():
    hist = m.Histogram((1, 2, 4))
    for v in (1, 2, 3, 9):
        hist.observe(v)
    assert hist.counts == [1, 1, 1, 1] and hist.sum == 15 and hist.count == 4
    assert hist.cumulative() == [("1.0", 1), ("2.0", 2), ("4.0", 3), ("+Inf", 4)]


def test_outcomes():
    assert m.outcome_of_answers([{}, {}]) == m.SUCCESS
    assert m.outcome_of_answers([{}, errors.SystemError_("x")]) == m.SERVER_ERROR
    assert m.outcome_of_answers([errors.SystemError_("x"), errors.InvalidInputs("y")]) == m.CLIENT_ERROR
    assert m.outcome_of_code(errors.WORKER_UNAVAILABLE) == m.SERVER_ERROR


def test_families_from_master_and_worker_samples():
    metrics = MasterMetrics()
    stats = metrics.method("add", 1, "add_common")
    stats.outcomes[m.SUCCESS] += 3
    stats.latency.observe(0.002)
    metrics.rejected = 2
    worker = WorkerMetrics()
    worker.model("lenet.mindir").record(2, 0, 0.01)
    worker.model("lenet.mindir").record(1, 1, 0.01)
    record = SimpleNamespace(
        servable_name="lenet",
        version_number=1,
        device_label="0",
        pid=7,
        key="k",
        extensions={},
        queues={},
        outstanding=0,
        stub=None,
    )
    registry = SimpleNamespace(all=lambda: [record])
    processes = SimpleNamespace(
        restart_counts=lambda: [("k", (SimpleNamespace(servable_name="lenet", version_number=0, device_label="0"), 2))]
    )
    dispatcher = SimpleNamespace(enqueued=0, max_enqueued_requests=10)
    collector = MetricsCollector(metrics, dispatcher, registry, processes, loop=None)
    reply = SimpleNamespace(samples=worker.samples())
    text = generate_latest(_Families(collector.families([(record, reply)]))).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert (
        samples[
            (
                m.P + "requests_total",
                (("method", "add_common"), ("outcome", "success"), ("servable", "add"), ("version", "1")),
            )
        ]
        == 3
    )
    assert samples[(m.P + "rejected_requests_total", ())] == 2
    lenet = (("device", "0"), ("model", "lenet.mindir"), ("servable", "lenet"), ("version", "1"))
    assert samples[(m.P + "model_batch_size_count", lenet)] == 2
    assert samples[(m.P + "model_batch_size_bucket", lenet[:1] + (("le", "1.0"),) + lenet[1:])] == 1
    assert samples[(m.P + "model_batch_padding_total", lenet)] == 1
    assert samples[(m.P + "worker_restarts_total", (("device", "0"), ("servable", "lenet"), ("version", "1")))] == 2
    assert samples[(m.P + "workers_alive", (("servable", "lenet"), ("version", "1")))] == 1


def test_front_end_processes_samples_add_up_with_the_masters():
    """A front-end process's counts (MetricsReply of frontend_samples) join the master's: the same series summed,
    histograms bucket by bucket, and one frontend_requests series per front end."""

    def front_end(successes, latency):
        metrics = MasterMetrics()
        stats = metrics.method("add", 1, "add_common")
        stats.outcomes[m.SUCCESS] += successes
        stats.latency.observe(latency)
        metrics.llm_model("llama").finished["length"] += 1
        return metrics

    dispatcher = SimpleNamespace(enqueued=1, max_enqueued_requests=10)
    child = SimpleNamespace(samples=frontend_samples(front_end(5, 0.2), SimpleNamespace(enqueued=2), 1))
    collector = MetricsCollector(
        front_end(3, 0.002), dispatcher, SimpleNamespace(all=list), SimpleNamespace(restart_counts=list), loop=None
    )
    text = generate_latest(_Families(collector.families([], [child]))).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = (("method", "add_common"), ("servable", "add"), ("version", "1"))
    assert samples[(m.P + "requests_total", labels[:1] + (("outcome", "success"),) + labels[1:])] == 8
    assert samples[(m.P + "request_duration_seconds_count", labels)] == 2
    assert samples[(m.P + "request_duration_seconds_bucket", (("le", "0.0025"),) + labels)] == 1
    assert samples[(m.P + "enqueued_requests", ())] == 3
    assert samples[(m.P + "max_enqueued_requests", ())] == 10
    assert samples[(m.L + "request_success_total", (("finished_reason", "length"), ("model_name", "llama")))] == 2
    assert samples[(m.P + "frontend_requests_total", (("frontend", "0"),))] == 4
    assert samples[(m.P + "frontend_requests_total", (("frontend", "1"),))] == 6
