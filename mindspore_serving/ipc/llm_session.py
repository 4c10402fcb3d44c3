"""The master <-> LLM worker boundary (llm_worker.proto): the one module where its messages are built and read.

The master holds one Session per LLM worker: it writes a SessionCommand per new request (`generate_command`)
and per abandoned one (`abort_command`); the worker answers with one SessionBatch per engine step, whose
events it builds with `output_events` / `error_event` and the master reads with `read_event`.

- Sampling parameters cross as the typed SamplingParams message; an unset field means the engine's default
  (`seed` and `do_sample` have no zero value that could stand for "unset").
- Errors cross as a common/errors.py Kind and the client's message; the master raises the class of that kind.
- Finish reasons cross as an enum and become llm/request.py's FinishReason words again.
- The worker announces LLM_SESSION_PROTOCOL_VERSION in its registration facts (`registration_facts`); the
  master opens sessions only with workers whose facts carry its own version (`read_facts`).
"""
import functools
import json
from dataclasses import dataclass, fields
from typing import Iterable, List, Optional, Union

from mindspore_serving.common import errors
from mindspore_serving.common.errors import Kind
from mindspore_serving.llm.request import FinishReason, inter_token_latency
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.proto import llm_worker_pb2 as pb

LLM_SESSION_PROTOCOL_VERSION = 1
_VERSION_FACT = "session_protocol"


@dataclass
class TokenEvent:
    token_id: int
    text: str
    """Text this token adds to the output (may be empty while a UTF-8 character is incomplete)."""
    logprob: float
    special: bool = False
    index: int = 0
    """Position of the token in the output (0 = first generated token)."""


@dataclass
class Timing:
    queue_time: float
    """Seconds from arrival to first scheduling."""
    time_to_first_token: float
    inter_token_latency: float
    """Mean seconds between generated tokens."""
    e2e_latency: float


@dataclass
class FinalEvent:
    text: str
    """The whole generated text (without the prompt)."""
    token_ids: List[int]
    finish_reason: str
    """"eos", "length", "stop", "abort" or "error"."""
    prompt_tokens: int
    completion_tokens: int
    timing: Optional[Timing] = None
    prompt: str = ""
    """The prompt as the model saw it (after the chat template)."""


GenerationEvent = Union[TokenEvent, FinalEvent]

# ------------------------------------------------------------------------------------- registration facts


def registration_facts(**facts) -> str:
    """The worker's `extensions["llm"]` value: its LLM facts and the session protocol it speaks."""
    return json.dumps({**facts, _VERSION_FACT: LLM_SESSION_PROTOCOL_VERSION})


@functools.lru_cache(maxsize=256)
def read_facts(text: Optional[str]) -> Optional[dict]:
    """The facts of a worker that speaks this session protocol; None for any other worker. Parsed once per
    registration text (every generation looks its workers up); callers do not modify the dict."""
    if not text:
        return None
    facts = json.loads(text)
    return facts if facts.get(_VERSION_FACT) == LLM_SESSION_PROTOCOL_VERSION else None

# ---------------------------------------------------------------------------------------- sampling params


_DEFAULTS = SamplingParams()
_REPEATED = ("stop", "stop_token_ids")


def params_to_proto(params: SamplingParams) -> pb.SamplingParams:
    """Only the fields that differ from the defaults are set."""
    message = pb.SamplingParams()
    for field in fields(SamplingParams):
        value = getattr(params, field.name)
        if value == getattr(_DEFAULTS, field.name):
            continue
        if field.name in _REPEATED:
            getattr(message, field.name).extend(value)
        else:
            setattr(message, field.name, value)
    return message


def params_from_proto(message: pb.SamplingParams) -> SamplingParams:
    values = {}
    for field in fields(SamplingParams):
        if field.name in _REPEATED:
            values[field.name] = tuple(getattr(message, field.name))
        elif message.HasField(field.name):
            values[field.name] = getattr(message, field.name)
    return SamplingParams(**values)

# --------------------------------------------------------------------------------------------- commands


def generate_command(stream_id: int, request_id: str, params: SamplingParams, prompt: Optional[str] = None,
                     messages: Optional[Iterable] = None) -> pb.SessionCommand:
    """A new generation of `prompt`, or of chat `messages` (objects with `role` and `content`)."""
    request = pb.GenerateRequest(request_id=request_id, params=params_to_proto(params))
    if messages is not None:
        request.messages.extend(pb.ChatMessage(role=m.role, content=m.content) for m in messages)
    else:
        request.prompt = prompt or ""
    return pb.SessionCommand(stream_id=stream_id, generate=request)


