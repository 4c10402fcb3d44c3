"""Configuration of the LLM scheduler: batch limits, KV-cache geometry and batching policy.

`SchedulerConfig` is validated when it is built: each bad value raises a ValueError that names the
field, the value and the fix, and combinations that could never serve a request (a pool too small for
one sequence, a budget too small for a prompt without chunking) are rejected up front.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from mindspore_serving.common.check_type import IntFault, check_known_fields, int_fault

if TYPE_CHECKING:  # the runner's cache geometry is read, its module not needed
    from mindspore_serving.llm.model_io import ModelRunner

NGRAM = "ngram"
SPECULATIVE_METHODS = (NGRAM,)
CONTINUOUS = "continuous"
STATIC = "static"
BATCHING_STRATEGIES = (CONTINUOUS, STATIC)


def _check_int(name: str, value: object, minimum: int, fix: str = "", what: str = "SchedulerConfig") -> None:
    fault = int_fault(value, minimum)
    if fault is IntFault.NOT_INT:
        raise ValueError(f"{what}.{name} must be an int, got {value!r} ({type(value).__name__})")
    if fault is not None:
        raise ValueError(f"{what}.{name} must be >= {minimum}, got {value}" + (f"; {fix}" if fix else ""))


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"SchedulerConfig.{name} must be True or False, got {value!r}")


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` tokens."""
    return -(-num_tokens // block_size)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding without a draft model (llm/ngram_proposer.py): each decode row may carry up to
    `num_speculative_tokens` proposed tokens, which one model call verifies (vLLM's `speculative_config` names
    and meanings)."""

    method: str = NGRAM
    """How tokens are proposed: "ngram" (prompt lookup: the tokens that followed the latest earlier occurrence of
    the sequence's last n tokens, in its prompt or output)."""

    num_speculative_tokens: int = 4
    """Most tokens proposed per row and step (k): a verifying row computes 1 + k tokens, in the step's graph call."""

    prompt_lookup_min: int = 1
    """Shortest n-gram matched (the longest, prompt_lookup_max, is tried first)."""

    prompt_lookup_max: int = 4
    """Longest n-gram matched."""

    disable_by_batch_size: int | None = None
    """A step with at least this many running requests does not speculate (every row decodes one token as without
    speculation): a busy batch fills the model call already. None: always speculate."""

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"SpeculativeConfig.method must be one of {SPECULATIVE_METHODS}, got {self.method!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, what="SpeculativeConfig")
        _check_int("prompt_lookup_min", self.prompt_lookup_min, 1, what="SpeculativeConfig")
        _check_int("prompt_lookup_max", self.prompt_lookup_max, 1, what="SpeculativeConfig")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(
                f"SpeculativeConfig.prompt_lookup_max={self.prompt_lookup_max} is below "
                f"prompt_lookup_min={self.prompt_lookup_min}"
            )
        if self.disable_by_batch_size is not None:
            _check_int(
                "disable_by_batch_size",
                self.disable_by_batch_size,
                1,
                "use None to always speculate",
                what="SpeculativeConfig",
            )

    @classmethod
    def of(cls, value: Union[None, "SpeculativeConfig", Mapping[str, Any]]) -> Optional["SpeculativeConfig"]:
        """A SpeculativeConfig from a mapping of its fields (a YAML section), itself, or None."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"SchedulerConfig.speculative must be a mapping of SpeculativeConfig fields or None, got {value!r}"
            )
        check_known_fields(cls, value, "SpeculativeConfig fields")
        return cls(**value)


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits and policy of the LLM scheduler. All fields are validated on construction."""

    max_num_seqs: int = 64
    """Most requests running at once (prefilling or decoding); also the largest decode batch."""

    max_num_batched_tokens: int = 2048
    """Token budget of one step: decode tokens (one per running request) plus prefill tokens."""

    max_model_len: int = 2048
    """Most tokens in one sequence, prompt plus generated. Must not exceed the runner's max_seq_len."""

    max_prompt_chars: int = 0
    """Longest text prompt, in characters, that the engine tokenizes (a longer one is refused before its
    tokenization costs anything); 0: 32 characters per token of max_model_len."""

    block_size: int = 16
    """Tokens per KV-cache block. Must equal the model runner's block_size."""

    num_blocks: int = 1024
    """Physical KV-cache blocks, counting the reserved scratch block 0 (so num_blocks - 1 are usable).
    Must not exceed the model runner's num_blocks."""

    enable_prefix_caching: bool = False
    """Share full KV blocks between requests whose token prefixes are equal (hash of the block's tokens
    chained with its parent's hash). Freed cached blocks stay reusable until evicted, oldest first."""

    batching: str = CONTINUOUS
    """"continuous": requests join and leave between steps. "static": a batch is formed only when no
    request is running, and it runs until all of its requests have finished."""

    enable_chunked_prefill: bool = True
    """Split a prompt across steps when it does not fit in the step's remaining budget, so long prompts
    do not stall running decodes. Off: a prompt is computed in one step, or waits."""

    max_prefill_tokens_per_step: int | None = None
    """Cap on prompt (prefill) tokens per step, shared by all prefills of the step; the rest of the
    budget is kept for decodes. None: prefills may use whatever budget decodes leave."""

    max_prefills_per_decode_step: int | None = None
    """When a step decodes running requests, at most this many prompts (new ones and chunks of admitted ones)
    join it; the others wait for the following steps, each of which decodes too: a lower cap keeps the decoding
    requests' steps short (their TPOT) at the cost of the waiting ones' TTFT. Steps without decodes (an empty
    engine) admit what the budget allows. None: no cap (prompts join up to max_num_batched_tokens)."""

    num_scheduler_steps: int = 1
    """Steps run per scheduling round when every scheduled request decodes greedily (no repetition penalty,
    stop strings or top logprobs) and every row samples (decodes, and, when the batch is full, prompts
    completed in this step; a prompt chunk makes the round a single step): the first step computes the plan,
    the runner feeds each step's argmax into the next without a round trip through the engine (multi-step
    decoding). Tokens then stream in bursts of up to this many, and a request that arrives or finishes
    meanwhile waits for the round to end. 1: one step per round."""

    async_scheduling: bool = False
    """Plan the next step while the runner still computes this one, when this one's tokens are chosen by the
    runner (every row greedy, as for num_scheduler_steps): the next step's decode rows name the row of this
    step whose token they continue from, and the runner fills it in. The engine's own work (scheduling,
    detokenizing, streaming) then overlaps the model's instead of following it. A request that stops on a
    token the engine could not foresee (EOS, a stop token) has computed one step it does not need; one that
    reaches max_new_tokens in a step leaves its batch slot and blocks to the next step at once. Steps that
    sample in the engine, and steps that might have to preempt, run one after the other as without it. Needs a
    runner that computes while the engine plans (a model_io.StepSubmitter: the agents); with any other runner
    the engine steps one after the other."""

    speculative: SpeculativeConfig | None = None
    """Speculative decoding (SpeculativeConfig; a mapping of its fields is turned into one). None: off. A step in
    which some row verifies proposed tokens is one step of its own (not a multi-step round, not planned ahead);
    steps without proposals run as without it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculative", SpeculativeConfig.of(self.speculative))
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        _check_int("num_scheduler_steps", self.num_scheduler_steps, 1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _check_int("max_model_len", self.max_model_len, 2, "room for at least one prompt and one new token")
        _check_int("max_prompt_chars", self.max_prompt_chars, 0)
        _check_int("block_size", self.block_size, 1)
        _check_int("num_blocks", self.num_blocks, 2, "block 0 is the reserved scratch block")
        _check_bool("enable_prefix_caching", self.enable_prefix_caching)
        _check_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        _check_bool("async_scheduling", self.async_scheduling)
        if self.batching not in BATCHING_STRATEGIES:
            raise ValueError(f"SchedulerConfig.batching must be one of {BATCHING_STRATEGIES}, got {self.batching!r}")
        if self.max_prefills_per_decode_step is not None:
            _check_int("max_prefills_per_decode_step", self.max_prefills_per_decode_step, 1, "use None for no cap")
        if self.max_prefill_tokens_per_step is not None:
            _check_int("max_prefill_tokens_per_step", self.max_prefill_tokens_per_step, 1, "use None for no cap")
            if self.max_prefill_tokens_per_step > self.max_num_batched_tokens:
                raise ValueError(
                    f"SchedulerConfig.max_prefill_tokens_per_step={self.max_prefill_tokens_per_step} exceeds "
                    f"max_num_batched_tokens={self.max_num_batched_tokens}; lower it or use None (no cap)"
                )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"SchedulerConfig.max_num_batched_tokens={self.max_num_batched_tokens} is below "
                f"max_num_seqs={self.max_num_seqs}, so running requests could not all decode in one step; "
                f"raise max_num_batched_tokens to >= {self.max_num_seqs} or lower max_num_seqs"
            )
        # The longest sequence keeps at most max_model_len - 1 tokens in the cache: the last token is
        # sampled but never computed.
        need = blocks_for(self.max_model_len - 1, self.block_size)
        if self.num_blocks - 1 < need:
            raise ValueError(
                f"SchedulerConfig.num_blocks={self.num_blocks} (block_size={self.block_size}) cannot hold one "
                f"sequence of max_model_len={self.max_model_len} tokens, which needs {need} blocks plus the "
                f"scratch block; raise num_blocks to >= {need + 1} or lower max_model_len"
            )
        if not self.enable_chunked_prefill:
            prefill_cap = self.prefill_token_cap
            if prefill_cap < self.max_model_len:
                name = (
                    "max_num_batched_tokens"
                    if self.max_prefill_tokens_per_step is None
                    else "max_prefill_tokens_per_step"
                )
                raise ValueError(
                    f"SchedulerConfig.{name}={prefill_cap} is below max_model_len={self.max_model_len} "
                    f"with enable_chunked_prefill=False, so a long prompt (or a preempted request's recompute) "
                    f"could never be scheduled; raise {name} to >= {self.max_model_len}, lower max_model_len, "
                    f"or enable chunked prefill"
                )

    @property
    def prefill_token_cap(self) -> int:
        """Most prefill tokens in one step."""
        if self.max_prefill_tokens_per_step is None:
            return self.max_num_batched_tokens
        return self.max_prefill_tokens_per_step

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @classmethod
    def for_runner(cls, runner: "ModelRunner", **overrides: Any) -> "SchedulerConfig":
        """A config matching a ModelRunner's cache geometry (block_size, num_blocks, max_seq_len)."""
        check_known_fields(cls, overrides, "SchedulerConfig fields")
        values: dict[str, Any] = dict(
            block_size=runner.block_size, num_blocks=runner.num_blocks, max_model_len=runner.max_seq_len
        )
        values.update(overrides)
        return cls(**values)

    def check_runner(self, runner: "ModelRunner") -> None:
        """Raises ValueError when this config does not fit the runner's KV cache or sequence length."""
        if runner.block_size != self.block_size:
            raise ValueError(
                f"SchedulerConfig.block_size={self.block_size} differs from the model runner's "
                f"block_size={runner.block_size}; set block_size={runner.block_size}"
            )
        if self.num_blocks > runner.num_blocks:
            raise ValueError(
                f"SchedulerConfig.num_blocks={self.num_blocks} exceeds the model runner's "
                f"num_blocks={runner.num_blocks}; set num_blocks <= {runner.num_blocks}"
            )
        if self.max_model_len > runner.max_seq_len:
            raise ValueError(
                f"SchedulerConfig.max_model_len={self.max_model_len} exceeds the model runner's "
                f"max_seq_len={runner.max_seq_len}; set max_model_len <= {runner.max_seq_len}"
            )
