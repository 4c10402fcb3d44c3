"""MindSpore's own LLM protocols.

1. MindSpore LLM-serving (`mindspore-ai/llm-serving`): `POST /models/{model}` (`stream` chooses),
   `POST /models/{model}/generate` and `POST /models/{model}/generate_stream`, body
   `{"inputs", "parameters": {do_sample, top_k, top_p, temperature, repetition_penalty, max_new_tokens,
   return_full_text, return_protocol, seed, stop, ...}, "stream"}`. Replies keep the reference's fields;
   its bugs are fixed: repetition_penalty, seed and stop take effect, each stream event is well-formed SSE
   (`data: {...}` per token, with `retry` sent as an SSE field instead of inside the data), and the stream
   always ends with a final event (finish_reason, full text, all tokens). `return_protocol: "raw"` streams
   `data:{json}` lines instead of SSE. Errors use TGI's shape and statuses, as the reference copies TGI.
   The engine's sampling fields are taken too (schemas_tgi.LlmServingParameters); `top_n_tokens` (or
   `top_logprobs`) fills `top_tokens` with the most likely tokens of each position and
   `decoder_input_details` fills `prefill` with the scored prompt (the final event's, when streamed).

2. MindSpore Serving's classic RESTful grammar, streamed: `POST /model/{model}:generate_stream` with
   `{"instances": [{"prompt" or "inputs": str, <SamplingParams fields>}]}` (n and best_of 1: the reply is one
   text). The classic ASGI handler owns that URL, so this module provides
   `mindspore_generate_stream(backend, model, body)` for it to call.
   Events: `data: {"index": i, "token": {"id", "text", "logprob", "special", "top_logprobs"?}}` per token, then
   `data: {"generated_text", "finish_reason", "token_ids", "details": {...}, "prompt_logprobs"?}`
   (top_logprobs and prompt_logprobs when asked). Errors are the classic
   `{"error_msg": ...}` (HTTP 200, as the classic route always answers), or a `data: {"error_msg"}` event.
"""

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import Response

from mindspore_serving.common.errors import InvalidParam
from mindspore_serving.frontends.errors import Protocol, http_error
from mindspore_serving.frontends.llm import sse
from mindspore_serving.frontends.llm.generation import Generation, finite
from mindspore_serving.frontends.llm.params import load_json, new_request_id, parse_body, sampling_params, served_model
from mindspore_serving.frontends.llm.responses import error_response, guarded, json_reply, stream_reply
from mindspore_serving.frontends.llm.schemas_tgi import LlmServingRequest
from mindspore_serving.frontends.llm.tgi import prefill_json, token_json, top_tokens_json
from mindspore_serving.llm.instance_params import check_one_choice
from mindspore_serving.master.llm_types import GenerationRequest, LlmBackend, PromptEvent

LLM_SERVING = Protocol.TGI
"""LLM-serving copies TGI's API, errors included."""
CLASSIC = Protocol.MINDSPORE
RETRY_MS = 30000


def _top_logprobs(tops) -> list[dict]:
    """The most likely tokens at a position as the classic route writes them (id, text, logprob)."""
    return [{"id": t.token_id, "text": t.text, "logprob": finite(t.logprob)} for t in tops]


def _prompt_tokens(prompt: PromptEvent | None, top: bool = False) -> list[dict]:
    """The scored prompt as TGI's `prefill` (id, text, logprob: null for the first token), with `top` each token's
    top_logprobs too."""
    tokens = prefill_json(prompt)
    if top:
        for item, token in zip(tokens, prompt.tokens):
            item["top_logprobs"] = _top_logprobs(token.top_logprobs)
    return tokens


def _text(generation: Generation, request: LlmServingRequest) -> str:
    if request.parameters.return_full_text:
        return request.inputs + generation.final.text
    return generation.final.text


def full_payload(generation: Generation, request: LlmServingRequest) -> dict:
    """The reference's reply. Its `prefill` ([first token]) and `top_tokens` ([[first token]]) hold what they
    name when asked: the scored prompt (decoder_input_details), the most likely tokens per position
    (top_n_tokens)."""
    params = request.parameters
    tokens = [token_json(t) for t in generation.tokens]
    final = generation.final
    prefill = _prompt_tokens(generation.prompt_scores) if params.decoder_input_details else tokens[:1]
    top_tokens = [top_tokens_json(t) for t in generation.tokens] if params.top_tokens else [tokens[:1]]
    return {
        "generated_text": _text(generation, request),
        "finish_reason": final.finish_reason,
        "generated_tokens": final.completion_tokens,
        "prefill": prefill,
        "seed": params.seed or 0,
        "tokens": tokens,
        "top_tokens": top_tokens,
        "details": None,
    }


async def llm_serving_events(generation: Generation, request: LlmServingRequest) -> AsyncIterator[bytes]:
    raw = request.parameters.return_protocol == "raw"
    encode = sse.raw_line if raw else sse.event
    if not raw:
        yield sse.retry(RETRY_MS)
    params = request.parameters
    async for token in generation.events():
        item = token_json(token)
        yield encode(
            {
                "details": None,
                "generated_text": token.text,
                "tokens": item,
                "top_tokens": top_tokens_json(token) if params.top_tokens else [item],
            }
        )
    final = generation.final
    last = {
        "details": None,
        "generated_text": _text(generation, request),
        "finish_reason": final.finish_reason,
        "generated_tokens": final.completion_tokens,
        "tokens": [token_json(t) for t in generation.tokens],
    }
    if params.decoder_input_details:
        last["prefill"] = _prompt_tokens(generation.prompt_scores)
    yield encode(last)


