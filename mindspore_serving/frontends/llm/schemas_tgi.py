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


def _unsupported(name: str) -> ValueError:
    return ValueError(f"`{name}` is not supported by this server")


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

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value):
        if value is not None and not 0 < value <= MAX_BEST_OF:
            raise ValueError(f"`best_of` must be > 0 and <= {MAX_BEST_OF}. Given: {value}")
        return value

    @field_validator("temperature", "repetition_penalty", "top_k")
    @classmethod
    def _strictly_positive(cls, value, info: ValidationInfo):
        if value is not None and value <= 0:
            raise ValueError(f"`{info.field_name}` must be strictly positive")
        return value

    @field_validator("frequency_penalty")
    @classmethod
    def _frequency_penalty(cls, value):
        if value is not None and not -2.0 <= value <= 2.0:
            raise ValueError("`frequency_penalty` must be >= -2.0 and <= 2.0")
        if value:
            raise _unsupported("frequency_penalty")
        return value

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, value):
        if value is not None and not 0.0 < value < 1.0:
            raise ValueError("`top_p` must be > 0.0 and < 1.0")
        return value

    @field_validator("typical_p")
    @classmethod
    def _typical_p(cls, value):
        if value is not None and not 0.0 < value < 1.0:
            raise ValueError("`typical_p` must be > 0.0 and < 1.0")
        if value is not None:
            raise _unsupported("typical_p")
        return value

    @field_validator("max_new_tokens")
    @classmethod
    def _max_new_tokens(cls, value):
        if value is not None and value <= 0:
            raise ValueError("`max_new_tokens` must be strictly positive")
        return TGI_DEFAULT_MAX_NEW_TOKENS if value is None else value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        if len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(value)}")
        return value

    @field_validator("truncate")
    @classmethod
    def _truncate(cls, value):
        if value is not None:
            raise _unsupported("truncate")
        return value

    @field_validator("watermark")
    @classmethod
    def _watermark(cls, value):
        if value:
            raise _unsupported("watermark")
        return value

    @field_validator("seed")
    @classmethod
    def _seed(cls, value):
        if value is not None and value < 0:
            raise ValueError("`seed` must be positive")
        return value

    @field_validator("top_n_tokens")
    @classmethod
    def _top_n_tokens(cls, value):
        if value:
            raise ValueError("`top_n_tokens` != 0 is not allowed for this endpoint")
        return value

    @field_validator("grammar")
    @classmethod
    def _grammar(cls, value):
        if value is not None:
            raise _unsupported("grammar")
        return value

    @field_validator("adapter_id")
    @classmethod
    def _adapter_id(cls, value):
        if value is not None:
            raise _unsupported("adapter_id")
        return value

    @property
    def sampling(self) -> bool:
        """TGI samples when asked to, or when any sampling knob is set away from its neutral value."""
        return (self.do_sample or (self.temperature is not None and self.temperature != 1.0)
                or self.top_k is not None or (self.top_p is not None and self.top_p < 1.0))

    def engine_params(self) -> dict:
        return sampling_params(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                               top_k=self.top_k, top_p=self.top_p, repetition_penalty=self.repetition_penalty,
                               do_sample=self.sampling, seed=self.seed, stop=self.stop or None)


class TgiRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: str
    parameters: TgiParameters = TgiParameters()
    stream: bool = False
    """Read by the compat route `POST /` only."""
    add_special_tokens: bool = True

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value):
        if not value:
            raise ValueError("`inputs` cannot be empty")
        return value

    @field_validator("add_special_tokens")
    @classmethod
    def _add_special_tokens(cls, value):
        if not value:
            raise ValueError("`add_special_tokens` = false is not supported by this server")
        return value

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


class LlmServingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: str
    parameters: LlmServingParameters = LlmServingParameters()
    stream: bool = False

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value):
        if not value:
            raise ValueError("`inputs` cannot be empty")
        return value
