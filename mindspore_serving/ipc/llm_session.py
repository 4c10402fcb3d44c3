"""The master <-> LLM worker boundary (llm_worker.proto): the one module where its messages are built and read.

The master holds one Session per LLM worker: it writes a SessionCommand per new request (`generate_command`)
and per abandoned one (`abort_command`); the worker answers with one SessionBatch per engine step, whose
events it builds with `output_events` / `error_event` and the master reads with `read_event`. While none of a
session's requests changes but the engine steps (they wait behind other work), the worker sends an empty batch
now and then (`progress_batch`): any batch tells the master that the worker's engine progresses.

- Sampling parameters cross as the typed SamplingParams message; an unset field means the engine's default
  (`seed` and `do_sample` have no zero value that could stand for "unset").
- Errors cross as a common/errors.py Kind and the client's message; the master raises the class of that kind.
- Finish reasons cross as an enum and become llm/request.py's FinishReason words again.
- A request with several choices (SamplingParams n / best_of) streams the Tokens of all of them, each naming its
  choice, and one Final per choice (with its cumulative logprob); its stream ends after the last choice's Final,
  or at the first Error. A scored prompt (prompt_logprobs) comes first, as one PromptScores event.
- The worker announces LLM_SESSION_PROTOCOL_VERSION in its registration facts (`registration_facts`); the
  master opens sessions only with workers whose facts carry its own version (`read_facts`).
- Chat messages cross with their role and text content; a message's other fields (tool_calls, name, a content
  that is not text) cross as JSON for the chat template, and so do a /tokenize request's tools and documents.
- Tokenize and Detokenize (POST /tokenize, /detokenize) are unary calls: `tokenize_request` /
  `detokenize_request` on the master, `tokenize_reply` / `detokenize_reply` on the worker, read back with
  `read_tokenize_reply` / `read_detokenize_reply`, which raise a failure's ServingError.
"""

import functools
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from mindspore_serving.common import errors
from mindspore_serving.common.errors import Kind
from mindspore_serving.llm.request import FinishReason, inter_token_latency
from mindspore_serving.llm.sampling_params import SamplingParams, StructuredOutput
from mindspore_serving.proto import llm_worker_pb2 as pb

if TYPE_CHECKING:  # the master reads the events without loading the engine
    from mindspore_serving.llm.engine import RequestOutput

LLM_SESSION_PROTOCOL_VERSION = 2
_VERSION_FACT = "session_protocol"


@dataclass
class TopLogprob:
    """One of the most likely tokens at a position."""

    token_id: int
    text: str
    """The token's own text (decoded alone)."""
    logprob: float


@dataclass
class TokenEvent:
    token_id: int
    text: str
    """Text this token adds to the output (may be empty while a UTF-8 character is incomplete)."""
    logprob: float
    special: bool = False
    index: int = 0
    """Position of the token in the output (0 = first generated token)."""
    top_logprobs: list[TopLogprob] = field(default_factory=list)
    """The `top_logprobs` most likely tokens at this position, most likely first (empty when not asked)."""
    choice: int = 0
    """Which of the request's choices (n, best_of) this token belongs to."""


@dataclass
class PromptToken:
    token_id: int
    text: str
    logprob: float | None
    """log P(token | the tokens before it); None for the first token."""
    top_logprobs: list[TopLogprob] = field(default_factory=list)


@dataclass
class PromptEvent:
    """The prompt's tokens scored (SamplingParams.prompt_logprobs), sent before the first TokenEvent."""

    tokens: list[PromptToken]


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
    token_ids: list[int]
    finish_reason: str
    """"eos", "length", "stop", "abort" or "error"."""
    prompt_tokens: int
    completion_tokens: int
    timing: Timing | None = None
    prompt: str = ""
    """The prompt as the model saw it (after the chat template)."""
    choice: int = 0
    """Which choice this ends; a request with several choices ends after the FinalEvent of each."""
    cumulative_logprob: float = 0.0
    """Sum of the choice's token logprobs (best_of keeps the highest)."""


