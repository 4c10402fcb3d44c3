"""Request bodies of HuggingFace TGI's `/generate` family and of MindSpore LLM-serving's
`/models/{model}/generate` family (which copies TGI), and how they become engine parameters.

Field names, defaults and validation messages follow TGI (router `GenerateParameters`, `ValidationError`).
Options the engine cannot honour are accepted at their neutral value and rejected otherwise, by name.
"""
from typing import List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from mindspore_serving.common.errors import InvalidParam
from mindspore_serving.frontends.llm.params import sampling_params, stop_list

MAX_STOP_SEQUENCES = 4
MAX_BEST_OF = 1
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
    "best_of": [(_given(lambda value: not 0 < value <= MAX_BEST_OF),
                 lambda value: f"must be > 0 and <= {MAX_BEST_OF}. Given: {value}")],
    "temperature": [_STRICTLY_POSITIVE],
    "repetition_penalty": [_STRICTLY_POSITIVE],
    "frequency_penalty": [(_given(lambda value: not -2.0 <= value <= 2.0), "must be >= -2.0 and <= 2.0"),
                          (bool, _UNSUPPORTED)],
    "top_k": [_STRICTLY_POSITIVE],
    "top_p": [_OPEN_UNIT],
    "typical_p": [_OPEN_UNIT, (_is_set, _UNSUPPORTED)],
    "max_new_tokens": [_STRICTLY_POSITIVE],
    "stop": [(lambda value: len(value) > MAX_STOP_SEQUENCES,
              lambda value: f"supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(value)}")],
    "truncate": [(_is_set, _UNSUPPORTED)],
    "watermark": [(bool, _UNSUPPORTED)],
    "seed": [(_given(lambda value: value < 0), "must be positive")],
    "top_n_tokens": [(bool, "!= 0 is not allowed for this endpoint")],
    "grammar": [(_is_set, _UNSUPPORTED)],
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


class TgiParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    best_of: Optional[int] = None
    temperature: Optional[float] = None
    repetition_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    typical_p: Optional[float] = None
    do_sample: bool = False
    max_new_tokens: Optional[int] = TGI_DEFAULT_MAX_NEW_TOKENS
    return_full_text: Optional[bool] = None
    stop: List[str] = []
    truncate: Optional[int] = None
    watermark: bool = False
    details: bool = False
    decoder_input_details: bool = False
    seed: Optional[int] = None
    top_n_tokens: Optional[int] = None
    grammar: Optional[dict] = None
    adapter_id: Optional[str] = None

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

    @property
    def sampling(self) -> bool:
        """TGI samples when asked to, or when any sampling knob is set away from its neutral value."""
        return (self.do_sample or (self.temperature is not None and self.temperature != 1.0)
                or self.top_k is not None or (self.top_p is not None and self.top_p < 1.0))

    def engine_params(self) -> dict:
        return sampling_params(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                               top_k=self.top_k, top_p=self.top_p, repetition_penalty=self.repetition_penalty,
                               do_sample=self.sampling, seed=self.seed, stop=self.stop or None)


class TgiRequest(_Prompt):
    parameters: TgiParameters = TgiParameters()
    stream: bool = False
    """Read by the compat route `POST /` only."""
    add_special_tokens: bool = True

    _add_special_tokens = field_validator("add_special_tokens")(
        _refuse_false("`add_special_tokens` = false is not supported by this server"))

    def check_stream(self) -> None:
        if self.parameters.decoder_input_details:
            raise InvalidParam("`decoder_input_details` == true is not supported when streaming tokens",
                               "parameters.decoder_input_details")

    def check_generate(self) -> None:
        if self.parameters.decoder_input_details:
            raise InvalidParam("`decoder_input_details` == true is not supported by this server: the engine does "
                               "not report the prompt's tokens", "parameters.decoder_input_details")


class LlmServingParameters(BaseModel):
    """MindSpore LLM-serving's `parameters`, with its defaults. Unlike the reference server, seed, stop and
    repetition_penalty take effect, do_sample defaults to False as documented, and out-of-range values are
    rejected instead of silently clamped."""
    model_config = ConfigDict(extra="forbid")

    do_sample: Optional[bool] = False
    top_k: int = 3
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 300
    return_full_text: bool = True
    return_protocol: Literal["sse", "raw"] = "sse"
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    # TGI fields the reference accepts; taken at their neutral value, rejected otherwise
    details: bool = False
    decoder_input_details: bool = False
    top_n_tokens: Optional[int] = None
    truncate: Optional[int] = None
    typical_p: Optional[float] = None
    watermark: bool = False

    @model_validator(mode="after")
    def _neutral(self):
        active = [name for name, value in (("decoder_input_details", self.decoder_input_details),
                                           ("top_n_tokens", self.top_n_tokens),
                                           ("truncate", self.truncate), ("watermark", self.watermark))
                  if value]
        if self.typical_p is not None and self.typical_p != 1.0:
            active.append("typical_p")
        if active:
            raise ValueError(f"{', '.join(f'`{name}`' for name in active)} not supported by this server")
        return self

    def engine_params(self) -> dict:
        return sampling_params(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                               top_p=self.top_p, repetition_penalty=self.repetition_penalty,
                               do_sample=bool(self.do_sample), seed=self.seed,
                               stop=stop_list(self.stop, MAX_STOP_SEQUENCES, "parameters.stop"))


class LlmServingRequest(_Prompt):
    parameters: LlmServingParameters = LlmServingParameters()
    stream: bool = False
