"""WorkerService: the master's calls into a worker. Converts messages and delegates to the runtime."""
import time

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import proto_to_instances, value_to_tensor
from mindspore_serving.proto import internal_pb2, internal_pb2_grpc
from mindspore_serving.worker.method_runner import InstanceError


class WorkerServicer(internal_pb2_grpc.WorkerServiceServicer):
    def __init__(self, runtime, request_exit):
        self.runtime = runtime
        self.request_exit = request_exit

    def Predict(self, request, context):
        started = time.perf_counter()
        reply = internal_pb2.WorkerPredictReply(request_id=request.request_id)
        spec = request.request.servable_spec
        try:
            instances = proto_to_instances(request.request.instances)
            results = self.runtime.predict(spec.method_name, instances)
        except Exception as err:  # one path for anything the method could not even start with
            log.exception(f"request {request.request_id} of method {spec.method_name} failed")
            results = [InstanceError(str(err))] * len(request.request.instances)
        for result in results:
            instance = reply.instances.add()
            error = reply.error_msg.add()
            if isinstance(result, BaseException):
                error.error_code = errors.INVALID_INPUTS
                error.error_msg = str(result).encode()
                continue
            try:
                for name, value in result.items():
                    value_to_tensor(value, instance.items[name])
            except Exception as err:
                instance.Clear()
                error.error_code = errors.FAILED
                error.error_msg = f"convert output failed: {err}".encode()
        log.info(f"Method {spec.method_name} WorkerRequestHandle Time Cost # "
                 f"{(time.perf_counter() - started) * 1000:.3f} ms")
        return reply

    def Exit(self, request, context):
        self.request_exit("the master asked the worker to exit")
        return internal_pb2.Empty()

    def Ping(self, request, context):
        return internal_pb2.Empty()