GenerationEvent = TokenEvent | FinalEvent | PromptEvent


@dataclass
class TokenizeRequest:
    """POST /tokenize: a prompt, or chat messages (dicts as OpenAI and Hugging Face write them: role, content,
    tool_calls, ...) through the model's chat template."""

    model: str
    prompt: str | None = None
    """Exactly one of prompt / messages is set."""
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None
    """None: as a generation tokenizes (a prompt with the tokenizer's special tokens, a chat as its template
    says)."""
    tools: list[Any] | None = None
    documents: list[Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """More variables for the chat template."""
    return_token_strs: bool = False


@dataclass
class Tokenized:
    token_ids: list[int]
    prompt: str
    """The text tokenized (a chat's, after its template)."""
    token_strs: list[str] | None = None


# ------------------------------------------------------------------------------------- registration facts


def registration_facts(**facts: Any) -> str:
    """The worker's `extensions["llm"]` value: its LLM facts and the session protocol it speaks."""
    return json.dumps({**facts, _VERSION_FACT: LLM_SESSION_PROTOCOL_VERSION})


@functools.lru_cache(maxsize=256)
def read_facts(text: str | None) -> dict | None:
    """The facts of a worker that speaks this session protocol; None for any other worker. Parsed once per
    registration text (every generation looks its workers up); callers do not modify the dict."""
    if not text:
        return None
    facts = json.loads(text)
    return facts if facts.get(_VERSION_FACT) == LLM_SESSION_PROTOCOL_VERSION else None


# ---------------------------------------------------------------------------------------- sampling params


_DEFAULTS = SamplingParams()
_REPEATED = ("stop", "stop_token_ids", "bad_words", "allowed_token_ids")


def params_to_proto(params: SamplingParams, explicit: Iterable[str] = ()) -> pb.SamplingParams:
    """Only the fields that differ from the defaults are set, and those in `explicit` (the request set them:
    they win over the model's own defaults, see params_from_proto)."""
    message = pb.SamplingParams()
    explicit = frozenset(explicit)
    for item in fields(SamplingParams):
        value = getattr(params, item.name)
        if value is None or (value == getattr(_DEFAULTS, item.name) and item.name not in explicit):
            continue
        if item.name in _REPEATED:
            getattr(message, item.name).extend(value)
        elif item.name == "logit_bias":
            message.logit_bias.extend(pb.TokenBias(token_id=t, bias=b) for t, b in value)
        elif item.name == "structured_output":
            message.structured_output = value.to_json()
        else:
            setattr(message, item.name, value)
    return message


def params_from_proto(message: pb.SamplingParams, defaults: Mapping[str, Any] | None = None) -> SamplingParams:
    """The request's params; a field it left unset takes `defaults` (the model's), then SamplingParams'."""
    values = dict(defaults or {})
    for item in fields(SamplingParams):
        if item.name in _REPEATED:
            values[item.name] = tuple(getattr(message, item.name))
        elif item.name == "logit_bias":
            values[item.name] = tuple((b.token_id, b.bias) for b in message.logit_bias)
        elif item.name == "structured_output":
            if message.HasField(item.name):
                values[item.name] = StructuredOutput.of(message.structured_output)
        elif message.HasField(item.name):
            values[item.name] = getattr(message, item.name)
    return SamplingParams(**values)


# --------------------------------------------------------------------------------------------- commands


def generate_command(
    stream_id: int,
    request_id: str,
    params: SamplingParams,
    prompt: str | None = None,
    messages: Iterable | None = None,
    explicit: Iterable[str] = (),
    tools: Sequence[Any] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    prompt_token_ids: Sequence[int] | None = None,
) -> pb.SessionCommand:
    """A new generation of `prompt`, of `prompt_token_ids`, or of chat `messages` (objects with `role` and
    `content`, or dicts); `explicit`: the sampling fields the request set itself; `tools` and `template_kwargs`
    go to the chat template."""
    request = pb.GenerateRequest(
        request_id=request_id,
        params=params_to_proto(params, explicit),
        tools_json=_json(tools),
        template_kwargs_json=_json(template_kwargs),
    )
    if messages is not None:
        request.messages.extend(chat_message(m) for m in messages)
    elif prompt_token_ids is not None:
        request.prompt_token_ids.extend(int(t) for t in prompt_token_ids)
    else:
        request.prompt = prompt or ""
    return pb.SessionCommand(stream_id=stream_id, generate=request)


def chat_message(message: Any) -> pb.ChatMessage:
    """The wire form of a chat message: an object with `role` and `content`, or a dict of any fields."""
    if not isinstance(message, Mapping):
        return pb.ChatMessage(role=message.role, content=message.content)
    extra = {k: v for k, v in message.items() if k != "role" and not (k == "content" and isinstance(v, str))}
    content = message.get("content")  # a content that is not text (None, parts) crosses as it is, in extra
    return pb.ChatMessage(
        role=str(message.get("role", "")), content=content if isinstance(content, str) else "", extra_json=_json(extra)
    )


def read_chat_messages(messages: Iterable[pb.ChatMessage]) -> list[dict[str, Any]]:
    """The messages as the chat template gets them: dicts with role, content and the message's other fields."""
    return [
        {"role": m.role, "content": m.content, **(json.loads(m.extra_json) if m.extra_json else {})} for m in messages
    ]


def _json(value: object) -> str:
    return "" if value is None or value == {} else json.dumps(value, ensure_ascii=False)


def read_json(text: str) -> Any:
    """A JSON field of a message (tools_json, ...): its value, None when empty."""
    return json.loads(text) if text else None


def abort_command(stream_id: int) -> pb.SessionCommand:
    return pb.SessionCommand(stream_id=stream_id, abort=True)


def progress_batch() -> pb.SessionBatch:
    """The batch of no events: the engine stepped though none of the session's requests changed (a heartbeat)."""
    return pb.SessionBatch()


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
    FinishReason.GRAMMAR: pb.FINISH_REASON_GRAMMAR,
}
_FINISH_REASON_OF = {wire: reason for reason, wire in _FINISH_REASONS.items()}


