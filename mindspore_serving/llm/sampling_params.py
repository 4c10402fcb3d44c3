"""How one request chooses its tokens and when it stops.

`SamplingParams` is validated when it is built; a bad value raises `InvalidRequestError` (a
ValueError) whose message names the field, the value and the allowed range, e.g.
"top_p must be in (0, 1], got 1.5".
"""
import math
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.fields import check_known_fields

_MAX_SEED = 2 ** 64 - 1
MAX_STOP_STRINGS = 16   # the front ends take fewer (4, as TGI)
MAX_STOP_LENGTH = 256   # characters of one stop string


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping rules of one request (TGI / OpenAI / vLLM field names)."""

    max_new_tokens: int = 16
    """Most tokens to generate (>= 1). The request finishes with reason "length" when it gets there."""

    temperature: float = 1.0
    """Divides the logits before sampling (>= 0). 0 means greedy decoding (argmax)."""

    top_k: int = 0
    """Sample only among the k most likely tokens. 0 (or -1, as in vLLM) disables it."""

    top_p: float = 1.0
    """Nucleus sampling: sample among the most likely tokens whose probabilities add up to top_p, in (0, 1]."""

    repetition_penalty: float = 1.0
    """> 0. Each token already in the prompt or the output has its logit divided by the penalty when
    positive and multiplied by it when negative (1.0: off)."""

    do_sample: Optional[bool] = None
    """TGI's switch. False: greedy whatever the temperature. True: sample (temperature must be > 0).
    None: sample unless temperature == 0."""

    seed: Optional[int] = None
    """Seed of this request's own random generator: the same seed gives the same tokens whatever else is
    in the batch. None: use the engine's shared generator."""

    stop: Tuple[str, ...] = ()
    """Stop strings: the output text is cut before the first occurrence and the request finishes with
    reason "stop". A single string is accepted."""

    stop_token_ids: Tuple[int, ...] = ()
    """Token ids that finish the request with reason "stop" (the token stays in the output ids)."""

    ignore_eos: bool = False
    """Keep generating after the end-of-sequence token (benchmarks use it for exact output lengths)."""

    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the output text."""

    skip_special_tokens: bool = True
    """Leave special tokens (such as EOS) out of the output text."""

    top_logprobs: int = 0
    """Also return the log-probabilities of this many most likely tokens at each step (0: none)."""

    def __post_init__(self):
        self._validate()

    def _validate(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(
                f"temperature must be a finite number >= 0 (0 means greedy), got {self.temperature!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise InvalidRequestError(f"top_k must be an int >= 0 (0 or -1 disables it), got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if (not _is_number(self.repetition_penalty) or not math.isfinite(self.repetition_penalty)
                or self.repetition_penalty <= 0):
            raise InvalidRequestError(
                f"repetition_penalty must be a finite number > 0 (1.0 is off), got {self.repetition_penalty!r}")
        if self.do_sample is not None and not isinstance(self.do_sample, bool):
            raise InvalidRequestError(f"do_sample must be true, false or null, got {self.do_sample!r}")
        if self.do_sample is True and self.temperature == 0:
            raise InvalidRequestError("do_sample=True needs temperature > 0, got temperature=0; "
                                      "raise the temperature or set do_sample=False for greedy decoding")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= _MAX_SEED):
            raise InvalidRequestError(f"seed must be an int in [0, 2**64 - 1] or null, got {self.seed!r}")
        object.__setattr__(self, "stop", _as_stop_strings(self.stop))
        object.__setattr__(self, "stop_token_ids", _as_token_ids(self.stop_token_ids))
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not _is_int(self.top_logprobs) or self.top_logprobs < 0:
            raise InvalidRequestError(f"top_logprobs must be an int >= 0, got {self.top_logprobs!r}")

    @property
    def greedy(self) -> bool:
        """True when the argmax is taken (temperature 0 or do_sample=False)."""
        return self.do_sample is False or self.temperature == 0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @classmethod
    def from_dict(cls, values: dict) -> "SamplingParams":
        """Builds params from a request body; unknown keys are rejected, not dropped."""
        if not isinstance(values, dict):
            raise InvalidRequestError(f"sampling parameters must be an object, got {type(values).__name__}")
        check_known_fields(cls, values, "sampling parameters", InvalidRequestError)
        return cls(**values)


def _as_stop_strings(stop: Union[str, Sequence[str], None]) -> Tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)):
        raise InvalidRequestError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} stop strings are accepted, got {len(stop)}")
    for item in stop:
        if not isinstance(item, str) or not item:
            raise InvalidRequestError(f"stop strings must be non-empty strings, got {item!r}")
        if len(item) > MAX_STOP_LENGTH:
            raise InvalidRequestError(f"stop strings may have at most {MAX_STOP_LENGTH} characters, got one of "
                                      f"{len(item)}")
    return tuple(stop)


def _as_token_ids(ids) -> Tuple[int, ...]:
    if ids is None:
        return ()
    if not isinstance(ids, (list, tuple)):
        raise InvalidRequestError(f"stop_token_ids must be a list of ints, got {type(ids).__name__}")
    for item in ids:
        if not _is_int(item) or item < 0:
            raise InvalidRequestError(f"stop_token_ids must hold ints >= 0, got {item!r}")
    return tuple(int(i) for i in ids)
