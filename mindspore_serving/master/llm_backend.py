"""The master's LlmBackend: forwards generation requests to the LLM servable's workers as gRPC streams."""
import itertools
import json
from typing import AsyncIterator, List

import grpc

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.frontends.llm.backend import (FinalEvent, GenerationEvent, GenerationRequest, ModelInfo,
                                                     Overloaded, Timing, TokenEvent)
from mindspore_serving.master.worker_registry import WorkerRegistry
from mindspore_serving.proto import llm_worker_pb2 as pb
from mindspore_serving.proto import llm_worker_pb2_grpc

LLM_EXTENSION = "llm"
GENERATE_METHOD = "generate"
_ERRORS = {"validation": errors.InvalidInputs, "overloaded": Overloaded, "unavailable": errors.ServableUnavailable}


def _final(final: pb.Final) -> FinalEvent:
    timing = Timing(final.queue_time, final.time_to_first_token, final.inter_token_latency, final.e2e_latency)
    return FinalEvent(final.text, list(final.token_ids), final.finish_reason, final.prompt_tokens,
                      final.completion_tokens, timing, final.prompt)


class MasterLlmBackend:
    def __init__(self, registry: WorkerRegistry):
        self.registry = registry
        self._ids = itertools.count(1)
        self._stubs = {}  # (worker key, pid) -> LlmWorkerStub on that worker's channel

    def models(self) -> List[ModelInfo]:
        infos = {}
        for record in self.registry.all():
            text = record.extensions.get(LLM_EXTENSION)
            if text and record.servable_name not in infos:
                data = json.loads(text)
                infos[record.servable_name] = ModelInfo(record.servable_name, data["max_model_len"],
                                                        data["max_num_seqs"], data["max_queue_size"],
                                                        data["vocab_size"], data.get("device", "CPU"))
        return list(infos.values())

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        candidates = [w for w in self.registry.candidates(request.model, GENERATE_METHOD, 0)
                      if LLM_EXTENSION in w.extensions]
        if not candidates:
            raise errors.ServableUnavailable(f"Model {request.model} is not a language model")
        worker = self.registry.pick(candidates)
        stub = self._stubs.get((worker.key, worker.pid))
        if stub is None:
            live = {(w.key, w.pid) for w in self.registry.all()}
            self._stubs = {k: v for k, v in self._stubs.items() if k in live}
            stub = self._stubs[(worker.key, worker.pid)] = llm_worker_pb2_grpc.LlmWorkerStub(worker.channel)
        message = pb.GenerateRequest(request_id=request.request_id or f"gen-{next(self._ids)}",
                                     params_json=json.dumps(request.params))
        if request.messages is not None:
            message.messages.extend(pb.ChatMessage(role=m.role, content=m.content) for m in request.messages)
        else:
            message.prompt = request.prompt or ""
        call = stub.Generate(message)
        worker.outstanding += 1
        try:
            async for event in call:
                kind = event.WhichOneof("event")
                if kind == "token":
                    t = event.token
                    yield TokenEvent(t.id, t.text, t.logprob, t.special, t.index)
                elif kind == "final":
                    yield _final(event.final)
                else:
                    raise _ERRORS.get(event.error.kind, errors.Failed)(event.error.message)
        except grpc.aio.AioRpcError as err:
            log.warning(f"generation on worker pid {worker.pid} failed: {err.code().name} {err.details()}")
            raise errors.WorkerUnavailable(f"Model {request.model} is not available: the worker (pid {worker.pid}) "
                                           f"stopped while generating") from None
        finally:
            worker.outstanding -= 1
            call.cancel()  # no-op when finished; aborts the request in the engine when our consumer went away
