"""HTTP front ends of the LLM servables, on top of the master's `LlmBackend` (master/llm_types.py).

    tgi.py            HuggingFace TGI: /generate, /generate_stream, / (compat), /info, /health
    mindspore_llm.py  MindSpore LLM-serving: /models/{model}[/generate|/generate_stream];
                      classic /model/{model}:generate_stream (mindspore_generate_stream)
    openai_api.py     OpenAI: /v1/completions, /v1/chat/completions, /v1/models
    tokenize_api.py   vLLM: /tokenize, /detokenize (the model's tokenizer and chat template)
    schemas_*.py      request bodies and their mapping to engine parameters
    params.py         what every protocol does first: parse the body, pick the model, check sampling parameters
    output_constraints.py  the request fields that constrain the output to a grammar, as one engine constraint
    tool_calls.py     OpenAI tool calling: tools and tool_choice checked, the calls read out of the output
    generation.py     one request's run: first event, timing, close (aborts), INFO log line
    responses.py      JSON / SSE responses that watch for client disconnects
    sse.py            SSE framing
    testing.py        FakeLlmBackend for tests

Errors become each protocol's HTTP answer in ../errors.py.

Usage::

    app.include_router(build_llm_router(backend))
"""

from fastapi import APIRouter

from mindspore_serving.frontends.llm.mindspore_llm import build_llm_serving_router, mindspore_generate_stream
from mindspore_serving.frontends.llm.openai_api import build_openai_router
from mindspore_serving.frontends.llm.tgi import build_tgi_router
from mindspore_serving.frontends.llm.tokenize_api import build_tokenize_router
from mindspore_serving.master.llm_types import LlmBackend

__all__ = ["build_llm_router", "mindspore_generate_stream"]


def build_llm_router(
    backend: LlmBackend, default_model: str | None = None, keep_alive_s: float = 15.0, health_route: bool = True
) -> APIRouter:
    """All LLM routes on one router.

    default_model: the model of TGI's routes (which name none); None: the only language model served.
    keep_alive_s: seconds between SSE keep-alive comments on an idle stream (0: none).
    health_route: serve TGI's `GET /health` (200 while a language model is up, else 503).
    """
    router = APIRouter()
    router.include_router(build_openai_router(backend, keep_alive_s))
    router.include_router(build_tokenize_router(backend))
    router.include_router(build_llm_serving_router(backend, keep_alive_s))
    router.include_router(build_tgi_router(backend, default_model, keep_alive_s, health_route))
    return router
