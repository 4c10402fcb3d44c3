"""Request bodies of HuggingFace TGI's `/generate` family and of MindSpore LLM-serving's
`/models/{model}/generate` family (which copies TGI), and how they become engine parameters.

Field names, defaults and validation messages follow TGI (router `GenerateParameters`, `ValidationError`).
Options the engine cannot honour (typical_p, truncate, watermark, adapter_id) are accepted at their neutral
value and rejected otherwise, by name.

TGI's parameters map onto the engine's: `grammar` -> structured_output, `top_n_tokens` -> top_logprobs,
`decoder_input_details` -> prompt_logprobs=0, `frequency_penalty` -> frequency_penalty, `best_of` -> n (every
candidate comes back and the front end keeps the best, as TGI's router does).
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from mindspore_serving.common.errors import InvalidParam
from mindspore_serving.frontends.llm.params import sampling_params, stop_list
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.sampling_params import StructuredOutput

MAX_STOP_SEQUENCES = 4
MAX_BEST_OF = 2
"""TGI's default `--max-best-of`."""
MAX_TOP_N_TOKENS = 5
"""TGI's default `--max-top-n-tokens`."""
TGI_DEFAULT_MAX_NEW_TOKENS = 100


def _given(refuses):
    """A rule on an optional field: None always passes."""
    return lambda value: value is not None and refuses(value)


def _is_set(value) -> bool:
    return value is not None


_UNSUPPORTED = "is not supported by this server"
_STRICTLY_POSITIVE = (_given(lambda value: value <= 0), "must be strictly positive")
_OPEN_UNIT = (_given(lambda value: not 0.0 < value < 1.0), "must be > 0.0 and < 1.0")

# field -> its rules, checked in order: (refuses(value), the message after "`<field>` ", or a function of the value
# that gives it). As in TGI a range is checked before the refusal of what this engine cannot honour.
_PARAMETER_RULES = {
    "best_of": [
        (
            _given(lambda value: not 0 < value <= MAX_BEST_OF),
            lambda value: f"must be > 0 and <= {MAX_BEST_OF}. Given: {value}",
        )
    ],
    "temperature": [_STRICTLY_POSITIVE],
    "repetition_penalty": [_STRICTLY_POSITIVE],
    "frequency_penalty": [(_given(lambda value: not -2.0 <= value <= 2.0), "must be >= -2.0 and <= 2.0")],
    "top_k": [_STRICTLY_POSITIVE],
    "top_p": [_OPEN_UNIT],
    "typical_p": [_OPEN_UNIT, (_is_set, _UNSUPPORTED)],
    "max_new_tokens": [_STRICTLY_POSITIVE],
    "stop": [
        (
            lambda value: len(value) > MAX_STOP_SEQUENCES,
            lambda value: f"supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(value)}",
        )
    ],
    "truncate": [(_is_set, _UNSUPPORTED)],
    "watermark": [(bool, _UNSUPPORTED)],
    "seed": [(_given(lambda value: value < 0), "must be positive")],
    "top_n_tokens": [
        (
            _given(lambda value: not 0 <= value <= MAX_TOP_N_TOKENS),
            lambda value: f"must be >= 0 and <= {MAX_TOP_N_TOKENS}. Given: {value}",
        )
    ],
    "adapter_id": [(_is_set, _UNSUPPORTED)],
}


def _refuse_false(text: str):
    """A field validator that refuses an empty or false value with `text`."""

    def check(value):
        if not value:
            raise ValueError(text)
        return value

    return check


class _Prompt(BaseModel):
    """What every generate body starts with: a non-empty `inputs`; no field beyond the declared ones."""

    model_config = ConfigDict(extra="forbid")

    inputs: str

    _inputs = field_validator("inputs")(_refuse_false("`inputs` cannot be empty"))


