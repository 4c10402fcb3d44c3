"""The number of MindSpore CPU kernel threads a worker chooses: a model's register.Context(thread_num), the
largest when several models set one, else the cores the worker may run on."""
import os

import pytest

from mindspore_serving.server import register
from mindspore_serving.spec.servable import ModelSpec
from mindspore_serving.worker import cpu_threads


def model(context=None):
    return ModelSpec(model_key="m", model_files=("m.mindir",), model_format="MindIR", context=context)


def test_without_a_context_it_is_the_cores_the_worker_may_use(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5})
    assert cpu_threads.choose_cpu_threads([model(), model(register.Context())]) == (3, "the cores this worker may use")


def test_a_context_thread_num_wins_and_the_largest_of_several(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    specs = [model(register.Context(thread_num=3)), model(), model(register.Context(thread_num=6))]
    assert cpu_threads.choose_cpu_threads(specs) == (6, "register.Context(thread_num)")


def test_thread_num_is_checked_when_declared():
    with pytest.raises(RuntimeError, match="Parameter 'thread_num' should be >= 1"):
        register.Context(thread_num=0)
