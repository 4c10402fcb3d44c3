"""LlmWorker: the master's generation streams into an LLM worker. Converts messages and delegates to the engine loop."""
import json
import time

from mindspore_serving import log
from mindspore_serving.common import errors
from mindspore_serving.proto import llm_worker_pb2 as pb
from mindspore_serving.proto import llm_worker_pb2_grpc

VALIDATION, OVERLOADED, UNAVAILABLE, GENERATION = "validation", "overloaded", "unavailable", "generation"


def render_chat(template: str, message_format: str, messages) -> str:
    """The prompt of a chat: each message rendered with `message_format`, then put into `template`."""
    rendered = "".join(message_format.format(role=m.role, content=m.content) for m in messages)
    return template.format(messages=rendered)


def error_kind(err: BaseException) -> str:
    if isinstance(err, errors.Overloaded):
        return OVERLOADED
    if isinstance(err, errors.InvalidInputs):
        return VALIDATION
    if isinstance(err, (errors.ServableUnavailable, errors.WorkerUnavailable)):
        return UNAVAILABLE
    return GENERATION


def final_event(output) -> pb.GenerateEvent:
    metrics = output.metrics
    final = pb.Final(text=output.text, finish_reason=output.finish_reason.value if output.finish_reason else "error",
                     prompt_tokens=len(output.prompt_token_ids), completion_tokens=len(output.token_ids),
                     prompt=output.prompt or "")
    final.token_ids.extend(output.token_ids)
    if metrics is not None:
        final.queue_time = metrics.queue_time or 0.0
        final.time_to_first_token = metrics.time_to_first_token or 0.0
        final.e2e_latency = metrics.e2e_latency or 0.0
        if metrics.first_token_time is not None and metrics.last_token_time is not None and len(output.token_ids) > 1:
            final.inter_token_latency = (metrics.last_token_time - metrics.first_token_time) / (len(output.token_ids) - 1)
    return pb.GenerateEvent(final=final)


class LlmWorkerServicer(llm_worker_pb2_grpc.LlmWorkerServicer):
    def __init__(self, runtime):
        self.runtime = runtime

    def _prompt(self, request):
        if request.messages:
            model = self.runtime.config.model
            return render_chat(model.chat_template, model.chat_message, request.messages)
        return request.prompt

    def Generate(self, request, context):
        try:
            params = json.loads(request.params_json) if request.params_json else {}
            if not isinstance(params, dict):
                raise errors.InvalidInputs("parameters must be a JSON object")
            stream = self.runtime.submit(self._prompt(request), params, request.request_id or None)
        except (errors.ServingError, ValueError) as err:
            error = err if isinstance(err, errors.ServingError) else errors.InvalidInputs(str(err))
            yield pb.GenerateEvent(error=pb.Error(kind=error_kind(error), message=error.message))
            return
        # the master cancels the call when its client goes away: abort at once so the KV blocks are freed
        context.add_callback(stream.abort)
        index = 0
        try:
            for output in stream:
                for position, token_id in enumerate(output.new_token_ids):
                    text = output.new_text if position == len(output.new_token_ids) - 1 else ""
                    logprob = output.new_logprobs[position] if position < len(output.new_logprobs) else 0.0
                    yield pb.GenerateEvent(token=pb.Token(id=token_id, text=text, logprob=logprob, index=index))
                    index += 1
                if output.finished:
                    if output.error:
                        yield pb.GenerateEvent(error=pb.Error(kind=GENERATION, message=output.error))
                    else:
                        yield final_event(output)
        except errors.ServingError as err:
            yield pb.GenerateEvent(error=pb.Error(kind=error_kind(err), message=err.message))
        except Exception as err:  # never a silent close: the stream ends with the reason
            log.exception(f"generation {request.request_id} failed")
            yield pb.GenerateEvent(error=pb.Error(kind=GENERATION, message=str(err)))
