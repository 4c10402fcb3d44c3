"""OpenAI's API: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models[/{model}]`.

A request may ask for n choices (best_of generated, the n likeliest returned); usage counts the prompt once
and the tokens of every choice generated. Log-probabilities come in OpenAI's shapes (completions: tokens,
token_logprobs, top_logprobs, text_offset, the scored prompt first with echo; chat: content items with
top_logprobs) and vLLM's prompt_logprobs. Streams carry one choice per chunk, each choice with its own
finish chunk; they are SSE chunks (`text_completion` / `chat.completion.chunk`) ending
with `data: [DONE]`; with `stream_options.include_usage` every chunk has `"usage": null` and a last chunk
with no choices carries the usage. An error in the middle of a stream is sent as `data: {"error": {...}}`
followed by `data: [DONE]`. Chat messages go to the backend, which applies the model's chat template;
tool calls are read out of the output (tool_calls.py) into OpenAI's `tool_calls`, whole or as deltas.
"""

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NamedTuple

from fastapi import APIRouter, Request

from mindspore_serving import log
from mindspore_serving.frontends.errors import Protocol, http_error
from mindspore_serving.frontends.llm import sse, tool_calls
from mindspore_serving.frontends.llm.generation import Generation, GenerationBatch, finite
from mindspore_serving.frontends.llm.params import new_request_id, parse_body, served_model
from mindspore_serving.frontends.llm.responses import guarded, json_reply, stream_reply
from mindspore_serving.frontends.llm.schemas_openai import UNKNOWN_FIELD, ChatCompletionRequest, CompletionRequest
from mindspore_serving.master.llm_types import (
    FinalEvent,
    GenerationRequest,
    LlmBackend,
    ModelInfo,
    PromptEvent,
    TokenEvent,
    TopLogprob,
)

PROTOCOL = Protocol.OPENAI
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "grammar": "stop"}
OWNER = "mindspore-serving"
LOGPROB_FLOOR = -9999.0
"""Stands for a log-probability of -inf, which JSON cannot carry."""


def finish_reason(final: FinalEvent) -> str:
    return FINISH_REASONS.get(final.finish_reason, final.finish_reason)


def usage(*generations: Generation) -> dict:
    """Each prompt once, and the tokens of every choice generated (best_of's dropped ones too, as OpenAI)."""
    prompt = sum(g.prompt_tokens for g in generations)
    completion = sum(g.completion_tokens for g in generations)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def returned_choices(generation: Generation, n: int) -> list[int]:
    """The choices a reply holds, in its order: every one by index; when more were generated than asked for
    (best_of > n), the n with the highest cumulative log-probability, best first."""
    finals = generation.finals
    if len(finals) <= n:
        return sorted(finals)
    return sorted(finals, key=lambda c: (-finals[c].cumulative_logprob, c))[:n]


def model_card(model: ModelInfo, created: int) -> dict:
    return {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": OWNER,
        "max_model_len": model.max_model_len,
    }


def error_chunks(exc: BaseException) -> bytes:
    return sse.event(http_error(PROTOCOL, exc)[1]) + sse.DONE


def _logprob(value: float) -> float:
    return finite(value, LOGPROB_FLOOR)