def abort_command(stream_id: int) -> pb.SessionCommand:
    return pb.SessionCommand(stream_id=stream_id, abort=True)

# ------------------------------------------------------------------------------------ events, worker side


_KINDS = {
    Kind.VALIDATION: pb.ERROR_KIND_VALIDATION,
    Kind.OVERLOADED: pb.ERROR_KIND_OVERLOADED,
    Kind.NOT_FOUND: pb.ERROR_KIND_NOT_FOUND,
    Kind.UNAVAILABLE: pb.ERROR_KIND_UNAVAILABLE,
    Kind.GENERATION: pb.ERROR_KIND_GENERATION,
    Kind.INCOMPLETE: pb.ERROR_KIND_INCOMPLETE,
    Kind.INTERNAL: pb.ERROR_KIND_INTERNAL,
}
_KIND_OF = {wire: kind for kind, wire in _KINDS.items()}

_FINISH_REASONS = {
    FinishReason.EOS: pb.FINISH_REASON_EOS,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
}
_FINISH_REASON_OF = {wire: reason for reason, wire in _FINISH_REASONS.items()}


def error_event(error: BaseException) -> pb.GenerateEvent:
    """The event that fails a request with `error`. Outside the hierarchy, a ValueError is the request's fault
    (validation) and anything else the worker's (a generation failure)."""
    if not isinstance(error, errors.ServingError):
        error = errors.InvalidInputs(str(error)) if isinstance(error, ValueError) else errors.SystemError_(str(error))
    return pb.GenerateEvent(error=pb.Error(kind=_KINDS[error.KIND], message=error.message))


def final_event(output) -> pb.GenerateEvent:
    """The Final of a finished RequestOutput (llm/engine.py), with the engine's timings."""
    reason = output.finish_reason or FinishReason.ERROR
    final = pb.Final(text=output.text, finish_reason=_FINISH_REASONS[reason],
                     prompt_tokens=len(output.prompt_token_ids), completion_tokens=len(output.token_ids),
                     prompt=output.prompt or "")
    final.token_ids.extend(output.token_ids)
    metrics = output.metrics
    if metrics is not None:
        final.queue_time = metrics.queue_time or 0.0
        final.time_to_first_token = metrics.time_to_first_token or 0.0
        final.e2e_latency = metrics.e2e_latency or 0.0
        final.inter_token_latency = inter_token_latency(metrics.first_token_time, metrics.last_token_time,
                                                        len(output.token_ids)) or 0.0
    return pb.GenerateEvent(final=final)


def output_events(output, index: int, special_ids=frozenset()) -> List[pb.GenerateEvent]:
    """The events of one RequestOutput: a Token per new token with its own text, then the Final (or the
    Error) when it is the request's last output. `index` numbers the first new token; `special_ids` are the
    tokenizer's special tokens."""
    events = []
    texts = output.new_token_texts or [""] * (len(output.new_token_ids) - 1) + [output.new_text]
    for position, token_id in enumerate(output.new_token_ids):
        logprob = output.new_logprobs[position] if position < len(output.new_logprobs) else 0.0
        events.append(pb.GenerateEvent(token=pb.Token(id=token_id, text=texts[position], logprob=logprob,
                                                      special=token_id in special_ids, index=index + position)))
    if output.finished:
        events.append(error_event(_output_error(output)) if output.error else final_event(output))
    return events

def _output_error(output) -> errors.ServingError:
    """The error a failed RequestOutput ends with: its kind's class (a lost agent is unavailable), a generation
    failure otherwise."""
    kind = getattr(output, "error_kind", Kind.GENERATION)
    return errors.GenerationFailed(output.error) if kind is Kind.GENERATION else errors.error_of_kind(kind, output.error)

# ------------------------------------------------------------------------------------ events, master side


def read_event(event: pb.GenerateEvent) -> GenerationEvent:
    """The TokenEvent or FinalEvent of `event`; an Error event is raised as the ServingError of its kind."""
    which = event.WhichOneof("event")
    if which == "token":
        token = event.token
        return TokenEvent(token.id, token.text, token.logprob, token.special, token.index)
    if which == "final":
        final = event.final
        timing = Timing(final.queue_time, final.time_to_first_token, final.inter_token_latency, final.e2e_latency)
        return FinalEvent(final.text, list(final.token_ids), _FINISH_REASON_OF.get(final.finish_reason, FinishReason.ERROR).value,
                          final.prompt_tokens, final.completion_tokens, timing, final.prompt)
    raise errors.error_of_kind(_KIND_OF.get(event.error.kind, Kind.GENERATION), event.error.message)
