"""Routes a request's instances to workers: checks them, cuts them into chunks of the worker batch size,
sends each chunk to the least busy worker and puts the answers back in request order."""
import asyncio
import itertools
from typing import List, Optional, Sequence

import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.common.tensor_codec import check_tensor, global_error
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry, request_repr
from mindspore_serving.proto import internal_pb2, ms_service_pb2
from mindspore_serving.worker.batching import chunk

DEFAULT_MAX_ENQUEUED_REQUESTS = 10000


class Dispatcher:
    def __init__(self, registry: WorkerRegistry):
        self.registry = registry
        self.max_enqueued_requests = DEFAULT_MAX_ENQUEUED_REQUESTS
        self.enqueued = 0
        self._ids = itertools.count(1)

    def check_instances(self, record: WorkerRecord, method_name: str, servable_name: str,
                        instances: Sequence) -> List[Optional[str]]:
        """Per instance: why it cannot be sent to a worker, or None."""
        input_names = list(record.methods[method_name].input_names)
        reasons: List[Optional[str]] = []
        for instance in instances:
            reason = None
            for name in input_names:
                if name not in instance.items:
                    reason = f"Cannot find input {name} in instance input , servable {servable_name}, method {method_name}"
                    break
                detail = check_tensor(instance.items[name])
                if detail:
                    reason = f"Instances input {name} check failed, detail: {detail}"
                    break
            reasons.append(reason)
        return reasons

    async def predict(self, spec, instances: Sequence) -> list:
        """Answers every instance of a request; raises ServingError for a request-wide failure."""
        if not instances:
            raise errors.InvalidInputs("Instances count of request cannot be 0")
        if self.enqueued >= self.max_enqueued_requests:
            raise errors.ServingError(errors.FAILED, f"Serving Error: enqueued requests count exceeds the limit "
                                                     f"{self.max_enqueued_requests}")
        self.enqueued += 1
        try:
            return await self._predict(spec, instances)
        finally:
            self.enqueued -= 1

    async def _predict(self, spec, instances: Sequence) -> list:
        candidates = self.registry.candidates(spec.name, spec.method_name, spec.version_number)
        reasons = self.check_instances(candidates[0], spec.method_name, spec.name, instances)
        results: list = [errors.InvalidInputs(reason) if reason else None for reason in reasons]
        valid = [index for index, reason in enumerate(reasons) if reason is None]
        batch = max(w.batch_size for w in candidates)
        tasks = [self._send_chunk(spec, candidates, [instances[i] for i in part]) for part in chunk(valid, batch)]
        for part, answers in zip(chunk(valid, batch), await asyncio.gather(*tasks)):
            for index, answer in zip(part, answers):
                results[index] = answer
        return results

    async def _send_chunk(self, spec, candidates: List[WorkerRecord], instances: Sequence) -> list:
        worker = self.registry.pick(candidates)
        request_id = f"{worker.pid}-{next(self._ids)}"
        request = internal_pb2.WorkerPredictRequest(request_id=request_id)
        request.request.servable_spec.CopyFrom(spec)
        request.request.servable_spec.version_number = worker.version_number
        request.request.instances.extend(instances)
        worker.outstanding += len(instances)
        try:
            reply = await worker.stub.Predict(request)
        except grpc.aio.AioRpcError as err:
            log.warning(f"request {request_id} to worker pid {worker.pid} failed: {err.code().name} {err.details()}")
            text = (f"Request {request_repr(spec.name, spec.method_name, spec.version_number)}, servable is not "
                    f"available: the worker (pid {worker.pid}) stopped while handling it")
            return [errors.WorkerUnavailable(text)] * len(instances)
        finally:
            worker.outstanding -= len(instances)
        worker.served += 1
        return [instance if not error.error_code else errors.make_error(error.error_code, error.error_msg.decode(errors="replace"))
                for instance, error in zip(reply.instances, reply.error_msg)]


def build_reply(spec, results: Sequence) -> "ms_service_pb2.PredictReply":
    """The public reply from per-instance Instance messages or ServingErrors (see tensor_codec.build_predict_reply
    for the rules); instances pass through without being decoded."""
    reply = ms_service_pb2.PredictReply()
    reply.servable_spec.CopyFrom(spec)
    failed = [result for result in results if isinstance(result, errors.ServingError)]
    single = global_error(failed) if len(failed) == len(results) else None
    if single is not None:
        reply.error_msg.add(error_code=single.code, error_msg=(single.message or "Predict failed").encode())
        return reply
    for result in results:
        if isinstance(result, errors.ServingError):
            reply.instances.add()
            reply.error_msg.add(error_code=result.code, error_msg=result.message.encode())
        else:
            reply.instances.append(result)
            if failed:
                reply.error_msg.add(error_code=errors.OK)
    return reply


def error_reply(spec, error: errors.ServingError) -> "ms_service_pb2.PredictReply":
    reply = ms_service_pb2.PredictReply()
    reply.servable_spec.CopyFrom(spec)
    reply.error_msg.add(error_code=error.code, error_msg=str(error.message).encode())
    return reply