def _error(error: BaseException) -> pb.Error:
    """Outside the hierarchy, a ValueError is the request's fault (validation) and anything else the worker's
    (a generation failure)."""
    if not isinstance(error, errors.ServingError):
        error = errors.InvalidInputs(str(error)) if isinstance(error, ValueError) else errors.SystemError_(str(error))
    return pb.Error(kind=_KINDS[error.KIND], message=error.message)


def error_event(error: BaseException) -> pb.GenerateEvent:
    """The event that fails a request with `error`."""
    return pb.GenerateEvent(error=_error(error))


def final_event(output: "RequestOutput") -> pb.GenerateEvent:
    """The Final of a finished RequestOutput (llm/engine.py), of its choice, with the engine's timings."""
    reason = output.finish_reason or FinishReason.ERROR
    final = pb.Final(
        text=output.text,
        finish_reason=_FINISH_REASONS[reason],
        prompt_tokens=len(output.prompt_token_ids),
        completion_tokens=len(output.token_ids),
        prompt=output.prompt or "",
        choice=output.index,
        cumulative_logprob=output.cumulative_logprob,
    )
    final.token_ids.extend(output.token_ids)
    metrics = output.metrics
    if metrics is not None:
        final.queue_time = metrics.queue_time or 0.0
        final.time_to_first_token = metrics.time_to_first_token or 0.0
        final.e2e_latency = metrics.e2e_latency or 0.0
        final.inter_token_latency = (
            inter_token_latency(metrics.first_token_time, metrics.last_token_time, len(output.token_ids)) or 0.0
        )
    return pb.GenerateEvent(final=final)