def build_llm_serving_router(backend: LlmBackend, keep_alive_s: float = 15.0) -> APIRouter:
    router = APIRouter(tags=["MindSpore LLM-serving"])

    def start(model: str, request: LlmServingRequest, arrival: float) -> Generation:
        info = served_model(backend, model)
        gen_request = GenerationRequest(
            model=info.name,
            prompt=request.inputs,
            params=request.parameters.engine_params(),
            request_id=new_request_id(),
        )
        return Generation(backend, gen_request, info, "llm-serving", arrival)

    def full(model: str, request: LlmServingRequest, arrival: float) -> Response:
        generation = start(model, request, arrival)
        return json_reply(
            generation, LLM_SERVING, lambda gen: (full_payload(gen, request), gen.timing_headers(len(request.inputs)))
        )

    def streamed(model: str, request: LlmServingRequest, arrival: float) -> Response:
        generation = start(model, request, arrival)
        raw = request.parameters.return_protocol == "raw"
        encode = sse.raw_line if raw else sse.event
        return stream_reply(
            generation,
            LLM_SERVING,
            lambda: llm_serving_events(generation, request),
            lambda exc: encode(http_error(LLM_SERVING, exc)[1]),
            media_type=sse.RAW_MEDIA_TYPE if raw else sse.SSE_MEDIA_TYPE,
            keep_alive_s=0.0 if raw else keep_alive_s,
        )

    @router.post("/models/{model}", summary="Generate; streamed when `stream` is true (MindSpore LLM-serving)")
    @guarded(LLM_SERVING)
    async def generate_any(model: str, request: Request):
        arrival = time.perf_counter()
        body = parse_body(await request.body(), LlmServingRequest)
        return (streamed if body.stream else full)(model, body, arrival)

    @router.post("/models/{model}/generate", summary="Generate the whole text (MindSpore LLM-serving)")
    @guarded(LLM_SERVING)
    async def generate(model: str, request: Request):
        arrival = time.perf_counter()
        return full(model, parse_body(await request.body(), LlmServingRequest), arrival)

    @router.post("/models/{model}/generate_stream", summary="Generate a token stream (MindSpore LLM-serving)")
    @guarded(LLM_SERVING)
    async def generate_stream(model: str, request: Request):
        arrival = time.perf_counter()
        return streamed(model, parse_body(await request.body(), LlmServingRequest), arrival)

    return router


# MindSpore Serving classic: /model/{model}:generate_stream


def _classic_request(model: str, body: bytes | dict) -> GenerationRequest:
    data = load_json(bytes(body)) if isinstance(body, (bytes, bytearray)) else body
    instances = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(instances, list) or len(instances) != 1 or not isinstance(instances[0], dict):
        raise InvalidParam(
            'the body must be {"instances": [{"prompt": str, <sampling parameters>}]} with exactly one instance'
        )
    fields = dict(instances[0])
    prompts = [key for key in ("prompt", "inputs") if key in fields]
    if len(prompts) != 1:
        raise InvalidParam("the instance needs exactly one of 'prompt' or 'inputs'")
    prompt = fields.pop(prompts[0])
    if not isinstance(prompt, str) or not prompt:
        raise InvalidParam(f"'{prompts[0]}' must be a non-empty string")
    params = sampling_params(**fields)
    check_one_choice(params)
    return GenerationRequest(model=model, prompt=prompt, params=params, request_id=new_request_id())


async def classic_events(generation: Generation) -> AsyncIterator[bytes]:
    params = generation.request.params
    async for token in generation.events():
        item = token_json(token)
        if params.get("top_logprobs"):
            item["top_logprobs"] = _top_logprobs(token.top_logprobs)
        yield sse.event({"index": token.index, "token": item})
    final = generation.final
    timings = generation.timings()
    engine = final.timing
    last = {
        "generated_text": final.text,
        "finish_reason": final.finish_reason,
        "token_ids": list(final.token_ids),
        "details": {
            "prompt_tokens": final.prompt_tokens,
            "completion_tokens": final.completion_tokens,
            "queue_time": engine.queue_time if engine else None,
            "time_to_first_token": engine.time_to_first_token if engine else timings["time_to_first_token"],
            "inter_token_latency": engine.inter_token_latency if engine else timings["inter_token_latency"],
            "e2e_latency": engine.e2e_latency if engine else timings["e2e_latency"],
        },
    }
    if params.get("prompt_logprobs") is not None:
        last["prompt_logprobs"] = _prompt_tokens(generation.prompt_scores, top=params["prompt_logprobs"] > 0)
    yield sse.event(last)


async def mindspore_generate_stream(
    backend: LlmBackend, model: str, body: bytes | dict, keep_alive_s: float = 15.0
) -> Response:
    """The reply of `POST /model/{model}:generate_stream`: an ASGI response (`await reply(scope, receive, send)`)
    that streams SSE; it aborts the generation when the client disconnects."""
    arrival = time.perf_counter()
    try:
        request = _classic_request(model, body)
        generation = Generation(backend, request, served_model(backend, model), "mindspore", arrival)
    except Exception as exc:  # the classic error reply, whatever failed
        return error_response(CLASSIC, exc)
    return stream_reply(
        generation,
        CLASSIC,
        lambda: classic_events(generation),
        lambda exc: sse.event(http_error(CLASSIC, exc)[1]),
        keep_alive_s=keep_alive_s,
    )
