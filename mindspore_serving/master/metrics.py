"""The master's metrics: its own bookkeeping (requests per servable method, LLM requests) and, at scrape time,
each worker's samples pulled over the control channel, written out by prometheus-client.

One scrape: `MetricsCollector.render()` (the RESTful `GET /metrics`, on the master loop) or `collect()` (the
separate metrics port's thread, prometheus-client's own server) asks every registered worker for its samples
(`WorkerService.Metrics`, all at once, SCRAPE_TIMEOUT each; a worker that does not answer is left out of this
scrape), adds the worker's servable, version and device labels and builds one family per name of
`common.metrics.FAMILIES`.
"""

import asyncio
from collections import defaultdict
from collections.abc import Sequence

import grpc
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from mindspore_serving import log
from mindspore_serving.common import metrics as m
from mindspore_serving.proto import internal_pb2
from mindspore_serving.spec.llm import LLM_EXTENSION

SCRAPE_TIMEOUT = 2.0  # seconds a worker has to answer a scrape


class MethodStats:
    """One servable version's method, updated in place by the dispatcher."""

    __slots__ = ("outcomes", "latency", "queue", "instances")

    def __init__(self):
        self.outcomes = {m.SUCCESS: 0, m.CLIENT_ERROR: 0, m.SERVER_ERROR: 0, m.CANCELLED: 0}
        self.latency = m.histogram(m.P + "request_duration_seconds")
        self.queue = m.histogram(m.P + "request_queue_seconds")
        self.instances = m.histogram(m.P + "request_instances")


class LlmStats:
    """One LLM servable's requests, updated in place by the LLM backend."""

    __slots__ = ("prompt_tokens", "generation_tokens", "finished", "ttft", "tpot", "e2e")

    def __init__(self):
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = defaultdict(int)  # finish reason -> requests
        self.ttft = m.histogram(m.L + "time_to_first_token_seconds")
        self.tpot = m.histogram(m.L + "time_per_output_token_seconds")
        self.e2e = m.histogram(m.L + "e2e_request_latency_seconds")


class MasterMetrics:
    def __init__(self):
        self.methods: dict[tuple[str, int, str], MethodStats] = {}
        self.llm: dict[str, LlmStats] = {}
        self.rejected = 0

    def method(self, servable: str, version: int, method: str) -> MethodStats:
        key = (servable, version, method)
        stats = self.methods.get(key)
        if stats is None:
            stats = self.methods[key] = MethodStats()
        return stats

    def llm_model(self, name: str) -> LlmStats:
        stats = self.llm.get(name)
        if stats is None:
            stats = self.llm[name] = LlmStats()
        return stats


class _Families:
    """What generate_latest needs: an object whose collect() yields the families."""

    def __init__(self, families):
        self._families = families

    def collect(self):
        return self._families


class MetricsCollector:
    def __init__(self, metrics: MasterMetrics, dispatcher, registry, processes, loop):
        self.metrics = metrics
        self.dispatcher = dispatcher
        self.registry = registry
        self.processes = processes
        self.loop = loop
        self.frontend_processes = None  # FrontendProcesses, once the master runs some

    async def gather(self) -> tuple[list[tuple], list]:
        """(worker record, its MetricsReply) of every worker that answered, and the MetricsReply of every
        front-end process that did."""
        frontends = self.frontend_processes
        pending = asyncio.ensure_future(frontends.metrics(SCRAPE_TIMEOUT)) if frontends is not None else None
        records = self.registry.all()
        replies = await asyncio.gather(
            *(r.stub.Metrics(internal_pb2.Empty(), timeout=SCRAPE_TIMEOUT) for r in records if r.stub is not None),
            return_exceptions=True,
        )
        answered = []
        for record, reply in zip([r for r in records if r.stub is not None], replies):
            if isinstance(reply, grpc.aio.AioRpcError):
                if reply.code() != grpc.StatusCode.UNIMPLEMENTED:
                    log.info(f"worker pid {record.pid} gave no metrics: {reply.code().name} {reply.details()}")
            elif isinstance(reply, BaseException):
                log.info(f"worker pid {record.pid} gave no metrics: {reply!r}")
            else:
                answered.append((record, reply))
        return answered, (await pending if pending is not None else [])

    async def render(self) -> bytes:
        """The exposition text of one scrape (on the master loop)."""
        return generate_latest(_Families(self.families(*await self.gather())))

    def collect(self):
        """prometheus-client's collector interface, for a registry served from another thread."""
        workers, frontends = asyncio.run_coroutine_threadsafe(self.gather(), self.loop).result(SCRAPE_TIMEOUT + 1)
        return self.families(workers, frontends)

    def families(self, workers: list[tuple], frontends: Sequence = ()) -> list:
        """The families of one scrape: the master's own points, each worker's samples (with its servable,
        version and device labels) and each front-end process's (MetricsReply), the same series summed."""
        points: dict[str, list] = defaultdict(list)  # name -> [(label values, number or Histogram)]
        self._master_points(points)
        for record, reply in workers:
            _add_samples(
                points,
                reply.samples,
                {
                    "servable": record.servable_name,
                    "model_name": record.servable_name,
                    "version": str(record.version_number),
                    "device": record.device_label,
                },
            )
        for reply in frontends:
            _add_samples(points, reply.samples, {})
        return [_family(name, m.FAMILIES[name], _summed(points[name])) for name in m.FAMILIES if name in points]

    def _master_points(self, points: dict[str, list]):
        _add_samples(points, frontend_samples(self.metrics, self.dispatcher, 0), {})
        points[m.P + "max_enqueued_requests"].append(((), self.dispatcher.max_enqueued_requests))
        alive: dict[tuple, int] = defaultdict(int)
        versions = {}
        for record in self.registry.all():
            alive[(record.servable_name, str(record.version_number))] += 1
            versions[record.key] = record.version_number
            if LLM_EXTENSION in record.extensions:
                in_flight = record.outstanding
            else:
                in_flight = sum(queue.in_flight for queue in list(record.queues.values()))
            points[m.P + "worker_calls_in_flight"].append(
                ((record.servable_name, str(record.version_number), record.device_label), in_flight)
            )
        for labels, count in alive.items():
            points[m.P + "workers_alive"].append((labels, count))
        for key, restarts in self.processes.restart_counts():
            plan = restarts[0]
            version = versions.get(key, plan.version_number)
            points[m.P + "worker_restarts"].append(((plan.servable_name, str(version), plan.device_label), restarts[1]))


