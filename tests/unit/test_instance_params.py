"""Sampling parameters read from a classic instance's tensors (llm/instance_params.py): each field as the engine
takes it, whatever shape a tensor gave it, and the refusal of several choices."""

import json

import numpy as np
import pytest

from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.instance_params import prompt_of, sampling_params_of
from mindspore_serving.llm.sampling_params import SamplingParams, StructuredOutput


def test_every_field_reads_as_the_engine_takes_it():
    instance = {
        "prompt": np.array("Hi"),
        "max_new_tokens": np.array(8, np.int32),
        "presence_penalty": np.array(0.5, np.float32),
        "frequency_penalty": np.array(-1.0, np.float32),
        "min_p": np.array(0.25, np.float32),
        "min_tokens": np.array(2, np.int32),
        "bad_words": "world",
        "stop": "!",
        "allowed_token_ids": np.array([10, 11], np.int32),
        "stop_token_ids": np.array([2], np.int32),
        "structured_output": json.dumps({"type": "regex", "value": "[a-z]+"}),
        "logit_bias": np.array([[11, -100], [12, 5]], np.int32),
        "n": np.array(1, np.int32),
        "unrelated": np.array(1),
    }
    params = sampling_params_of(instance)
    assert prompt_of(instance) == "Hi"
    assert params == {
        "max_new_tokens": 8,
        "stop": ["!"],
        "stop_token_ids": [2],
        "presence_penalty": 0.5,
        "frequency_penalty": -1.0,
        "min_p": 0.25,
        "min_tokens": 2,
        "bad_words": ["world"],
        "allowed_token_ids": [10, 11],
        "logit_bias": [[11, -100], [12, 5]],
        "structured_output": '{"type": "regex", "value": "[a-z]+"}',
        "n": 1,
    }
    engine = SamplingParams.from_dict(params)
    assert engine.logit_bias == ((11, -100.0), (12, 5.0))
    assert engine.structured_output == StructuredOutput("regex", "[a-z]+")


def test_one_element_lists_and_logit_bias_as_json_text():
    params = sampling_params_of({"allowed_token_ids": np.array([7], np.int32), "logit_bias": '{"7": 1.5}'})
    assert params == {"allowed_token_ids": [7], "logit_bias": {"7": 1.5}}
    assert SamplingParams.from_dict(params).logit_bias == ((7, 1.5),)
    with pytest.raises(InvalidRequestError, match="logit_bias must be the JSON text of"):
        sampling_params_of({"logit_bias": "{7: 1.5}"})


@pytest.mark.parametrize("name", ["n", "best_of"])
def test_several_choices_are_refused_by_name(name):
    with pytest.raises(InvalidRequestError, match=f"{name} must be 1: the reply carries one generated text, got 2"):
        sampling_params_of({name: np.array(2, np.int32)})