def prompt_logprobs(scores: PromptEvent | None, k: int) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token, null for the first, else {token id (text): {"logprob",
    "rank", "decoded_token"}} for the token itself and its `k` most likely alternatives. The alternatives'
    rank is their place (1 = most likely); the prompt token's is its place among them, null when it is not
    one of them (the engine reports no further ranks)."""
    if scores is None:
        return None
    positions = []
    for token in scores.tokens:
        if token.logprob is None:
            positions.append(None)
            continue
        alternatives = token.top_logprobs[:k]
        ranks = {alt.token_id: rank for rank, alt in enumerate(alternatives, 1)}
        entry = {
            str(token.token_id): {
                "logprob": _logprob(token.logprob),
                "rank": ranks.get(token.token_id),
                "decoded_token": token.text,
            }
        }
        for rank, alt in enumerate(alternatives, 1):
            entry.setdefault(
                str(alt.token_id), {"logprob": _logprob(alt.logprob), "rank": rank, "decoded_token": alt.text}
            )
        positions.append(entry)
    return positions


# /v1/completions


def _top_dict(token_id: int, text: str, logprob: float, alternatives: list[TopLogprob], k: int) -> dict:
    """OpenAI's legacy top_logprobs of one position: the k most likely tokens' texts and the chosen one's,
    so up to k + 1 entries (a text two tokens share keeps the likelier)."""
    top = {}
    for alt in alternatives[:k]:
        top.setdefault(alt.text, _logprob(alt.logprob))
    if token_id not in {alt.token_id for alt in alternatives[:k]}:
        top.setdefault(text, _logprob(logprob))
    return top


def completion_logprobs(tokens: list[TokenEvent], k: int, offset: int, prompt: PromptEvent | None = None) -> dict:
    """`logprobs` of a completion choice: the scored prompt's tokens first when given (the first one has no
    log-probability), then the generated ones; text_offset counts from `offset`."""
    texts, logprobs, tops = [], [], []
    for scored in prompt.tokens if prompt is not None else []:
        texts.append(scored.text)
        if scored.logprob is None:
            logprobs.append(None)
            tops.append(None)
        else:
            logprobs.append(_logprob(scored.logprob))
            tops.append(_top_dict(scored.token_id, scored.text, scored.logprob, scored.top_logprobs, k))
    for token in tokens:
        texts.append(token.text)
        logprobs.append(_logprob(token.logprob))
        tops.append(_top_dict(token.token_id, token.text, token.logprob, token.top_logprobs, k))
    offsets = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": texts, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def _prompt_scores(generation: Generation, request: CompletionRequest) -> PromptEvent | None:
    """The scored prompt that echo + logprobs puts first in the logprobs (None: not asked, or not sent)."""
    return generation.prompt_scores if request.scores_prompt else None


def completion_payload(batch: GenerationBatch, request: CompletionRequest, prompts: list[str]) -> dict:
    """Prompt p's choice j is choices[p * n + j] (OpenAI's order)."""
    n = request.n or 1
    choices = []
    for number, (generation, prompt) in enumerate(zip(batch.items, prompts)):
        prefix = prompt if request.echo else ""
        scores = _prompt_scores(generation, request)
        scored_prompt = (
            None
            if request.prompt_logprobs is None
            else prompt_logprobs(generation.prompt_scores, request.prompt_logprobs)
        )  # one per prompt
        for rank, choice in enumerate(returned_choices(generation, n)):
            final = generation.finals[choice]
            logprobs = None
            if request.logprobs is not None:
                logprobs = completion_logprobs(
                    generation.choice_tokens(choice), request.logprobs, 0 if scores is not None else len(prefix), scores
                )
            item = {
                "index": number * n + rank,
                "text": prefix + final.text,
                "logprobs": logprobs,
                "finish_reason": finish_reason(final),
            }
            if scored_prompt is not None:
                item["prompt_logprobs"] = scored_prompt
            choices.append(item)
    return {
        "id": f"cmpl-{batch.request_id}",
        "object": "text_completion",
        "created": batch.created,
        "model": batch.model.name,
        "choices": choices,
        "usage": usage(*batch.items),
    }


async def completion_chunks(
    batch: GenerationBatch, request: CompletionRequest, prompts: list[str]
) -> AsyncIterator[bytes]:
    """One choice per chunk, a prompt's choices interleaved as their tokens come; each choice ends with a chunk
    holding its finish_reason. With echo, each choice starts with the prompt (and its scores). The prompts of a
    batch follow one another (prompt p's choice j has index p * n + j)."""
    head = {
        "id": f"cmpl-{batch.request_id}",
        "object": "text_completion",
        "created": batch.created,
        "model": batch.model.name,
    }
    if request.include_usage:
        head["usage"] = None

    def chunk(index: int, text: str, logprobs, reason: str | None) -> bytes:
        return sse.event(
            {**head, "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}]}
        )

    for number, (generation, prompt) in enumerate(zip(batch.items, prompts)):
        first = number * generation.num_choices
        offset = 0
        if request.echo:
            scores = _prompt_scores(generation, request)
            logprobs = completion_logprobs([], request.logprobs, 0, scores) if scores is not None else None
            offset = sum(len(t) for t in logprobs["tokens"]) if logprobs is not None else len(prompt)
            for choice in range(generation.num_choices):
                yield chunk(first + choice, prompt, logprobs, None)
        offsets = [offset] * generation.num_choices
        async for event in generation.outputs():
            index = first + event.choice
            if isinstance(event, FinalEvent):
                yield chunk(index, "", None, finish_reason(event))
            elif request.logprobs is not None:
                logprobs = completion_logprobs([event], request.logprobs, offsets[event.choice])
                yield chunk(index, event.text, logprobs, None)
                offsets[event.choice] += len(event.text)
            elif event.text:
                yield chunk(index, event.text, None, None)
    if request.include_usage:
        yield sse.event({**head, "choices": [], "usage": usage(*batch.items)})
    yield sse.DONE


# /v1/chat/completions


def _chat_logprob(token: TokenEvent, k: int) -> dict:
    return {
        "token": token.text,
        "logprob": _logprob(token.logprob),
        "bytes": list(token.text.encode("utf-8")),
        "top_logprobs": [
            {"token": alt.text, "logprob": _logprob(alt.logprob), "bytes": list(alt.text.encode("utf-8"))}
            for alt in token.top_logprobs[:k]
        ],
    }


def chat_logprobs(tokens: list[TokenEvent], k: int) -> dict:
    return {"content": [_chat_logprob(t, k) for t in tokens]}


def tool_parser(generation: Generation, request: ChatCompletionRequest) -> tool_calls.ToolParser | None:
    """What reads tool calls out of a choice's text: a forced tool_choice's JSON; with "auto", the parser of the
    model's format (ModelInfo.tool_call_parser; none: no calls are read, all is content); "none": nothing."""
    choice = request.effective_tool_choice()
    if choice == "none":
        return None
    if choice == "auto":
        name = generation.model.tool_call_parser
        if name and name not in tool_calls.PARSERS:  # a worker of another version announces a format unknown here
            log.warning(
                f"model {generation.model.name} writes tool calls as {name!r}, which this front end cannot "
                f"read; its output is returned as content"
            )
            return None
        return tool_calls.get_parser(name) if name else None
    return tool_calls.forced_parser(request.tools, choice)


def chat_payload(generation: Generation, request: ChatCompletionRequest) -> dict:
    k = request.top_logprobs or 0
    parser = tool_parser(generation, request)
    tool_choice = request.effective_tool_choice()
    choices = []
    for index, choice in enumerate(returned_choices(generation, request.n or 1)):
        final = generation.finals[choice]
        logprobs = chat_logprobs(generation.choice_tokens(choice), k) if request.logprobs else None
        reason = finish_reason(final)
        if parser is None:
            message = {"role": "assistant", "content": final.text}
        else:
            content, calls = parser.parse(final.text)
            message = tool_calls.assistant_message(content, calls)
            reason = tool_calls.finish_reason(reason, bool(calls), tool_choice)
        choices.append({"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason})
    payload = {
        "id": f"chatcmpl-{generation.request_id}",
        "object": "chat.completion",
        "created": generation.created,
        "model": generation.model.name,
        "choices": choices,
        "usage": usage(generation),
    }
    if request.prompt_logprobs is not None:
        payload["prompt_logprobs"] = prompt_logprobs(generation.prompt_scores, request.prompt_logprobs)
    return payload


async def chat_chunks(generation: Generation, request: ChatCompletionRequest) -> AsyncIterator[bytes]:
    """Each choice's first chunk gives the role; then one choice per chunk as tokens come, and each choice's
    chunk with its finish_reason. When tool calls are read, a choice's text goes through its ToolCallStream:
    content deltas as they are decided, each call as a delta with its id and name then one with its arguments,
    and finish_reason "tool_calls" after calls."""
    head = {
        "id": f"chatcmpl-{generation.request_id}",
        "object": "chat.completion.chunk",
        "created": generation.created,
        "model": generation.model.name,
    }
    if request.include_usage:
        head["usage"] = None
    k = request.top_logprobs or 0
    tool_choice = request.effective_tool_choice()
    parser = tool_parser(generation, request)  # stateless: each choice's stream keeps its own state
    streams = (
        {} if parser is None else {index: tool_calls.ToolCallStream(parser) for index in range(generation.num_choices)}
    )

    def chunk(index: int, delta: dict, logprobs, reason: str | None) -> bytes:
        return sse.event(
            {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]}
        )

    for index in range(generation.num_choices):
        yield chunk(index, {"role": "assistant", "content": ""}, None, None)
    async for event in generation.outputs():
        index = event.choice
        stream = streams.get(index)
        if isinstance(event, FinalEvent):
            reason = finish_reason(event)
            if stream is not None:
                for delta in stream.finish():
                    yield chunk(index, delta, None, None)
                reason = tool_calls.finish_reason(reason, stream.calls > 0, tool_choice)
            yield chunk(index, {}, None, reason)
            continue
        logprobs = chat_logprobs([event], k) if request.logprobs else None
        if stream is None:
            if logprobs is not None or event.text:
                yield chunk(index, {"content": event.text}, logprobs, None)
            continue
        deltas = stream.feed(event.text)
        if not deltas and logprobs is not None:
            yield chunk(index, {}, logprobs, None)
        for position, delta in enumerate(deltas):
            yield chunk(index, delta, logprobs if position == 0 else None, None)
    if request.include_usage:
        yield sse.event({**head, "choices": [], "usage": usage(generation)})
    yield sse.DONE


class RouteParts(NamedTuple):
    """What differs between the generation routes: the stream, the JSON payload, the input size the timing
    headers report, and each prompt's GenerationRequest fields (the prompt or the messages; several for a
    batch of completion prompts)."""

    chunks: Callable[[Generation | GenerationBatch], AsyncIterator[bytes]]
    payload: Callable[[Generation | GenerationBatch], dict]
    input_chars: int
    request_fields: list[dict]


async def completion_route(body: CompletionRequest, backend: LlmBackend, model: ModelInfo) -> RouteParts:
    """Text prompts, or token ids (echoed as the model's tokenizer decodes them)."""
    texts, fields = [], []
    for prompt in body.prompt_inputs():
        if isinstance(prompt, str):
            texts.append(prompt)
            fields.append({"prompt": prompt})
        else:
            texts.append(await backend.detokenize(model.name, prompt) if body.echo else "")
            fields.append({"prompt_token_ids": prompt})
    return RouteParts(
        lambda batch: completion_chunks(batch, body, texts),
        lambda batch: completion_payload(batch, body, texts),
        sum(len(t) for t in texts),
        fields,
    )


def _content_chars(message) -> int:
    content = message.get("content") if isinstance(message, dict) else message.content
    return len(content) if isinstance(content, str) else 0


async def chat_route(body: ChatCompletionRequest, backend: LlmBackend, model: ModelInfo) -> RouteParts:
    del backend, model  # the messages cross as they are: the worker applies the chat template
    messages = body.chat_messages()
    return RouteParts(
        lambda gen: chat_chunks(gen, body),
        lambda gen: chat_payload(gen, body),
        sum(_content_chars(m) for m in messages),
        [{"messages": messages, "tools": body.tools, "chat_template_kwargs": body.chat_template_kwargs}],
    )


def build_openai_router(backend: LlmBackend, keep_alive_s: float = 15.0) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["OpenAI"])
    started = int(time.time())

    async def generate(request: Request, schema, route: Callable[..., Awaitable[RouteParts]], batch: bool):
        """Checks the body of `request` as `schema`, starts its generation and answers it: SSE chunks when
        streamed, else the JSON payload with the timing headers. `route(body, backend, model)` gives what
        differs per route; `batch`: the route answers a GenerationBatch (one Generation per prompt)."""
        arrival = time.perf_counter()
        body = parse_body(await request.body(), schema, UNKNOWN_FIELD)
        body.check()
        model = served_model(backend, body.model)
        chunks, payload, input_chars, prompts = await route(body, backend, model)
        params = body.generation_params()
        request_id = new_request_id()
        ids = [request_id] + [f"{request_id}-{n}" for n in range(1, len(prompts))]
        items = [
            Generation(
                backend,
                GenerationRequest(model=model.name, request_id=rid, params=params, **fields),
                model,
                PROTOCOL.value,
                arrival,
            )
            for rid, fields in zip(ids, prompts)
        ]
        generation = GenerationBatch(items) if batch else items[0]
        if body.stream:
            return stream_reply(
                generation, PROTOCOL, lambda: chunks(generation), error_chunks, keep_alive_s=keep_alive_s
            )
        return json_reply(generation, PROTOCOL, lambda gen: (payload(gen), gen.timing_headers(input_chars)))

    @router.get("/models", summary="The served language models (OpenAI)")
    @guarded(PROTOCOL)
    async def list_models():
        return {"object": "list", "data": [model_card(m, started) for m in backend.models()]}

    @router.get("/models/{model}", summary="One served language model (OpenAI)")
    @guarded(PROTOCOL)
    async def retrieve_model(model: str):
        return model_card(served_model(backend, model), started)

    @router.post("/completions", summary="Text completion (OpenAI)")
    @guarded(PROTOCOL)
    async def completions(request: Request):
        return await generate(request, CompletionRequest, completion_route, batch=True)

    @router.post("/chat/completions", summary="Chat completion (OpenAI)")
    @guarded(PROTOCOL)
    async def chat_completions(request: Request):
        return await generate(request, ChatCompletionRequest, chat_route, batch=False)

    return router
