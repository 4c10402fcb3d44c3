"""What the LLM front ends (MindSpore Serving, MindSpore LLM-serving, TGI and OpenAI protocols) need from the
serving system: a list of models, a stream of generation events per request, and the model's tokenizer
(/tokenize, /detokenize).

The master implements it by forwarding to the LLM servable's worker; tests implement it with fakes.
Errors are `mindspore_serving.common.errors.ServingError` subclasses:
- `InvalidInputs`: bad request (HTTP 400/422, protocol-specific error shapes);
- `Overloaded`: too many requests queued (HTTP 429, gRPC RESOURCE_EXHAUSTED);
- `ServableUnavailable`: a model this server does not serve (HTTP 404);
- `WorkerUnavailable`: a model it serves that is down for now (worker or agent dead, restarting: HTTP 503 with
  Retry-After, gRPC UNAVAILABLE);
- any other `ServingError` (a generation failure): HTTP 424 in the TGI and LLM-serving protocols, 500 in OpenAI's;
- any other exception: HTTP 500 (MindSpore Serving's protocol answers 200 with an error message for both).
`frontends/errors.py` holds the full map per protocol.
Cancelling the consuming task (e.g. the HTTP client went away) must abort the request in the engine.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from mindspore_serving.common import errors

# the events are the LLM worker session's messages as the master reads them
from mindspore_serving.ipc.llm_session import (  # noqa: F401  # noqa: F401
    FinalEvent,
    GenerationEvent,
    PromptEvent,
    PromptToken,
    Timing,
    TokenEvent,
    Tokenized,
    TokenizeRequest,
    TopLogprob,
)

Overloaded = errors.Overloaded  # the engine's queue is full; retry later


@dataclass
class ChatMessage:
    role: str
    content: str


@dataclass
class GenerationRequest:
    model: str
    """The servable name, e.g. "llama_tiny"."""
    prompt: str | None = None
    """Text prompt; exactly one of prompt / messages is set."""
    messages: list[ChatMessage] | None = None
    """Chat messages; the model's chat template (LLM configuration) turns them into a prompt."""
    params: dict[str, object] = field(default_factory=dict)
    """SamplingParams fields (llm/sampling_params.py): max_new_tokens, temperature (0 = greedy), top_k, top_p, ...,
    n, best_of, prompt_logprobs, structured_output."""
    request_id: str | None = None
    tools: list[dict] | None = None
    """Tool definitions for the chat template (OpenAI's `tools`)."""
    chat_template_kwargs: dict[str, object] | None = None
    """More variables for the chat template."""
    prompt_token_ids: list[int] | None = None
    """A prompt given as token ids (then `prompt` and `messages` are None)."""


@dataclass
class ModelInfo:
    name: str
    max_model_len: int
    max_num_seqs: int
    max_queue_size: int
    vocab_size: int
    device: str = "CPU"
    tool_call_parser: str | None = None
    """The format the model writes tool calls in (llm/tool_call_formats.py), or None: no calls are read."""


class LlmBackend(Protocol):
    def models(self) -> list[ModelInfo]:
        """The LLM servables being served (empty while none is up)."""
        ...

    def unavailable_models(self) -> dict[str, str]:
        """The LLM servables this server serves that have no live worker at the moment (dead, restarting),
        each with the message that says so: a request for one is unavailable (retry later), not unknown."""
        ...

    def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """TokenEvents as tokens are generated, then one FinalEvent; raises ServingError subclasses."""
        ...

    async def tokenize(self, request: TokenizeRequest) -> Tokenized:
        """The token ids the model gets for a prompt, or for chat messages through its chat template (the very ids
        a generation of the same input gets); raises ServingError subclasses (a template's refusal: InvalidInputs).
        """
        ...

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        """The text of `token_ids`, special tokens included."""
        ...