class TgiGrammar(BaseModel):
    """TGI's `grammar`: `{"type": "json" (alias "json_object"), "value": <JSON schema, or its text>}`,
    `{"type": "regex", "value": <regular expression>}` or `{"type": "json_schema", "value": {"name"?, "schema"}}`.
    A "json_object" without a value asks for any JSON object."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["json", "json_object", "regex", "json_schema"]
    value: Any = None

    def structured_output(self) -> StructuredOutput:
        """The engine's constraint; ValueError with TGI's messages ("grammar is not valid: ...")."""
        value = self.value
        if self.type == "json_object" and value is None:
            kind, value = "json_object", ""
        elif self.type in ("json", "json_object"):
            kind = "json"
            if not isinstance(value, (str, dict)):  # as TGI: a schema is an object or its JSON text
                raise ValueError("grammar is not valid: a json grammar's value is a JSON schema object or its text")
        elif self.type == "json_schema":
            kind = "json"
            if not isinstance(value, dict) or not isinstance(value.get("schema"), dict):
                raise ValueError(
                    'grammar is not valid: a json_schema grammar\'s value is {"name"?, "schema": <JSON schema object>}'
                )
            value = value["schema"]
        else:
            kind = "regex"
            if not isinstance(value, str):
                raise ValueError("grammar is not valid: a regex grammar's value is the regular expression's text")
        try:
            return StructuredOutput(kind, value)
        except InvalidRequestError as err:
            raise ValueError(f"grammar is not valid: {err}") from None


class TgiParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    best_of: int | None = None
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool = False
    max_new_tokens: int | None = TGI_DEFAULT_MAX_NEW_TOKENS
    return_full_text: bool | None = None
    stop: list[str] = []
    truncate: int | None = None
    watermark: bool = False
    details: bool = False
    decoder_input_details: bool = False
    seed: int | None = None
    top_n_tokens: int | None = None
    grammar: TgiGrammar | None = None
    adapter_id: str | None = None

    @field_validator(*_PARAMETER_RULES)
    @classmethod
    def _check(cls, value, info: ValidationInfo):
        for refuses, text in _PARAMETER_RULES[info.field_name]:
            if refuses(value):
                raise ValueError(f"`{info.field_name}` {text(value) if callable(text) else text}")
        return value

    @field_validator("max_new_tokens")
    @classmethod
    def _max_new_tokens(cls, value):
        # an explicit null asks for TGI's default, as an absent field does
        return TGI_DEFAULT_MAX_NEW_TOKENS if value is None else value

    @model_validator(mode="after")
    def _best_of(self):
        # TGI's router: best_of > 1 needs one of the sampling fields set, and no seed (each candidate has its own)
        if self.best_of is not None and self.best_of > 1:
            if not (
                self.do_sample
                or self.temperature is not None
                or self.top_k is not None
                or self.top_p is not None
                or self.typical_p is not None
            ):
                raise ValueError("you must use sampling when `best_of` is > 1")
            if self.seed is not None:
                raise ValueError("`seed` must not be set when `best_of` > 1")
        return self

    @field_validator("grammar", mode="after")
    @classmethod
    def _grammar(cls, value):
        if value is not None:
            value.structured_output()  # refused now, with TGI's message, rather than by the engine
        return value

    @property
    def sampling(self) -> bool:
        """TGI samples when asked to, or when any sampling knob is set away from its neutral value."""
        return (
            self.do_sample
            or (self.temperature is not None and self.temperature != 1.0)
            or self.top_k is not None
            or (self.top_p is not None and self.top_p < 1.0)
        )

    @property
    def candidates(self) -> int:
        """Sequences generated: best_of, of which the reply keeps one."""
        return self.best_of or 1

    def engine_params(self) -> dict:
        return sampling_params(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            do_sample=self.sampling,
            seed=self.seed,
            stop=self.stop or None,
            top_logprobs=self.top_n_tokens or None,
            prompt_logprobs=0 if self.decoder_input_details else None,
            n=self.candidates if self.candidates > 1 else None,
            structured_output=self._structured_output(),
        )

    def _structured_output(self) -> dict | None:
        if self.grammar is None:
            return None
        constraint = self.grammar.structured_output()
        return {"type": constraint.type, "value": constraint.value}


class TgiRequest(_Prompt):
    parameters: TgiParameters = TgiParameters()
    stream: bool = False
    """Read by the compat route `POST /` only."""
    add_special_tokens: bool = True

    _add_special_tokens = field_validator("add_special_tokens")(
        _refuse_false("`add_special_tokens` = false is not supported by this server")
    )

    def check_stream(self) -> None:
        """TGI's refusals of a streamed request (both are non-streamed features)."""
        if self.parameters.candidates != 1:
            raise InvalidParam("`best_of` != 1 is not supported when streaming tokens", "parameters.best_of")
        if self.parameters.decoder_input_details:
            raise InvalidParam(
                "`decoder_input_details` == true is not supported when streaming tokens",
                "parameters.decoder_input_details",
            )


