"""Where a worker runs MindSpore's CPU kernels: the cores of its models' register.Context(thread_affinity_core_list)
(their union), and on how many threads: a model's register.Context(thread_num), the largest when several models set
one, else the cores the worker may run on."""

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


def test_the_cores_are_the_union_of_the_models_lists_and_none_when_no_model_sets_one():
    specs = [
        model(register.Context(thread_affinity_core_list=[3, 1])),
        model(),
        model(register.Context(thread_num=2)),
        model(register.Context(thread_affinity_core_list=(1, 2))),
    ]
    assert cpu_threads.declared_cores(specs) == [1, 2, 3]
    assert cpu_threads.declared_cores([model(), model(register.Context(thread_num=2))]) is None


def test_the_worker_is_bound_to_the_declared_cores_and_its_threads_follow_them(monkeypatch):
    allowed = {0, 1, 2, 3}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(allowed))

    def bind(cores):
        allowed.clear()
        allowed.update(cores)

    monkeypatch.setattr(cpu_threads, "bind_threads", bind)
    specs = [model(register.Context(thread_affinity_core_list=[2, 0]))]
    cpu_threads.apply_cpu_affinity(specs, "s")
    assert allowed == {0, 2}
    assert cpu_threads.choose_cpu_threads(specs) == (2, "the cores this worker may use")


def test_no_declared_cores_leaves_the_worker_where_it_is(monkeypatch):
    monkeypatch.setattr(cpu_threads, "bind_threads", lambda cores: pytest.fail("bound"))
    cpu_threads.apply_cpu_affinity([model(), model(register.Context(thread_num=1))], "s")


def test_a_core_the_worker_cannot_run_on_is_refused(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cpu_threads, "bind_threads", lambda cores: pytest.fail("bound"))
    with pytest.raises(RuntimeError) as info:
        cpu_threads.apply_cpu_affinity([model(register.Context(thread_affinity_core_list=[1, 4, 7]))], "add")
    assert str(info.value) == (
        "servable add: thread_affinity_core_list [1, 4, 7] names core(s) [4, 7] this worker "
        "cannot run on (its cores: [0, 1])"
    )
