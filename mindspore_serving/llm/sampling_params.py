"""How one request chooses its tokens and when it stops.

`SamplingParams` is validated when it is built; a bad value raises `InvalidRequestError` (a
ValueError) whose message names the field, the value and the allowed range, e.g.
"top_p must be in (0, 1], got 1.5".
"""

import functools
import json
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mindspore_serving.common.check_type import check_known_fields
from mindspore_serving.llm.errors import InvalidRequestError

_MAX_SEED = 2**64 - 1
MAX_STOP_STRINGS = 16  # the front ends take fewer (4, as TGI)
MAX_STOP_LENGTH = 256  # characters of one stop string
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's range of one bias: [-100, 100]
MAX_CHOICES = 16  # n and best_of
LOGPROBS_MODES = ("raw", "processed")
STRUCTURED_OUTPUT_TYPES = ("json", "json_object", "regex", "choice", "grammar")
MAX_STRUCTURED_OUTPUT_CHARS = 256 * 1024


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the output text, compiled by the engine's grammar engine (llm/structured_output.py).

    `type` and `value`:
      * "json": `value` is a JSON Schema, as JSON text;
      * "json_object": any JSON object (`value` empty);
      * "regex": `value` is a regular expression the whole output matches;
      * "choice": `value` is a JSON list of strings, the output is one of them;
      * "grammar": `value` is a Lark grammar (llguidance's dialect; GBNF is converted).
    """

    type: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.type not in STRUCTURED_OUTPUT_TYPES:
            raise InvalidRequestError(
                f"structured output type must be one of {list(STRUCTURED_OUTPUT_TYPES)}, got {self.type!r}"
            )
        if not isinstance(self.value, str):
            object.__setattr__(self, "value", json.dumps(self.value))
        if len(self.value) > MAX_STRUCTURED_OUTPUT_CHARS:
            raise InvalidRequestError(
                f"the {self.type} of a structured output may have at most "
                f"{MAX_STRUCTURED_OUTPUT_CHARS} characters, got {len(self.value)}"
            )
        if self.type in ("json", "choice"):
            try:
                parsed = json.loads(self.value)
            except ValueError as err:
                raise InvalidRequestError(f"the {self.type} of a structured output is not valid JSON: {err}") from None
            if self.type == "json" and not isinstance(parsed, (dict, bool)):
                raise InvalidRequestError(f"a JSON schema must be an object, got {type(parsed).__name__}")
            if self.type == "choice" and (
                not isinstance(parsed, list) or not parsed or not all(isinstance(c, str) for c in parsed)
            ):
                raise InvalidRequestError("a choice structured output needs a non-empty list of strings")
        elif self.type in ("regex", "grammar") and not self.value:
            raise InvalidRequestError(f"a {self.type} structured output needs a non-empty {self.type}")

    def to_json(self) -> str:
        return json.dumps({"type": self.type, "value": self.value})

    @classmethod
    def of(cls, value: Any) -> Optional["StructuredOutput"]:
        """From a StructuredOutput, a dict {"type", "value"} (a value that is not text becomes JSON), its JSON
        text, or None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise InvalidRequestError("structured_output must be an object {type, value}") from None
        if not isinstance(value, dict) or set(value) - {"type", "value"} or "type" not in value:
            raise InvalidRequestError(f"structured_output must be an object {{type, value}}, got {value!r:.80}")
        return cls(value["type"], value.get("value", ""))


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping rules of one request (TGI / OpenAI / vLLM field names)."""

    max_new_tokens: int = 16
    """Most tokens to generate (>= 0). The request finishes with reason "length" when it gets there; with 0 it
    generates nothing (it computes its prompt when prompt_logprobs asks for its scores)."""

    temperature: float = 1.0
    """Divides the logits before sampling (>= 0). 0 means greedy decoding (argmax)."""

    top_k: int = 0
    """Sample only among the k most likely tokens. 0 (or -1, as in vLLM) disables it."""

    top_p: float = 1.0
    """Nucleus sampling: sample among the most likely tokens whose probabilities add up to top_p, in (0, 1]."""

    repetition_penalty: float = 1.0
    """> 0. Each token already in the prompt or the output has its logit divided by the penalty when
    positive and multiplied by it when negative (1.0: off)."""

    do_sample: bool | None = None
    """TGI's switch. False: greedy whatever the temperature. True: sample (temperature must be > 0).
    None: sample unless temperature == 0."""

    seed: int | None = None
    """Seed of this request's own random generator: the same seed gives the same tokens whatever else is
    in the batch. None: use the engine's shared generator."""

    stop: tuple[str, ...] = ()
    """Stop strings: the output text is cut before the first occurrence and the request finishes with
    reason "stop". A single string is accepted."""

    stop_token_ids: tuple[int, ...] = ()
    """Token ids that finish the request with reason "stop" (the token stays in the output ids)."""

    ignore_eos: bool = False
    """Keep generating after the end-of-sequence token (benchmarks use it for exact output lengths)."""

    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the output text."""

    skip_special_tokens: bool = True
    """Leave special tokens (such as EOS) out of the output text."""

    top_logprobs: int = 0
    """Also return the log-probabilities of this many most likely tokens at each step (0: none, at most 20)."""

    presence_penalty: float = 0.0
    """OpenAI's: subtracted once from the logit of every token the output already holds, in [-2, 2]."""

    frequency_penalty: float = 0.0
    """OpenAI's: subtracted from a token's logit once per time the output already holds it, in [-2, 2]."""

    logit_bias: tuple[tuple[int, float], ...] = ()
    """Added to the logits of these token ids before sampling, each in [-100, 100] (OpenAI's; a dict
    {token id: bias} is accepted, its keys may be strings)."""

    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely token's, in [0, 1] (0: off)."""

    min_tokens: int = 0
    """End-of-sequence and stop token ids cannot end the output before it has this many tokens."""

    bad_words: tuple[str, ...] = ()
    """Words the output must not contain: the last token of each one's tokenization is banned after the
    tokens before it."""

    allowed_token_ids: tuple[int, ...] = ()
    """When set, only these token ids may be generated."""

    logprobs_mode: str = "raw"
    """Log-probabilities reported from the model's own distribution ("raw", log_softmax of the logits) or from
    the logits the sampler chose from ("processed": after penalties, biases and masks, before temperature and
    truncation)."""

    prompt_logprobs: int | None = None
    """Score the prompt: each prompt token's log-probability (0), and its this many most likely alternatives;
    None: not scored."""

    n: int = 1
    """Choices returned; they share the prompt's computation and each samples on its own."""

    best_of: int | None = None
    """Choices generated (>= n), of which the n with the highest cumulative log-probability are returned;
    None: n."""

    structured_output: StructuredOutput | None = None
    """A grammar the output must follow (JSON schema, regex, choice, Lark); a dict {type, value} is accepted."""

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            raise InvalidRequestError(f"max_new_tokens must be an int >= 0, got {self.max_new_tokens!r}")
        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(
                f"temperature must be a finite number >= 0 (0 means greedy), got {self.temperature!r}"
            )
        if not _is_int(self.top_k) or self.top_k < -1:
            raise InvalidRequestError(f"top_k must be an int >= -1 (0 or -1 disables it), got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if (
            not _is_number(self.repetition_penalty)
            or not math.isfinite(self.repetition_penalty)
            or self.repetition_penalty <= 0
        ):
            raise InvalidRequestError(
                f"repetition_penalty must be a finite number > 0 (1.0 is off), got {self.repetition_penalty!r}"
            )
        if self.do_sample is not None and not isinstance(self.do_sample, bool):
            raise InvalidRequestError(f"do_sample must be true, false or null, got {self.do_sample!r}")
        if self.do_sample is True and self.temperature == 0:
            raise InvalidRequestError(
                "do_sample=True needs temperature > 0, got temperature=0; "
                "raise the temperature or set do_sample=False for greedy decoding"
            )
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= _MAX_SEED):
            raise InvalidRequestError(f"seed must be an int in [0, 2**64 - 1] or null, got {self.seed!r}")
        object.__setattr__(self, "stop", _as_stop_strings(self.stop))
        object.__setattr__(self, "stop_token_ids", _as_token_ids(self.stop_token_ids))
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not _is_int(self.top_logprobs) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be an int in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}"
            )
        self._validate_penalties()
        self._validate_choices()
        object.__setattr__(self, "structured_output", StructuredOutput.of(self.structured_output))

    def _validate_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2 <= value <= 2:
                raise InvalidRequestError(f"{name} must be a number in [-2, 2], got {value!r}")
        object.__setattr__(self, "logit_bias", _as_logit_bias(self.logit_bias))
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise InvalidRequestError(f"min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_new_tokens:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) must not exceed max_new_tokens ({self.max_new_tokens})"
            )
        object.__setattr__(self, "bad_words", _as_strings(self.bad_words, "bad_words"))
        object.__setattr__(self, "allowed_token_ids", _as_token_ids(self.allowed_token_ids, "allowed_token_ids"))
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise InvalidRequestError(
                f"logprobs_mode must be one of {list(LOGPROBS_MODES)}, got {self.logprobs_mode!r}"
            )
        if self.prompt_logprobs is not None and (
            not _is_int(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS
        ):
            raise InvalidRequestError(
                f"prompt_logprobs must be an int in [0, {MAX_TOP_LOGPROBS}] or null, got {self.prompt_logprobs!r}"
            )

    def _validate_choices(self) -> None:
        if not _is_int(self.n) or not 1 <= self.n <= MAX_CHOICES:
            raise InvalidRequestError(f"n must be an int in [1, {MAX_CHOICES}], got {self.n!r}")
        if self.best_of is not None:
            if not _is_int(self.best_of) or not self.n <= self.best_of <= MAX_CHOICES:
                raise InvalidRequestError(
                    f"best_of must be an int in [n, {MAX_CHOICES}] (n is {self.n}), got {self.best_of!r}"
                )

    @property
    def num_choices(self) -> int:
        """Choices generated: best_of, else n."""
        return self.best_of or self.n

    @property
    def greedy(self) -> bool:
        """True when the argmax is taken (temperature 0 or do_sample=False)."""
        return self.do_sample is False or self.temperature == 0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @functools.cached_property
    def allowed_token_ids_array(self) -> np.ndarray:
        """allowed_token_ids as int64 ids, made once per params (the sampler masks with them at every step)."""
        return np.array(self.allowed_token_ids, dtype=np.int64)

    @functools.cached_property  # frozen: asked for per row and step
    def processes_logits(self) -> bool:
        """True when the sampler changes the logits before choosing (llm/logits_processors.py): a repetition,
        presence or frequency penalty, a logit bias, allowed ids, bad words or min_tokens."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0
            or self.frequency_penalty != 0
            or bool(self.logit_bias)
            or bool(self.allowed_token_ids)
            or bool(self.bad_words)
            or self.min_tokens > 0
        )

    @functools.cached_property  # frozen: asked for per row and step
    def plain_greedy(self) -> bool:
        """True when a model runner may choose this request's tokens itself, several steps in a row: greedy on
        the model's own logits, raw logprobs of the chosen token only, one choice, nothing for the engine to look
        at between tokens (stop strings, a grammar). Prompt scores are the step's business: a row that asks for
        every position's logits (SeqStep.all_logits) is never the runner's to choose."""
        return (
            self.greedy
            and not self.processes_logits
            and not self.stop
            and not self.top_logprobs
            and self.logprobs_mode == "raw"
            and self.structured_output is None
            and self.num_choices == 1
        )

    @classmethod
    def from_dict(cls, values: dict) -> "SamplingParams":
        """Builds params from a request body; unknown keys are rejected, not dropped."""
        if not isinstance(values, dict):
            raise InvalidRequestError(f"sampling parameters must be an object, got {type(values).__name__}")
        check_known_fields(cls, values, "sampling parameters", InvalidRequestError)
        return cls(**values)


def _as_stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
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
            raise InvalidRequestError(
                f"stop strings may have at most {MAX_STOP_LENGTH} characters, got one of {len(item)}"
            )
    return tuple(stop)


def _as_token_ids(ids: Any, name: str = "stop_token_ids") -> tuple[int, ...]:
    if ids is None:
        return ()
    if not isinstance(ids, (list, tuple)):
        raise InvalidRequestError(f"{name} must be a list of ints, got {type(ids).__name__}")
    for item in ids:
        if not _is_int(item) or item < 0:
            raise InvalidRequestError(f"{name} must hold ints >= 0, got {item!r}")
    return tuple(int(i) for i in ids)


def _as_strings(values: Any, name: str) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, str):
        values = (values,)
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) and v for v in values):
        raise InvalidRequestError(f"{name} must be a list of non-empty strings, got {values!r:.80}")
    return tuple(values)


def _as_logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """{token id (int or its decimal text): bias} or (id, bias) pairs -> sorted (int, float) pairs."""
    if bias is None:
        return ()
    items = bias.items() if isinstance(bias, dict) else bias
    pairs = {}
    try:
        for token, value in items:
            token_id = int(token) if isinstance(token, str) and token.strip().isdigit() else token
            if not _is_int(token_id) or token_id < 0:
                raise InvalidRequestError(f"logit_bias keys must be token ids (ints >= 0), got {token!r}")
            if not _is_number(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise InvalidRequestError(
                    f"logit_bias values must be in [-100, 100], got {value!r} for token {token_id}"
                )
            pairs[int(token_id)] = float(value)
    except (TypeError, ValueError) as err:
        if isinstance(err, InvalidRequestError):
            raise
        raise InvalidRequestError(f"logit_bias must map token ids to numbers, got {bias!r:.80}") from None
    return tuple(sorted(pairs.items()))
