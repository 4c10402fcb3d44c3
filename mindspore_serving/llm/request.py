"""One generation request and its state machine.

    WAITING ──schedule──> RUNNING ──finish──> FINISHED_{EOS, STOP, LENGTH, ABORTED, ERROR, GRAMMAR}
       │                   │   ▲
       │              preempt  schedule               FINISHED_LENGTH ──stop string──> FINISHED_STOP
       │                   ▼   │
       └──abort──>      PREEMPTED ──abort──> FINISHED_ABORTED

(LENGTH turns into STOP when the token that reached max_new_tokens also completes a stop string: the
detokenizer sees the text only after the scheduler has finished the request.)

The request owns its tokens (prompt + output), how many of them are in the KV cache
(`num_computed_tokens`), its block table, and its timestamps. "Finished" is derived from the status,
never kept as a separate flag.
"""

import enum
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from mindspore_serving.llm.sampling_params import SamplingParams

if TYPE_CHECKING:  # the engine gives a request these; the request never makes them
    from mindspore_serving.llm.prompt_scores import PromptScores
    from mindspore_serving.llm.structured_output import GrammarState

EosIds = int | Iterable[int] | None
"""One end-of-sequence id, several, or None (none)."""


def eos_ids(value: EosIds) -> frozenset[int]:
    if value is None:
        return frozenset()
    if isinstance(value, frozenset):
        return value
    if isinstance(value, (int, np.integer)):
        return frozenset((int(value),))
    return frozenset(int(i) for i in value)


def inter_token_latency(first_token_time: float | None, last_token_time: float | None, num_tokens: int) -> float | None:
    """Mean seconds between consecutive generated tokens; None before there are two."""
    if first_token_time is None or last_token_time is None or num_tokens < 2:
        return None
    return (last_token_time - first_token_time) / (num_tokens - 1)


class FinishReason(enum.StrEnum):
    """Why a request finished; the value is the word the APIs report."""

    EOS = "eos"  # generated the end-of-sequence token
    STOP = "stop"  # a stop token id or a stop string
    LENGTH = "length"  # max_new_tokens or max_model_len reached
    ABORT = "abort"  # aborted by the client or the server
    ERROR = "error"  # the model step failed for this request
    GRAMMAR = "grammar"  # the structured output's grammar allows no further token

    def __str__(self) -> str:
        return self.value


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again after its blocks were taken; it recomputes its tokens
    FINISHED_EOS = "finished_eos"
    FINISHED_STOP = "finished_stop"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"
    FINISHED_GRAMMAR = "finished_grammar"

    @property
    def finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_EOS: FinishReason.EOS,
    RequestStatus.FINISHED_STOP: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_GRAMMAR: FinishReason.GRAMMAR,
}
FINISHED_STATUSES = frozenset(_FINISH_REASONS)

_ALLOWED = {
    RequestStatus.WAITING: {RequestStatus.RUNNING} | FINISHED_STATUSES,
    RequestStatus.PREEMPTED: {RequestStatus.RUNNING} | FINISHED_STATUSES,
    RequestStatus.RUNNING: {RequestStatus.PREEMPTED} | FINISHED_STATUSES,
    # NOTE: a stop string completed by the token that also hit max_new_tokens turns LENGTH into STOP;
    # the detokenizer sees the text only after the scheduler has finished the request.
    RequestStatus.FINISHED_LENGTH: {RequestStatus.FINISHED_STOP},
}


class Request:
    """A request inside the engine: tokens, KV bookkeeping, status and timing."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        arrival_time: float,
        eos_token_id: EosIds = None,
        prompt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = tuple(int(t) for t in prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_ids(eos_token_id)
        """The ids that finish it with reason "eos" (a model may have several: LLaMA-3 has two)."""
        self.status = RequestStatus.WAITING
        self.error: str | None = None
        self.seq_id = -1
        """The scheduler's number for this request (SeqStep.seq_id), given when it is added."""

        self.output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        """Tokens whose keys/values are in the KV cache (prompt first, then outputs)."""

        self.block_table: list[int] = []
        """Physical KV blocks of this request, in position order; owned by the BlockManager."""
        self.block_hashes: list[bytes] = []
        """Chained hashes of this request's full token blocks (prefix caching); extended lazily."""
        self.num_cached_prompt_tokens = 0
        """Tokens found in the prefix cache at the last admission."""

        self.generator: np.random.Generator | None = (
            np.random.default_rng(sampling_params.seed) if sampling_params.seed is not None else None
        )

        self.group_id = request_id
        """The id of the request this one is a choice of (SamplingParams n / best_of): its own for the first."""
        self.choice = 0
        """Which choice of its group this is (0: the request as added)."""
        self.num_pending_choices = sampling_params.num_choices - 1
        """Choices still to fork off this one: they do at its first sampled token (llm/choices.py)."""
        self.bad_words_ids: tuple[tuple[int, ...], ...] = ()
        """The token sequences of SamplingParams.bad_words (the engine tokenizes them): the sampler bans the last
        token of each one after the others."""
        self.grammar: GrammarState | None = None
        """The structured output's GrammarState (llm/structured_output.py), fed each output token; None: none."""
        self.prompt_scores: PromptScores | None = None
        """The PromptScores (llm/prompt_scores.py) of SamplingParams.prompt_logprobs, given by the engine; None:
        none. While not complete, the request computes its whole prompt and asks for every token's logits."""

        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finished_time: float | None = None
        self.num_preemptions = 0

    # --- tokens -------------------------------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output tokens. Read-only by convention: change it only through append_output_token and
        pop_output_tokens."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens not yet in the KV cache: the rest of the prompt (or of a recompute), or the last sampled token."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than one token to compute: a prompt, a prompt chunk or a recompute after preemption."""
        return self.num_tokens_to_compute > 1

    @property
    def num_seats(self) -> int:
        """Batch rows (max_num_seqs) this request holds: its own, and one per choice it will fork."""
        return 1 + self.num_pending_choices

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def pop_output_tokens(self, count: int) -> None:
        """Takes back the last `count` output tokens (placeholders of tokens still being computed)."""
        if not 0 <= count <= self.num_output_tokens:
            raise ValueError(
                f"request {self.request_id} has {self.num_output_tokens} output tokens, cannot take back {count}"
            )
        if count:
            del self.output_token_ids[-count:]
            del self._all_token_ids[-count:]

    # --- state machine ------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.status.finish_reason

    def set_status(self, status: RequestStatus) -> None:
        if status not in _ALLOWED.get(self.status, ()):
            raise RuntimeError(f"request {self.request_id}: illegal status change {self.status.name} -> {status.name}")
        self.status = status

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """The finished status this request has reached after its last token, or None to go on."""
        params = self.sampling_params
        last = self.output_token_ids[-1]
        # min_tokens: an end-of-sequence or stop id ends the output only after min_tokens tokens before it
        if self.num_output_tokens > params.min_tokens:
            if not params.ignore_eos and last in self.eos_token_ids:
                return RequestStatus.FINISHED_EOS
            if last in params.stop_token_ids:
                return RequestStatus.FINISHED_STOP
        if self.num_output_tokens >= params.max_new_tokens or self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
            f"output={self.num_output_tokens}, computed={self.num_computed_tokens}, blocks={self.block_table})"
        )
