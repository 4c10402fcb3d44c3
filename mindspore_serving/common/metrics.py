"""Metric bookkeeping shared by the master and its workers, and the table of every metric the server exposes.

The processes keep plain counters and fixed-bucket histograms, updated in place on the hot path (a histogram
observation is one bisect and two additions, no allocation). Only the master owns a Prometheus registry: at
scrape time it pulls each worker's samples over the control channel (`WorkerService.Metrics`,
`MetricSample`s) and builds the families with prometheus-client (`master/metrics.py`). `FAMILIES` says, for
each name, its type, help, labels and buckets, so a worker's sample only carries its name, labels and numbers.
"""

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from mindspore_serving.common import errors
from mindspore_serving.proto import internal_pb2

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LLM_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
BATCH_BUCKETS = tuple(range(1, 17)) + (24, 32, 48, 64, 96, 128, 256)

SERVABLE_LABELS = ("servable", "version", "method")
WORKER_LABELS = ("servable", "version", "device")
MODEL_LABELS = WORKER_LABELS + ("model",)
LLM_LABELS = ("model_name",)
LLM_ENGINE_LABELS = ("model_name", "version", "device")

# outcomes of a classic request; cancelled: its client went away (a gRPC cancellation) before it was answered
SUCCESS, CLIENT_ERROR, SERVER_ERROR, CANCELLED = "success", "client_error", "server_error", "cancelled"


@dataclass(frozen=True)
class Family:
    kind: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


P = "mindspore_serving_"
L = "mindspore_serving:"  # vLLM's names, under our prefix
FAMILIES: dict[str, Family] = {
    # master, per servable, version and method (classic requests: REST and gRPC Predict)
    P + "requests": Family(
        COUNTER,
        "Requests ended, by outcome (success, client_error, server_error, cancelled: the client went away first)",
        SERVABLE_LABELS + ("outcome",),
    ),
    P + "request_duration_seconds": Family(
        HISTOGRAM, "Request latency in the master, from dispatch to answer", SERVABLE_LABELS, LATENCY_BUCKETS
    ),
    P + "request_queue_seconds": Family(
        HISTOGRAM,
        "Time a request's instances waited in the master before their call to a worker left",
        SERVABLE_LABELS,
        LATENCY_BUCKETS,
    ),
    P + "request_instances": Family(HISTOGRAM, "Instances per request", SERVABLE_LABELS, COUNT_BUCKETS),
    # master
    P + "enqueued_requests": Family(GAUGE, "Requests the master holds now", ()),
    P + "max_enqueued_requests": Family(GAUGE, "The limit of requests the master holds", ()),
    P + "rejected_requests": Family(COUNTER, "Requests refused because the enqueued limit was reached", ()),
    P + "frontend_requests": Family(
        COUNTER,
        "Requests (classic, KServe, LLM) a front end ended: 0 is the master, 1.. its front-end processes",
        ("frontend",),
    ),
    P + "workers_alive": Family(GAUGE, "Workers registered and serving", ("servable", "version")),
    P + "worker_restarts": Family(COUNTER, "Times the master restarted a worker that died", WORKER_LABELS),
    P + "worker_calls_in_flight": Family(
        GAUGE, "Calls (LLM: generations) sent to a worker and not answered yet", WORKER_LABELS
    ),
    # worker, per model
    P + "model_batch_size": Family(
        HISTOGRAM, "Filled instances per model call (padding not counted)", MODEL_LABELS, BATCH_BUCKETS
    ),
    P + "model_batch_padding": Family(COUNTER, "Padding instances added to fill model batches", MODEL_LABELS),
    P + "model_execution_seconds": Family(
        HISTOGRAM, "Model call time (merge, graph run, split)", MODEL_LABELS, LATENCY_BUCKETS
    ),
    # LLM, in the master (per request)
    L + "prompt_tokens": Family(COUNTER, "Prompt tokens of finished requests", LLM_LABELS),
    L + "generation_tokens": Family(COUNTER, "Generated tokens of finished requests", LLM_LABELS),
    L + "request_success": Family(
        COUNTER,
        "Finished requests by finish reason (eos, stop, length, abort, error)",
        LLM_LABELS + ("finished_reason",),
    ),
    L + "time_to_first_token_seconds": Family(
        HISTOGRAM, "Time to the first token, in the master", LLM_LABELS, LLM_LATENCY_BUCKETS
    ),
    L + "time_per_output_token_seconds": Family(
        HISTOGRAM, "Time between two tokens of a request", LLM_LABELS, LLM_LATENCY_BUCKETS
    ),
    L + "e2e_request_latency_seconds": Family(
        HISTOGRAM, "Request latency in the master, to its last event", LLM_LABELS, LLM_LATENCY_BUCKETS
    ),
    # LLM, in the worker (its engine)
    L + "num_requests_running": Family(GAUGE, "Requests in the engine's running batch", LLM_ENGINE_LABELS),
    L + "num_requests_waiting": Family(GAUGE, "Requests waiting for the engine", LLM_ENGINE_LABELS),
    L + "kv_cache_usage_perc": Family(GAUGE, "Fraction of usable KV blocks held by requests (0-1)", LLM_ENGINE_LABELS),
    L + "kv_cache_blocks_used": Family(GAUGE, "KV blocks held by requests", LLM_ENGINE_LABELS),
    L + "kv_cache_blocks_total": Family(GAUGE, "Usable KV blocks", LLM_ENGINE_LABELS),
    L + "kv_cache_tokens_total": Family(GAUGE, "Tokens the usable KV blocks hold", LLM_ENGINE_LABELS),
    L + "kv_cache_memory_bytes": Family(
        GAUGE, "KV cache memory per rank (all blocks, the scratch block included)", LLM_ENGINE_LABELS
    ),
    L + "num_preemptions": Family(
        COUNTER, "Requests preempted (their KV blocks freed, recomputed later)", LLM_ENGINE_LABELS
    ),
    L + "prefix_cache_queries": Family(COUNTER, "Prompt tokens looked up in the prefix cache", LLM_ENGINE_LABELS),
    L + "prefix_cache_hits": Family(COUNTER, "Prompt tokens found in the prefix cache", LLM_ENGINE_LABELS),
    L + "spec_decode_num_drafts": Family(
        COUNTER, "Speculative decoding: rows that verified proposed tokens", LLM_ENGINE_LABELS
    ),
    L + "spec_decode_num_draft_tokens": Family(COUNTER, "Speculative decoding: tokens proposed", LLM_ENGINE_LABELS),
    L + "spec_decode_num_accepted_tokens": Family(
        COUNTER, "Speculative decoding: proposed tokens the model kept", LLM_ENGINE_LABELS
    ),
    L + "spec_decode_num_accepted_tokens_per_pos": Family(
        COUNTER,
        "Speculative decoding: drafts whose token at this position (0-based) the model kept",
        LLM_ENGINE_LABELS + ("position",),
    ),
}


