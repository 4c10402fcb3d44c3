"""Readiness as a pure function of the master's phase, its planned workers and the registry: every servable needs
one registered worker that answers the heartbeat and can serve, and the master must be serving."""

import pytest

from mindspore_serving.master.readiness import (
    IDLE,
    NOT_READY,
    NOT_RESPONDING,
    READY,
    RESTARTING,
    SERVING,
    STARTING,
    STOPPED,
    STOPPING,
    PlannedWorker,
    readiness,
    readiness_from_json,
)
from mindspore_serving.master.worker_registry import WorkerRecord


def plan(key, servable, running=True, starts=1):
    return PlannedWorker(key=key, servable_name=servable, running=running, starts=starts)


def record(key, servable, version=1, pid=100, lost_reason=None, not_ready=""):
    return WorkerRecord(
        key=key,
        pid=pid,
        address="unix:x",
        servable_name=servable,
        version_number=version,
        batch_size=1,
        methods={},
        lost_reason=lost_reason,
        not_ready=not_ready,
    )


ADD, LLM = plan("add/v0/device0", "add"), plan("llama/v0/device0", "llama")


def test_ready_when_serving_and_every_servable_has_a_worker_that_can_serve():
    state = readiness(SERVING, [ADD, LLM], [record(ADD.key, "add", pid=7), record(LLM.key, "llama", version=2)])
    assert state.ready and state.live and state.reason == ""
    assert {name: (s.ready, s.state, list(s.versions)) for name, s in state.servables.items()} == {
        "add": (True, READY, [1]),
        "llama": (True, READY, [2]),
    }
    assert state.to_json()["servables"]["add"] == {
        "ready": True,
        "state": READY,
        "versions": [1],
        "workers": [{"key": ADD.key, "state": READY, "pid": 7, "version": 1}],
    }
    assert "reason" not in state.to_json()


@pytest.mark.parametrize(
    "phase, reason",
    [
        (IDLE, "no servable has been started"),
        (STARTING, "the servables are starting"),
        (STOPPING, "the server is stopping"),
    ],
)
def test_not_ready_outside_the_serving_phase_even_with_every_worker_registered(phase, reason):
    state = readiness(phase, [ADD], [record(ADD.key, "add")])
    assert not state.ready and state.live
    assert state.reason == reason and state.to_json()["reason"] == reason
    # a servable already up is ready while the others start, but none is while the server stops
    assert state.model_ready("add") is (phase != STOPPING)
    assert state.servables["add"].state == (STOPPING if phase == STOPPING else READY)


def test_no_servable_at_all_is_ready_once_serving():
    assert readiness(SERVING, [], []).ready


@pytest.mark.parametrize(
    "planned, records, state, reason",
    [
        (plan(ADD.key, "add"), [], "starting", "not registered yet"),
        (plan(ADD.key, "add", starts=2), [], RESTARTING, "died; not registered again yet"),
        (plan(ADD.key, "add", running=False, starts=6), [], STOPPED, "exited and not restarted"),
        (
            ADD,
            [record(ADD.key, "add", lost_reason="not responding (3 heartbeats missed)")],
            NOT_RESPONDING,
            "not responding (3 heartbeats missed)",
        ),
        (
            ADD,
            [record(ADD.key, "add", not_ready="the agents of add are restarting")],
            NOT_READY,
            "the agents of add are restarting",
        ),
    ],
)
def test_a_servable_without_a_worker_that_can_serve_is_not_ready_and_says_why(planned, records, state, reason):
    result = readiness(SERVING, [planned, LLM], records + [record(LLM.key, "llama")])
    assert not result.ready and result.servables["llama"].ready
    add = result.servables["add"]
    assert (add.ready, add.state, list(add.versions)) == (False, state, [])
    assert result.reason == f"servable add is {state} ({ADD.key}: {reason})"
    assert result.to_json()["servables"]["add"]["workers"][0]["reason"] == reason
    assert result.model_ready("add") is False and result.model_ready("llama") is True


def test_one_ready_worker_of_several_makes_its_servable_ready_and_the_others_are_still_listed():
    device1 = plan("add/v0/device1", "add", starts=2)
    state = readiness(SERVING, [ADD, device1], [record(ADD.key, "add")])
    assert state.ready
    assert [(w.key, w.state) for w in state.servables["add"].workers] == [(ADD.key, READY), (device1.key, RESTARTING)]


def test_model_ready_by_version_and_unknown_names():
    state = readiness(SERVING, [ADD], [record(ADD.key, "add", version=3)])
    assert state.model_ready("add") and state.model_ready("add", 3)
    assert state.model_ready("add", 2) is False
    assert state.model_ready("nope") is None


def test_a_registered_worker_without_a_plan_still_counts():
    state = readiness(SERVING, [], [record("extra/v1/device0", "extra")])
    assert state.ready and state.servables["extra"].workers[0].key == "extra/v1/device0"


def test_front_end_processes_get_the_same_readiness_from_its_json():
    planned = [ADD, plan("lenet/v0/device0", "lenet", starts=2)]
    for state in (
        readiness(SERVING, planned, [record("add/v0/device0", "add")]),
        readiness(SERVING, planned[:1], [record("add/v0/device0", "add", not_ready="agents restart")]),
        readiness(STOPPING, planned, []),
    ):
        copy = readiness_from_json(state.to_json())
        assert (
            copy == state and copy.reason == state.reason and copy.model_ready("add", 1) == state.model_ready("add", 1)
        )


def test_a_worker_between_its_death_and_its_new_process_is_restarting():
    """WorkerProcesses' view of a worker whose death it is handling (no process yet, one start so far)."""
    import threading
    from types import SimpleNamespace

    from mindspore_serving.master.worker_processes import WorkerProcesses

    processes = WorkerProcesses.__new__(WorkerProcesses)  # without its start-up clean-up of shared memory
    processes._lock = threading.Lock()
    plan = SimpleNamespace(key="add/v1/device0", servable_name="add")
    processes.workers = {plan.key: SimpleNamespace(plan=plan, process=None, starts=1, restarting=True)}
    (planned,) = processes.planned()
    assert planned.running and planned.starts == 2
