"""HuggingFace text-generation-inference's API: `POST /generate`, `POST /generate_stream`, `POST /`
(TGI's compat route: `stream` chooses, and a non-streamed reply is a one-element list), `GET /info` and
`GET /health`. The model is the server's default model (TGI serves one).

Replies: `{"generated_text", "details"?}`; details (`details` or `decoder_input_details`) hold finish_reason,
generated_tokens, seed, `prefill` (the scored prompt when decoder_input_details), `tokens`, `top_tokens`
(top_n_tokens > 0) and, with best_of > 1, `best_of_sequences`: the candidates the reply did not keep (TGI keeps
the one of highest mean token logprob).

Streams: one event per token, `{"index", "token": {id, text, logprob, special}, "top_tokens"?: [...],
"generated_text": null, "details": null}`; the last event carries `generated_text` and, when asked for,
`details`. TGI's last event carries the last token; the engine reports the end after the last token, so the
last token is held back only when it is known to be the last (it reaches max_new_tokens); otherwise the last
event carries an empty special token. Errors: `{"error", "error_type"}` (see errors.py).
"""

import time
from collections.abc import AsyncIterator, Sequence

from fastapi import APIRouter, Request
from starlette.responses import Response

import mindspore_serving
from mindspore_serving.frontends.errors import Protocol, http_error
from mindspore_serving.frontends.llm import sse
from mindspore_serving.frontends.llm.generation import Generation, finite
from mindspore_serving.frontends.llm.params import new_request_id, parse_body, served_model
from mindspore_serving.frontends.llm.responses import guarded, json_reply, stream_reply
from mindspore_serving.frontends.llm.schemas_tgi import MAX_BEST_OF, MAX_STOP_SEQUENCES, TgiRequest
from mindspore_serving.master.llm_types import FinalEvent, GenerationRequest, LlmBackend, PromptEvent, TokenEvent

FINISH_REASONS = {
    "eos": "eos_token",
    "stop": "stop_sequence",
    "length": "length",
    "grammar": "eos_token",
}  # TGI's grammars end with the end-of-sequence token
PROTOCOL = Protocol.TGI

Candidate = tuple[list[TokenEvent], FinalEvent]
"""One generated sequence: its tokens and its FinalEvent."""


def token_json(token: TokenEvent) -> dict:
    return {"id": token.token_id, "text": token.text, "logprob": finite(token.logprob), "special": token.special}


def top_tokens_json(token: TokenEvent) -> list[dict]:
    """TGI's `top_tokens` at one position. Only the chosen token is known to be special or not; its
    alternatives are reported as ordinary tokens."""
    return [
        {
            "id": top.token_id,
            "text": top.text,
            "logprob": finite(top.logprob),
            "special": token.special and top.token_id == token.token_id,
        }
        for top in token.top_logprobs
    ]


def prefill_json(prompt: PromptEvent | None) -> list[dict]:
    """TGI's `prefill`: the prompt's tokens with their logprobs (null for the first, which has none)."""
    if prompt is None:
        return []
    return [
        {"id": t.token_id, "text": t.text, "logprob": None if t.logprob is None else finite(t.logprob)}
        for t in prompt.tokens
    ]


def candidates(generation: Generation) -> list[Candidate]:
    """The generated sequences (one per choice), in choice order."""
    finals = generation.finals
    return [(generation.choice_tokens(choice), finals[choice]) for choice in sorted(finals)]


def best_index(sequences: Sequence[Candidate]) -> int:
    """TGI's choice among best_of candidates: the highest mean logprob of the generated tokens (first on ties)."""

    def mean(tokens: list[TokenEvent]) -> float:
        return sum(t.logprob for t in tokens) / len(tokens) if tokens else float("-inf")

    return max(range(len(sequences)), key=lambda i: (mean(sequences[i][0]), -i))


def _output_text(final: FinalEvent, request: TgiRequest, full_text_default: bool) -> str:
    full = request.parameters.return_full_text
    if full if full is not None else full_text_default:
        return request.inputs + final.text
    return final.text


def _sequence_details(sequence: Candidate, request: TgiRequest, prefill: list[dict]) -> dict:
    tokens, final = sequence
    details = {
        "finish_reason": FINISH_REASONS.get(final.finish_reason, final.finish_reason),
        "generated_tokens": final.completion_tokens,
        "seed": request.parameters.seed,
        "prefill": prefill,
        "tokens": [token_json(t) for t in tokens],
    }
    if request.parameters.top_n_tokens:
        details["top_tokens"] = [top_tokens_json(t) for t in tokens]
    return details


def generate_payload(generation: Generation, request: TgiRequest, full_text_default: bool = False) -> tuple[dict, int]:
    """(`{"generated_text", "details"?}`, the tokens it generated); with best_of > 1 the candidate TGI would keep,
    and the others in `details.best_of_sequences`."""
    sequences = candidates(generation)
    best = best_index(sequences)
    payload = {"generated_text": _output_text(sequences[best][1], request, full_text_default)}
    params = request.parameters
    if params.details or params.decoder_input_details:
        prefill = prefill_json(generation.prompt_scores) if params.decoder_input_details else []
        details = _sequence_details(sequences[best], request, prefill)
        top_tokens = details.pop("top_tokens", None)
        if len(sequences) > 1:
            details["best_of_sequences"] = [
                {
                    "generated_text": _output_text(sequence[1], request, full_text_default),
                    **_sequence_details(sequence, request, prefill),
                }
                for i, sequence in enumerate(sequences)
                if i != best
            ]
        if top_tokens is not None:
            details["top_tokens"] = top_tokens
        payload["details"] = details
    return payload, sequences[best][1].completion_tokens


