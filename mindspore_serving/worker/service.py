"""WorkerService: the master's calls into a worker. Converts messages and delegates to the runtime.

A call may carry several public requests; its log lines about one of them end with that request's id (the one
its reply carries, from `client_request_ids`), as the front end's lines about it do. A stage's exception is
logged there with its traceback; the client gets only its text, cut of paths and reprs (method_runner.py)."""

import time

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.errors import client_text
from mindspore_serving.common.tensor_codec import proto_to_instances, value_to_tensor
from mindspore_serving.proto import internal_pb2, internal_pb2_grpc
from mindspore_serving.worker.method_runner import InstanceError
from mindspore_serving.worker.metrics import WORKER_METRICS
from mindspore_serving.worker.remote_model import serve_model_call


def _request_groups(request) -> list:
    """(start, end) of each public request's instances inside one WorkerPredictRequest."""
    total = len(request.request.instances)
    sizes = request.request_sizes
    if not sizes or sum(sizes) != total:
        return [(0, total)]
    groups, start = [], 0
    for size in sizes:
        groups.append((start, start + size))
        start += size
    return groups


def _client_ids(request, count: int) -> list:
    """The id of each of the `count` public requests of a call, as log lines name them: the one its reply carries,
    or the call's own id for a request without one (a master that sends none)."""
    ids = request.client_request_ids
    if len(ids) != count:
        return [request.request_id] * count
    return [client_id or request.request_id for client_id in ids]


def _log_for(request_id: str, write, message: str, **kwargs):
    """`write(message)` on a line that ends with ` [request <request_id>]` (log.bind_request_id)."""
    token = log.bind_request_id(request_id)
    try:
        write(message, **kwargs)
    finally:
        log.unbind_request_id(token)


def _log_failures(request, method_name: str, groups: list, failures: list):
    """One ERROR line per public request with failed instances: the first one's exception with its traceback (the
    exception a stage raised, or the conversion's), and how many more of its instances failed."""
    ids = _client_ids(request, len(groups))
    position = 0
    for (start, end), client_id in zip(groups, ids):
        first = position
        while position < len(failures) and failures[position][0] < end:
            position += 1
        if position == first:
            continue
        index, failure = failures[first]
        cause = failure.__cause__ if isinstance(failure, InstanceError) else failure
        more = f" ({position - first - 1} more of its instances failed)" if position - first > 1 else ""
        _log_for(
            client_id,
            log.error,
            f"method {method_name}, instance {index - start} failed: {failure}{more}",
            exc_info=cause,
        )


class WorkerServicer(internal_pb2_grpc.WorkerServiceServicer):
    def __init__(self, runtime, request_exit):
        self.runtime = runtime
        self.request_exit = request_exit

    def Predict(self, request, context):
        started = time.perf_counter()
        reply = internal_pb2.WorkerPredictReply(request_id=request.request_id)
        spec = request.request.servable_spec
        instances_pb = request.request.instances
        groups = _request_groups(request)
        direct = getattr(self.runtime, "predict_direct", None)
        results = direct(spec.method_name, instances_pb) if direct is not None and instances_pb else None
        if results is None:
            results = self._predict(request, spec.method_name, instances_pb, groups)
        failures = self._encode(results, reply)
        if failures:
            _log_failures(request, spec.method_name, groups, failures)
        if log.info_enabled():  # built per call only when it is written (GLOG_v <= 1)
            cost = (
                f"Method {spec.method_name} WorkerRequestHandle Time Cost # "
                f"{(time.perf_counter() - started) * 1000:.3f} ms ---------------------"
            )
            for client_id in _client_ids(request, len(groups)):  # once per public request, as MindSpore Serving
                _log_for(client_id, log.info, cost)
        return reply

    def _predict(self, request, method_name: str, instances_pb, groups: list) -> list:
        """The general path: instances decoded, then the method's stages (MethodRunner)."""
        results: list = [None] * len(instances_pb)
        runnable, instances = [], []
        # decoded request by request: an instance that cannot be decoded fails the instances of its own request
        for group, (start, end) in enumerate(groups):
            try:
                decoded = proto_to_instances(instances_pb[start:end])
            except Exception as err:
                _log_for(
                    _client_ids(request, len(groups))[group],
                    log.exception,
                    f"method {method_name}: the request's instances cannot be decoded (call {request.request_id})",
                )
                results[start:end] = [InstanceError(str(err))] * (end - start)
                continue
            runnable.extend(range(start, end))
            instances.extend(decoded)
        if instances:
            try:  # all instances together, so that they share model batches
                answers = self.runtime.predict(method_name, instances)
            except Exception as err:  # one path for anything the method could not even start with
                ids = _client_ids(request, len(groups))
                log.exception(
                    f"method {method_name} failed for every request of call {request.request_id} "
                    f"(request{'s' if len(ids) > 1 else ''} {', '.join(ids)})"
                )
                answers = [InstanceError(str(err))] * len(instances)
            for index, answer in zip(runnable, answers):
                results[index] = answer
        return results

    @staticmethod
    def _encode(results: list, reply) -> list:
        """Writes the results into `reply`; returns (index, exception) of each instance failed by an exception the
        log should show (a stage's, or its outputs' conversion), [] when there is none."""
        failures = []
        for index, result in enumerate(results):
            instance = reply.instances.add()
            error = reply.error_msg.add()
            if isinstance(result, BaseException):  # a ServingError keeps its code (e.g. WORKER_UNAVAILABLE)
                error.error_code = result.code if isinstance(result, errors.ServingError) else errors.INVALID_INPUTS
                error.error_msg = str(result).encode()
                if result.__cause__ is not None:
                    failures.append((index, result))
                continue
            try:
                items = instance.items
                for name, value in result.items():
                    value_to_tensor(value, items[name])
            except Exception as err:
                instance.Clear()
                error.error_code = errors.FAILED
                error.error_msg = client_text(f"convert output failed: {err}").encode()
                failures.append((index, err))
        return failures

    def CallModel(self, request, context):
        """A model call of an extra worker, forwarded by the master: it joins this worker's model batches."""
        return serve_model_call(self.runtime, request)

    def Exit(self, request, context):
        self.request_exit("the master asked the worker to exit")
        return internal_pb2.Empty()

    def Ping(self, request, context):
        """The heartbeat; its answer carries why the worker cannot serve now, if it cannot (the master's readiness)."""
        return internal_pb2.PingReply(not_ready=self.runtime.not_ready())

    def Metrics(self, request, context):
        """This worker's samples; the master labels them with the worker's servable, version and device."""
        reply = internal_pb2.MetricsReply()
        reply.samples.extend(WORKER_METRICS.samples())
        runtime_samples = getattr(self.runtime, "metric_samples", None)
        if runtime_samples is not None:
            reply.samples.extend(runtime_samples())
        return reply
