"""Sampling parameters carried as tensors in a classic instance (`{"prompt": ..., "max_new_tokens": ...}`)."""
import numpy as np

# sampling fields accepted beside the prompt in an instance
SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "do_sample",
                   "ignore_eos", "stop", "stop_token_ids")
PROMPT_FIELDS = ("prompt", "inputs")


def plain(value):
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


def prompt_of(instance: dict):
    for name in PROMPT_FIELDS:
        if name in instance:
            return plain(instance[name])
    raise KeyError("prompt")


def sampling_params_of(instance: dict) -> dict:
    params = {}
    for name in SAMPLING_FIELDS:
        if name in instance:
            value = plain(instance[name])
            params[name] = [value] if name == "stop" and isinstance(value, str) else value
    return params
