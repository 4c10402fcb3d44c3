"""OpenAI's API: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models[/{model}]`.

One choice per request (n=1). Streams are SSE chunks (`text_completion` / `chat.completion.chunk`) ending
with `data: [DONE]`; with `stream_options.include_usage` every chunk has `"usage": null` and a last chunk
with no choices carries the usage. An error in the middle of a stream is sent as `data: {"error": {...}}`
followed by `data: [DONE]`. Chat messages go to the backend, which applies the model's chat template.
"""
import time
from typing import AsyncIterator, Callable, List, NamedTuple, Optional

from fastapi import APIRouter, Request

from mindspore_serving.frontends.llm import sse
from mindspore_serving.master.llm_types import GenerationRequest, LlmBackend, ModelInfo, TokenEvent
from mindspore_serving.frontends.errors import Protocol, http_error
from mindspore_serving.frontends.llm.generation import Generation, finite
from mindspore_serving.frontends.llm.params import new_request_id, parse_body, served_model
from mindspore_serving.frontends.llm.responses import guarded, json_reply, stream_reply
from mindspore_serving.frontends.llm.schemas_openai import UNKNOWN_FIELD, ChatCompletionRequest, CompletionRequest

PROTOCOL = Protocol.OPENAI
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
OWNER = "mindspore-serving"
LOGPROB_FLOOR = -9999.0
"""Stands for a log-probability of -inf, which JSON cannot carry."""


def finish_reason(generation: Generation) -> str:
    reason = generation.final.finish_reason
    return FINISH_REASONS.get(reason, reason)


def usage(generation: Generation) -> dict:
    final = generation.final
    return {"prompt_tokens": final.prompt_tokens, "completion_tokens": final.completion_tokens,
            "total_tokens": final.prompt_tokens + final.completion_tokens}


def model_card(model: ModelInfo, created: int) -> dict:
    return {"id": model.name, "object": "model", "created": created, "owned_by": OWNER,
            "max_model_len": model.max_model_len}


def error_chunks(exc: BaseException) -> bytes:
    return sse.event(http_error(PROTOCOL, exc)[1]) + sse.DONE


def _logprob(token: TokenEvent) -> float:
    return finite(token.logprob, LOGPROB_FLOOR)


# /v1/completions

def completion_logprobs(tokens: List[TokenEvent], offset: int) -> dict:
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.text)
    return {"tokens": [t.text for t in tokens], "token_logprobs": [_logprob(t) for t in tokens],
            "top_logprobs": None, "text_offset": offsets}


def completion_payload(generation: Generation, request: CompletionRequest, prompt: str) -> dict:
    prefix = prompt if request.echo else ""
    logprobs = None
    if request.logprobs is not None:
        logprobs = completion_logprobs(generation.tokens, len(prefix))
    return {"id": f"cmpl-{generation.request_id}", "object": "text_completion", "created": generation.created,
            "model": generation.model.name,
            "choices": [{"index": 0, "text": prefix + generation.final.text, "logprobs": logprobs,
                         "finish_reason": finish_reason(generation)}],
            "usage": usage(generation)}


async def completion_chunks(generation: Generation, request: CompletionRequest,
                            prompt: str) -> AsyncIterator[bytes]:
    head = {"id": f"cmpl-{generation.request_id}", "object": "text_completion", "created": generation.created,
            "model": generation.model.name}
    if request.include_usage:
        head["usage"] = None

    def chunk(text: str, logprobs, reason: Optional[str]) -> bytes:
        return sse.event({**head, "choices": [{"index": 0, "text": text, "logprobs": logprobs,
                                               "finish_reason": reason}]})

    offset = 0
    if request.echo:
        yield chunk(prompt, None, None)
        offset = len(prompt)
    async for token in generation.events():
        if request.logprobs is not None:
            yield chunk(token.text, completion_logprobs([token], offset), None)
        elif token.text:
            yield chunk(token.text, None, None)
        offset += len(token.text)
    yield chunk("", None, finish_reason(generation))
    if request.include_usage:
        yield sse.event({**head, "choices": [], "usage": usage(generation)})
    yield sse.DONE