class Histogram:
    """Fixed buckets (`bounds`, upper bounds; one more bucket for +Inf), per-bucket counts and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # an upper bound is inclusive (le)
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list:
        """[(le, cumulative count)] as Prometheus writes them, ending with +Inf."""
        total, out = 0, []
        for bound, count in zip(self.bounds + (float("inf"),), self.counts):
            total += count
            out.append((_le(bound), total))
        return out


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def histogram(name: str) -> Histogram:
    return Histogram(FAMILIES[name].buckets)


def sample(
    name: str, labels: dict[str, str], value: float = 0.0, hist: Histogram | None = None
) -> "internal_pb2.MetricSample":
    """One MetricSample for the control channel."""
    message = internal_pb2.MetricSample(name=name, value=value)
    message.labels.update(labels)
    if hist is not None:
        message.bucket_counts.extend(hist.counts)
        message.sum = hist.sum
    return message


def add_histograms(first: Histogram, second: Histogram) -> Histogram:
    """A histogram of both (same buckets): the same metric of two processes, in one series."""
    total = Histogram(first.bounds)
    total.counts = [a + b for a, b in zip(first.counts, second.counts)]
    total.sum = first.sum + second.sum
    return total


def histogram_of(message: "internal_pb2.MetricSample") -> Histogram:
    """A MetricSample's histogram, with the buckets its family declares."""
    hist = histogram(message.name)
    if len(message.bucket_counts) == len(hist.counts):
        hist.counts = list(message.bucket_counts)
    hist.sum = message.sum
    return hist


def device_label(device_id: int, extra_index: int | None) -> str:
    """The `device` label of a worker's metrics: `extra<i>` for an extra worker, else its device id."""
    return str(device_id) if extra_index is None else f"extra{extra_index}"


def outcome_of_code(code: int) -> str:
    """A request error's outcome: the client's fault (bad input, unknown method) or the server's."""
    return CLIENT_ERROR if code in (errors.INVALID_INPUTS, errors.SERVABLE_UNAVAILABLE) else SERVER_ERROR


def outcome_of_answers(answers: Iterable) -> str:
    """A request's outcome from its per-instance answers: any client error first, then any server error."""
    outcome = SUCCESS
    for answer in answers:
        if isinstance(answer, BaseException):
            kind = outcome_of_code(getattr(answer, "code", -1))
            if kind == CLIENT_ERROR:
                return kind
            outcome = kind
    return outcome