def _no_text(token_id: int) -> str:
    return ""


def output_events(
    output: "RequestOutput",
    index: int,
    special_ids: Collection[int] = frozenset(),
    token_text: Callable[[int], str] = _no_text,
) -> list[pb.GenerateEvent]:
    """The events of one RequestOutput (one choice's, `output.index`): its scored prompt first when it carries one
    (PromptScores), a Token per new token with its own text, then the Final (or the Error) when it is the choice's
    last output. `index` numbers the choice's first new token; `special_ids` are the tokenizer's special tokens;
    `token_text(id)` is one token's own text (the tokenizer's decoding of that id alone, special tokens kept),
    for the top logprobs and the prompt's tokens."""
    events = []
    if output.prompt_logprobs is not None:
        events.append(prompt_scores_event(prompt_tokens(output, token_text)))
    texts = output.new_token_texts or [""] * (len(output.new_token_ids) - 1) + [output.new_text]
    for position, token_id in enumerate(output.new_token_ids):
        logprob = output.new_logprobs[position] if position < len(output.new_logprobs) else 0.0
        token = pb.Token(
            id=token_id,
            text=texts[position],
            logprob=logprob,
            special=token_id in special_ids,
            index=index + position,
            choice=output.index,
        )
        if position < len(output.new_top_logprobs):
            token.top_logprobs.extend(
                pb.TopLogprob(id=t, text=token_text(t), logprob=v) for t, v in output.new_top_logprobs[position]
            )
        events.append(pb.GenerateEvent(token=token))
    if output.finished:
        events.append(error_event(_output_error(output)) if output.error else final_event(output))
    return events


def prompt_tokens(output: "RequestOutput", token_text: Callable[[int], str] = _no_text) -> list[PromptToken]:
    """The scored prompt of a RequestOutput that carries one (prompt_logprobs, prompt_top_logprobs); [] for one
    that does not."""
    logprobs = output.prompt_logprobs
    if logprobs is None:
        return []
    tops = output.prompt_top_logprobs or []
    return [
        PromptToken(
            token_id,
            token_text(token_id),
            logprobs[i],
            [TopLogprob(t, token_text(t), v) for t, v in tops[i]] if i < len(tops) else [],
        )
        for i, token_id in enumerate(output.prompt_token_ids)
    ]


def _output_error(output: "RequestOutput") -> errors.ServingError:
    """The error a failed RequestOutput ends with: its kind's class (a lost agent is unavailable), a generation
    failure otherwise."""
    kind = getattr(output, "error_kind", Kind.GENERATION)
    message = output.error or ""  # set: the caller asks only for an output that failed
    return errors.GenerationFailed(message) if kind is Kind.GENERATION else errors.error_of_kind(kind, message)


# ------------------------------------------------------------------------------------ events, master side


def top_logprobs_proto(tops: Iterable[TopLogprob]) -> list[pb.TopLogprob]:
    return [pb.TopLogprob(id=t.token_id, text=t.text, logprob=t.logprob) for t in tops]


def _read_tops(tops: Iterable[pb.TopLogprob]) -> list[TopLogprob]:
    return [TopLogprob(t.id, t.text, t.logprob) for t in tops]


def prompt_scores_event(tokens: Iterable[PromptToken]) -> pb.GenerateEvent:
    """The event that carries a request's scored prompt (before its first token)."""
    scores = pb.PromptScores()
    for token in tokens:
        item = scores.tokens.add(id=token.token_id, text=token.text)
        if token.logprob is not None:
            item.logprob = token.logprob
        item.top_logprobs.extend(top_logprobs_proto(token.top_logprobs))
    return pb.GenerateEvent(prompt_scores=scores)