class LlmServingParameters(BaseModel):
    """MindSpore LLM-serving's `parameters`, with its defaults. Unlike the reference server, seed, stop and
    repetition_penalty take effect, do_sample defaults to False as documented, and out-of-range values are
    rejected instead of silently clamped.

    Beyond the reference: the engine's sampling fields presence_penalty, frequency_penalty, min_p, min_tokens,
    bad_words, allowed_token_ids, logit_bias ({token id: bias}) and structured_output ({"type", "value"}); the
    reference's TGI fields `top_n_tokens` (or `top_logprobs`) and `decoder_input_details` take effect (the
    reply's `top_tokens` and `prefill` then hold what they name). The reply carries one text: n must be 1."""

    model_config = ConfigDict(extra="forbid")

    do_sample: bool | None = False
    top_k: int = 3
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 300
    return_full_text: bool = True
    return_protocol: Literal["sse", "raw"] = "sse"
    seed: int | None = None
    stop: str | list[str] | None = None
    # the engine's sampling fields (validated by the engine, whose messages name them)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    bad_words: str | list[str] | None = None
    allowed_token_ids: list[int] | None = None
    logit_bias: dict[str, float] | None = None
    structured_output: dict[str, Any] | None = None
    top_logprobs: int | None = None
    n: int | None = None
    # TGI fields the reference accepts
    details: bool = False
    decoder_input_details: bool = False
    top_n_tokens: int | None = None
    truncate: int | None = None
    typical_p: float | None = None
    watermark: bool = False

    @model_validator(mode="after")
    def _neutral(self):
        active = [name for name, value in (("truncate", self.truncate), ("watermark", self.watermark)) if value]
        if self.typical_p is not None and self.typical_p != 1.0:
            active.append("typical_p")
        if active:
            raise ValueError(f"{', '.join(f'`{name}`' for name in active)} not supported by this server")
        if self.n not in (None, 1):
            raise ValueError(f"`n` must be 1: the reply carries one generated text, got {self.n}")
        if None not in (self.top_n_tokens, self.top_logprobs) and self.top_n_tokens != self.top_logprobs:
            raise ValueError("`top_n_tokens` and `top_logprobs` name the same thing; give one of them")
        return self

    @property
    def top_tokens(self) -> int:
        """Most likely tokens reported per position (0: none)."""
        return self.top_n_tokens or self.top_logprobs or 0

    def engine_params(self) -> dict:
        return sampling_params(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            do_sample=bool(self.do_sample),
            seed=self.seed,
            stop=stop_list(self.stop, MAX_STOP_SEQUENCES, "parameters.stop"),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            min_p=self.min_p,
            min_tokens=self.min_tokens,
            bad_words=self.bad_words,
            allowed_token_ids=self.allowed_token_ids,
            logit_bias=self.logit_bias,
            structured_output=self.structured_output,
            top_logprobs=self.top_tokens or None,
            prompt_logprobs=0 if self.decoder_input_details else None,
        )


class LlmServingRequest(_Prompt):
    parameters: LlmServingParameters = LlmServingParameters()
    stream: bool = False
