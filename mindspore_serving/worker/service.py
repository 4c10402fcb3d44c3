"""WorkerService: the master's calls into a worker. Converts messages and delegates to the runtime."""
import time

from mindspore_serving import log
from mindspore_serving.common import errors
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
            results = self._predict(request.request_id, spec.method_name, instances_pb, groups)
        self._encode(results, reply)
        if log.info_enabled():  # built per call only when it is written (GLOG_v <= 1)
            cost = (f"Method {spec.method_name} WorkerRequestHandle Time Cost # "
                    f"{(time.perf_counter() - started) * 1000:.3f} ms ---------------------")
            for _ in groups:  # once per public request of the call, as MindSpore Serving logs it
                log.info(cost)
        return reply

    def _predict(self, request_id: str, method_name: str, instances_pb, groups: list) -> list:
        """The general path: instances decoded, then the method's stages (MethodRunner)."""
        results: list = [None] * len(instances_pb)
        runnable, instances = [], []
        # decoded request by request: an instance that cannot be decoded fails the instances of its own request
        for start, end in groups:
            try:
                decoded = proto_to_instances(instances_pb[start:end])
            except Exception as err:
                log.exception(f"request {request_id} of method {method_name} failed")
                results[start:end] = [InstanceError(str(err))] * (end - start)
                continue
            runnable.extend(range(start, end))
            instances.extend(decoded)
        if instances:
            try:  # all instances together, so that they share model batches
                answers = self.runtime.predict(method_name, instances)
            except Exception as err:  # one path for anything the method could not even start with
                log.exception(f"request {request_id} of method {method_name} failed")
                answers = [InstanceError(str(err))] * len(instances)
            for index, answer in zip(runnable, answers):
                results[index] = answer
        return results

    @staticmethod
    def _encode(results: list, reply):
        for result in results:
            instance = reply.instances.add()
            error = reply.error_msg.add()
            if isinstance(result, BaseException):  # a ServingError keeps its code (e.g. WORKER_UNAVAILABLE)
                error.error_code = result.code if isinstance(result, errors.ServingError) else errors.INVALID_INPUTS
                error.error_msg = str(result).encode()
                continue
            try:
                items = instance.items
                for name, value in result.items():
                    value_to_tensor(value, items[name])
            except Exception as err:
                instance.Clear()
                error.error_code = errors.FAILED
                error.error_msg = f"convert output failed: {err}".encode()

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