def read_event(event: pb.GenerateEvent) -> GenerationEvent:
    """The TokenEvent, FinalEvent or PromptEvent of `event`; an Error event is raised as the ServingError of
    its kind."""
    which = event.WhichOneof("event")
    if which == "token":
        token = event.token
        return TokenEvent(
            token.id,
            token.text,
            token.logprob,
            token.special,
            token.index,
            _read_tops(token.top_logprobs),
            token.choice,
        )
    if which == "final":
        final = event.final
        timing = Timing(final.queue_time, final.time_to_first_token, final.inter_token_latency, final.e2e_latency)
        reason = _FINISH_REASON_OF.get(final.finish_reason, FinishReason.ERROR).value
        return FinalEvent(
            final.text,
            list(final.token_ids),
            reason,
            final.prompt_tokens,
            final.completion_tokens,
            timing,
            final.prompt,
            final.choice,
            final.cumulative_logprob,
        )
    if which == "prompt_scores":
        return PromptEvent(
            [
                PromptToken(t.id, t.text, t.logprob if t.HasField("logprob") else None, _read_tops(t.top_logprobs))
                for t in event.prompt_scores.tokens
            ]
        )
    raise _raised(event.error)


def _raised(error: pb.Error) -> errors.ServingError:
    return errors.error_of_kind(_KIND_OF.get(error.kind, Kind.GENERATION), error.message)


# ---------------------------------------------------------------------------------- tokenize, detokenize


def tokenize_request(request: TokenizeRequest) -> pb.TokenizeRequest:
    message = pb.TokenizeRequest(
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
        tools_json=_json(request.tools),
        documents_json=_json(request.documents),
        template_kwargs_json=_json(request.chat_template_kwargs),
        return_token_strs=request.return_token_strs,
    )
    if request.add_special_tokens is not None:
        message.add_special_tokens = request.add_special_tokens
    if request.messages is not None:
        message.messages.extend(chat_message(m) for m in request.messages)
    else:
        message.prompt = request.prompt or ""
    return message


def read_tokenize_request(message: pb.TokenizeRequest) -> TokenizeRequest:
    """The worker's view (no model name: the worker serves one)."""
    return TokenizeRequest(
        model="",
        prompt=None if message.messages else message.prompt,
        messages=read_chat_messages(message.messages) if message.messages else None,
        add_generation_prompt=message.add_generation_prompt,
        continue_final_message=message.continue_final_message,
        add_special_tokens=message.add_special_tokens if message.HasField("add_special_tokens") else None,
        tools=read_json(message.tools_json),
        documents=read_json(message.documents_json),
        chat_template_kwargs=read_json(message.template_kwargs_json),
        return_token_strs=message.return_token_strs,
    )


def tokenize_reply(result: Tokenized | BaseException) -> pb.TokenizeReply:
    if isinstance(result, BaseException):
        return pb.TokenizeReply(error=_error(result))
    reply = pb.TokenizeReply(prompt=result.prompt)
    reply.token_ids.extend(result.token_ids)
    if result.token_strs is not None:
        reply.token_strs.extend(result.token_strs)
    return reply


def read_tokenize_reply(reply: pb.TokenizeReply, return_token_strs: bool = False) -> Tokenized:
    if reply.HasField("error"):
        raise _raised(reply.error)
    return Tokenized(list(reply.token_ids), reply.prompt, list(reply.token_strs) if return_token_strs else None)


def detokenize_request(token_ids: Iterable[int]) -> pb.DetokenizeRequest:
    return pb.DetokenizeRequest(token_ids=list(token_ids))


def detokenize_reply(result: str | BaseException) -> pb.DetokenizeReply:
    if isinstance(result, BaseException):
        return pb.DetokenizeReply(error=_error(result))
    return pb.DetokenizeReply(prompt=result)


def read_detokenize_reply(reply: pb.DetokenizeReply) -> str:
    if reply.HasField("error"):
        raise _raised(reply.error)
    prompt: str = reply.prompt
    return prompt