def frontend_samples(metrics: MasterMetrics, dispatcher, index: int) -> list:
    """What one front end (the master: 0, a front-end process: its index) counted: its requests per servable
    method, what it holds and refused, its LLM requests; as MetricSamples (a front-end process's Metrics answer)."""
    out, total = [], 0
    for (servable, version, method), stats in list(metrics.methods.items()):
        labels = {"servable": servable, "version": str(version), "method": method}
        for outcome, count in stats.outcomes.items():
            out.append(m.sample(m.P + "requests", dict(labels, outcome=outcome), count))
            total += count
        out.append(m.sample(m.P + "request_duration_seconds", labels, hist=stats.latency))
        out.append(m.sample(m.P + "request_queue_seconds", labels, hist=stats.queue))
        out.append(m.sample(m.P + "request_instances", labels, hist=stats.instances))
    out.append(m.sample(m.P + "enqueued_requests", {}, dispatcher.enqueued))
    out.append(m.sample(m.P + "rejected_requests", {}, metrics.rejected))
    for name, stats in list(metrics.llm.items()):
        total += sum(stats.finished.values())
        labels = {"model_name": name}
        out.append(m.sample(m.L + "prompt_tokens", labels, stats.prompt_tokens))
        out.append(m.sample(m.L + "generation_tokens", labels, stats.generation_tokens))
        for reason, count in list(stats.finished.items()):
            out.append(m.sample(m.L + "request_success", dict(labels, finished_reason=reason), count))
        out.append(m.sample(m.L + "time_to_first_token_seconds", labels, hist=stats.ttft))
        out.append(m.sample(m.L + "time_per_output_token_seconds", labels, hist=stats.tpot))
        out.append(m.sample(m.L + "e2e_request_latency_seconds", labels, hist=stats.e2e))
    out.append(m.sample(m.P + "frontend_requests", {"frontend": str(index)}, total))
    return out


def _add_samples(points: dict[str, list], samples, base: dict[str, str]):
    """Adds MetricSamples to `points`; a label a sample lacks comes from `base`."""
    for sample in samples:
        family = m.FAMILIES.get(sample.name)
        if family is None:
            continue
        labels = tuple(sample.labels.get(name, base.get(name, "")) for name in family.labels)
        points[sample.name].append((labels, m.histogram_of(sample) if family.kind == m.HISTOGRAM else sample.value))


def _summed(points: list) -> list:
    """One point per label values: those several processes reported are added up."""
    merged: dict[tuple, object] = {}
    for labels, value in points:
        if labels not in merged:
            merged[labels] = value
        elif isinstance(value, m.Histogram):
            merged[labels] = m.add_histograms(merged[labels], value)
        else:
            merged[labels] += value
    return list(merged.items())


def _family(name: str, family: m.Family, points: list):
    labels = list(family.labels)
    if family.kind == m.COUNTER:
        metric = CounterMetricFamily(name, family.help, labels=labels)
        for values, value in points:
            metric.add_metric(list(values), value)
    elif family.kind == m.GAUGE:
        metric = GaugeMetricFamily(name, family.help, labels=labels)
        for values, value in points:
            metric.add_metric(list(values), value)
    else:
        metric = HistogramMetricFamily(name, family.help, labels=labels)
        for values, hist in points:
            metric.add_metric(list(values), hist.cumulative(), hist.sum)
    return metric