def _is_last(generation: Generation, token: TokenEvent) -> bool:
    limit = generation.max_new_tokens
    return limit is not None and token.index + 1 >= limit


async def stream_events(
    generation: Generation, request: TgiRequest, full_text_default: bool = False
) -> AsyncIterator[bytes]:
    top_n = request.parameters.top_n_tokens

    def token_json_with_top(token: TokenEvent) -> dict:
        event = {"index": token.index + 1, "token": token_json(token)}
        if top_n:
            event["top_tokens"] = top_tokens_json(token)
        return event

    def token_event(token: TokenEvent) -> bytes:
        return sse.event({**token_json_with_top(token), "generated_text": None, "details": None})

    held: TokenEvent | None = None
    try:
        async for token in generation.events():
            if held is not None:
                yield token_event(held)
                held = None
            if _is_last(generation, token):
                held = token
            else:
                yield token_event(token)
    except Exception:
        if held is not None:
            yield token_event(held)
        raise
    final = generation.final
    if held is not None:
        last = token_json_with_top(held)
    else:
        last = {
            "index": len(generation.tokens) + 1,
            "token": {"id": final.token_ids[-1] if final.token_ids else 0, "text": "", "logprob": 0.0, "special": True},
        }
    details = None
    if request.parameters.details:
        details = {
            "finish_reason": FINISH_REASONS.get(final.finish_reason, final.finish_reason),
            "generated_tokens": final.completion_tokens,
            "seed": request.parameters.seed,
            "input_length": final.prompt_tokens,
        }
    yield sse.event({**last, "generated_text": _output_text(final, request, full_text_default), "details": details})


def error_event(exc: BaseException) -> bytes:
    return sse.event(http_error(PROTOCOL, exc)[1])


def info_payload(backend: LlmBackend, default_model: str | None) -> dict:
    model = served_model(backend, default_model)
    return {
        "model_id": model.name,
        "model_sha": None,
        "model_dtype": None,
        "model_device_type": model.device.lower(),
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": model.max_num_seqs + model.max_queue_size,
        "max_best_of": MAX_BEST_OF,
        "max_stop_sequences": MAX_STOP_SEQUENCES,
        "max_input_tokens": model.max_model_len - 1,
        "max_input_length": model.max_model_len - 1,
        "max_total_tokens": model.max_model_len,
        "max_batch_size": model.max_num_seqs,
        "max_client_batch_size": 1,
        "vocab_size": model.vocab_size,
        "router": "mindspore-serving",
        "version": mindspore_serving.__version__,
        "sha": None,
        "docker_label": None,
    }


def build_tgi_router(
    backend: LlmBackend, default_model: str | None = None, keep_alive_s: float = 15.0, health_route: bool = True
) -> APIRouter:
    router = APIRouter(tags=["TGI"])

    def start(request: TgiRequest, arrival: float) -> Generation:
        model = served_model(backend, default_model)
        gen_request = GenerationRequest(
            model=model.name,
            prompt=request.inputs,
            params=request.parameters.engine_params(),
            request_id=new_request_id(),
        )
        return Generation(backend, gen_request, model, PROTOCOL.value, arrival)

    def generate_response(request: TgiRequest, arrival: float, compat: bool) -> Response:
        generation = start(request, arrival)

        def build(gen: Generation):
            payload, generated = generate_payload(gen, request, full_text_default=compat)
            headers = gen.timing_headers(len(request.inputs))
            headers["x-generated-tokens"] = str(generated)  # the kept candidate's, as TGI
            return ([payload] if compat else payload), headers

        return json_reply(generation, PROTOCOL, build)

    def stream_response(request: TgiRequest, arrival: float, compat: bool) -> Response:
        request.check_stream()
        generation = start(request, arrival)
        headers = {"x-compute-type": generation.model.device.lower(), "x-compute-characters": str(len(request.inputs))}
        return stream_reply(
            generation,
            PROTOCOL,
            lambda: stream_events(generation, request, compat),
            error_event,
            headers,
            keep_alive_s=keep_alive_s,
        )

    @router.post("/generate", summary="Generate tokens (TGI)")
    @guarded(PROTOCOL)
    async def generate(request: Request):
        """Body `{"inputs": str, "parameters": {...}}`; reply `{"generated_text", "details"?}` with TGI's
        x-* timing headers."""
        arrival = time.perf_counter()
        return generate_response(parse_body(await request.body(), TgiRequest), arrival, compat=False)

    @router.post("/generate_stream", summary="Generate a stream of tokens with server-sent events (TGI)")
    @guarded(PROTOCOL)
    async def generate_stream(request: Request):
        arrival = time.perf_counter()
        return stream_response(parse_body(await request.body(), TgiRequest), arrival, compat=False)

    @router.post("/", summary="Generate tokens, streamed when `stream` is true (TGI compat route)")
    @guarded(PROTOCOL)
    async def compat_generate(request: Request):
        """As /generate (reply wrapped in a one-element list) or /generate_stream; `return_full_text` defaults
        to true here, as TGI does for text-generation models."""
        arrival = time.perf_counter()
        body = parse_body(await request.body(), TgiRequest)
        if body.stream:
            return stream_response(body, arrival, compat=True)
        return generate_response(body, arrival, compat=True)

    @router.get("/info", summary="Served model info (TGI)")
    @guarded(PROTOCOL)
    async def info():
        return info_payload(backend, default_model)

    if health_route:

        @router.get("/health", summary="Health of the language model (TGI): 200, or 503 when none is up")
        async def health():
            if backend.models():
                return Response(status_code=200)
            status, payload = 503, {"error": "unhealthy", "error_type": "healthcheck"}
            return Response(sse.dumps(payload), status_code=status, media_type=sse.JSON_MEDIA_TYPE)

    return router
