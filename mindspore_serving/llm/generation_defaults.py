"""A model's own generation defaults (Hugging Face's generation_config.json) and how a request's values win.

From generation_config.json come the sampling defaults vLLM takes from it (temperature, top_p, top_k,
repetition_penalty) and the end-of-sequence ids (`eos_token_id`: one id, or a list: LLaMA-3 stops on either of
<|end_of_text|> and <|eot_id|>). A request's own values always win; fields neither sets keep SamplingParams'
defaults. Other fields of the file (do_sample, max_length, ...) are not used.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mindspore_serving.llm.sampling_params import SamplingParams

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")


def _eos_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, (list, tuple)) else [value]
    if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"eos_token_id must be a token id or a list of token ids (ints >= 0), got {value!r}")
    return tuple(dict.fromkeys(ids))


@dataclass(frozen=True)
class GenerationDefaults:
    sampling: dict[str, Any] = field(default_factory=dict)
    """SamplingParams fields the model sets (a subset of SAMPLING_FIELDS)."""
    eos_token_ids: tuple[int, ...] = ()
    """The ids that end a generation; empty: the tokenizer's EOS."""

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> "GenerationDefaults":
        """From generation_config.json's content. ValueError naming the field when a value is not usable."""
        if not isinstance(data, Mapping):
            raise ValueError(f"must hold a JSON object, got {type(data).__name__}")
        sampling = {name: data[name] for name in SAMPLING_FIELDS if data.get(name) is not None}
        try:
            SamplingParams(**sampling)
        except ValueError as err:
            raise ValueError(str(err)) from None
        return cls(sampling, _eos_ids(data.get("eos_token_id")))

    def apply(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A request's sampling fields (only those it set) completed with the model's defaults."""
        return {**self.sampling, **params}

    def stop_ids(self, tokenizer_eos: int | None) -> tuple[int, ...]:
        """The end-of-sequence ids the engine stops on: the model's, else the tokenizer's EOS (as transformers'
        generate does)."""
        if self.eos_token_ids:
            return self.eos_token_ids
        return () if tokenizer_eos is None else (tokenizer_eos,)
