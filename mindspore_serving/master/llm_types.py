"""What the LLM front ends (MindSpore Serving, MindSpore LLM-serving, TGI and OpenAI protocols) need from the
serving system: a list of models and a stream of generation events per request.

The master implements it by forwarding to the LLM servable's worker; tests implement it with fakes.
Errors are `mindspore_serving.common.errors.ServingError` subclasses:
- `InvalidInputs`: bad request (HTTP 400/422, protocol-specific error shapes);
- `Overloaded`: too many requests queued (HTTP 429, gRPC RESOURCE_EXHAUSTED);
- `ServableUnavailable` / `WorkerUnavailable`: unknown model or the model is down (HTTP 404 / 503);
- anything else: HTTP 500.
Cancelling the consuming task (e.g. the HTTP client went away) must abort the request in the engine.
"""
from dataclasses import dataclass, field
from typing import AsyncIterator, Dict, List, Optional, Protocol, Sequence, Union

from mindspore_serving.common import errors


Overloaded = errors.Overloaded  # the engine's queue is full; retry later


@dataclass
class ChatMessage:
    role: str
    content: str


@dataclass
class GenerationRequest:
    model: str
    """The servable name, e.g. "llama_tiny"."""
    prompt: Optional[str] = None
    """Text prompt; exactly one of prompt / messages is set."""
    messages: Optional[List[ChatMessage]] = None
    """Chat messages; the model's chat template (LLM configuration) turns them into a prompt."""
    params: Dict[str, object] = field(default_factory=dict)
    """SamplingParams fields: max_new_tokens, temperature (0 = greedy), top_k, top_p, repetition_penalty, seed,
    do_sample, stop (list of str), stop_token_ids, ignore_eos, top_logprobs."""
    request_id: Optional[str] = None


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


@dataclass
class ModelInfo:
    name: str
    max_model_len: int
    max_num_seqs: int
    max_queue_size: int
    vocab_size: int
    device: str = "CPU"


class LlmBackend(Protocol):
    def models(self) -> List[ModelInfo]:
        """The LLM servables being served (empty while none is up)."""
        ...

    def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """TokenEvents as tokens are generated, then one FinalEvent; raises ServingError subclasses."""
        ...