# /v1/chat/completions

def chat_logprobs(tokens: List[TokenEvent]) -> dict:
    return {"content": [{"token": t.text, "logprob": _logprob(t), "bytes": list(t.text.encode("utf-8")),
                         "top_logprobs": []} for t in tokens]}


def chat_payload(generation: Generation, request: ChatCompletionRequest) -> dict:
    return {"id": f"chatcmpl-{generation.request_id}", "object": "chat.completion", "created": generation.created,
            "model": generation.model.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": generation.final.text},
                         "logprobs": chat_logprobs(generation.tokens) if request.logprobs else None,
                         "finish_reason": finish_reason(generation)}],
            "usage": usage(generation)}


async def chat_chunks(generation: Generation, request: ChatCompletionRequest) -> AsyncIterator[bytes]:
    head = {"id": f"chatcmpl-{generation.request_id}", "object": "chat.completion.chunk",
            "created": generation.created, "model": generation.model.name}
    if request.include_usage:
        head["usage"] = None

    def chunk(delta: dict, logprobs, reason: Optional[str]) -> bytes:
        return sse.event({**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                               "finish_reason": reason}]})

    yield chunk({"role": "assistant", "content": ""}, None, None)
    async for token in generation.events():
        if request.logprobs:
            yield chunk({"content": token.text}, chat_logprobs([token]), None)
        elif token.text:
            yield chunk({"content": token.text}, None, None)
    yield chunk({}, None, finish_reason(generation))
    if request.include_usage:
        yield sse.event({**head, "choices": [], "usage": usage(generation)})
    yield sse.DONE


class RouteParts(NamedTuple):
    """What differs between the generation routes: the stream, the JSON payload, the input size the timing
    headers report, and the prompt or the messages of the GenerationRequest."""
    chunks: Callable[[Generation], AsyncIterator[bytes]]
    payload: Callable[[Generation], dict]
    input_chars: int
    request_fields: dict


def completion_route(body: CompletionRequest) -> RouteParts:
    prompt = body.prompt_text()
    return RouteParts(lambda gen: completion_chunks(gen, body, prompt),
                      lambda gen: completion_payload(gen, body, prompt), len(prompt), {"prompt": prompt})


def chat_route(body: ChatCompletionRequest) -> RouteParts:
    messages = body.chat_messages()
    return RouteParts(lambda gen: chat_chunks(gen, body), lambda gen: chat_payload(gen, body),
                      sum(len(m.content) for m in messages), {"messages": messages})


def build_openai_router(backend: LlmBackend, keep_alive_s: float = 15.0) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["OpenAI"])
    started = int(time.time())

    async def generate(request: Request, schema, route: Callable[..., RouteParts]):
        """Checks the body of `request` as `schema`, starts its generation and answers it: SSE chunks when
        streamed, else the JSON payload with the timing headers. `route(body)` gives what differs per route."""
        arrival = time.perf_counter()
        body = parse_body(await request.body(), schema, UNKNOWN_FIELD)
        body.check()
        chunks, payload, input_chars, request_fields = route(body)
        model = served_model(backend, body.model)
        gen_request = GenerationRequest(model=model.name, request_id=new_request_id(),
                                        params=body.engine_params(body.max_new_tokens()), **request_fields)
        generation = Generation(backend, gen_request, model, PROTOCOL.value, arrival)
        if body.stream:
            return stream_reply(generation, PROTOCOL, lambda: chunks(generation), error_chunks,
                                keep_alive_s=keep_alive_s)
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
        return await generate(request, CompletionRequest, completion_route)

    @router.post("/chat/completions", summary="Chat completion (OpenAI)")
    @guarded(PROTOCOL)
    async def chat_completions(request: Request):
        return await generate(request, ChatCompletionRequest, chat_route)

    return router
