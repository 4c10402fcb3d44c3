"""Sampling parameters carried as tensors in a classic instance (`{"prompt": ..., "max_new_tokens": ...}`).

A tensor holds a scalar, a string or a list of numbers, so:
  * list fields (stop_token_ids, allowed_token_ids) also take one number, and text-list fields (stop, bad_words)
    take one string;
  * logit_bias is `[[token id, bias], ...]` (integers) or the JSON text of `{"<token id>": bias}`;
  * structured_output is the JSON text of `{"type", "value"}`.
An instance's reply carries one text, so n and best_of must be 1 (refused by name otherwise).
"""

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from mindspore_serving.llm.errors import InvalidRequestError

# sampling fields accepted beside the prompt in an instance
SAMPLING_FIELDS = (
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
    "do_sample",
    "ignore_eos",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "min_p",
    "min_tokens",
    "bad_words",
    "allowed_token_ids",
    "logit_bias",
    "structured_output",
    "n",
    "best_of",
)
PROMPT_FIELDS = ("prompt", "inputs")
_TEXT_LISTS = ("stop", "bad_words")
_ID_LISTS = ("stop_token_ids", "allowed_token_ids")


def plain(value: Any) -> Any:
    """A value from the wire as a plain Python value (0-d and 1-element arrays become scalars)."""
    if isinstance(value, np.ndarray):
        if value.dtype == np.uint8 and value.ndim == 1 and value.size != 1:
            return value.tobytes().decode()
        if value.size == 1:
            return value.reshape(-1)[0].item()
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode()
    return value


def prompt_of(instance: Mapping[str, Any]) -> Any:
    for name in PROMPT_FIELDS:
        if name in instance:
            return plain(instance[name])
    raise KeyError("prompt")


def _field(name: str, value: Any) -> Any:
    if name in _TEXT_LISTS and isinstance(value, str):
        return [value]
    if name in _ID_LISTS and isinstance(value, int):
        return [value]
    if name == "logit_bias" and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise InvalidRequestError(
                'logit_bias must be the JSON text of {"<token id>": bias} or a list of [token id, bias] pairs'
            ) from None
    return value


def check_one_choice(params: dict) -> None:
    """Refuses n or best_of above 1: these replies carry one generated text."""
    for name in ("n", "best_of"):
        value = params.get(name)
        if value is not None and value != 1:
            raise InvalidRequestError(f"{name} must be 1: the reply carries one generated text, got {value!r}")


def sampling_params_of(instance: dict) -> dict:
    """The SamplingParams fields of an instance; InvalidRequestError when one cannot be read or asks for several
    choices."""
    params = {name: _field(name, plain(instance[name])) for name in SAMPLING_FIELDS if name in instance}
    check_one_choice(params)
    return params
