"""The master's registry of live workers: routing by servable, version and method, and picking the least busy."""

import collections
import itertools

import pytest

from mindspore_serving.common import errors
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry, request_repr

_pids = itertools.count(1000)


def record(key, servable="add", version=1, methods=("add_common",), pid=None, batch_size=1, outstanding=0):
    return WorkerRecord(
        key=key,
        pid=pid if pid is not None else next(_pids),
        address=f"unix:{key}",
        servable_name=servable,
        version_number=version,
        batch_size=batch_size,
        methods={name: object() for name in methods},
        outstanding=outstanding,
    )


def registry_of(*records):
    registry = WorkerRegistry()
    for item in records:
        assert registry.add(item) is None
    return registry


def keys(records):
    return sorted(item.key for item in records)


# ---------------------------------------------------------------- request_repr


def test_request_repr():
    assert request_repr("add", "add_common", 0) == "servable(add) method(add_common) "
    assert request_repr("add", "add_common", 2) == "servable(add) method(add_common)  version(2) "


# ---------------------------------------------------------------- candidates


def test_version_0_picks_the_newest_running_version():
    registry = registry_of(
        record("a1", version=1),
        record("a3", version=3),
        record("b3", version=3),
        record("a2", version=2),
        record("other", servable="sub", version=9),
    )
    assert keys(registry.candidates("add", "add_common", 0)) == ["a3", "b3"]


def test_exact_version():
    registry = registry_of(record("a1", version=1), record("a2", version=2), record("b2", version=2))
    assert keys(registry.candidates("add", "add_common", 1)) == ["a1"]
    assert keys(registry.candidates("add", "add_common", 2)) == ["a2", "b2"]


def test_only_workers_with_the_method():
    registry = registry_of(record("a", methods=("add_common", "add_cast")), record("b", methods=("add_common",)))
    assert keys(registry.candidates("add", "add_cast", 0)) == ["a"]
    assert keys(registry.candidates("add", "add_common", 1)) == ["a", "b"]


@pytest.mark.parametrize(
    "servable, method, version, text",
    [
        ("nope", "add_common", 0, "Request servable(nope) method(add_common) , servable is not available"),
        ("add", "add_common", 5, "Request servable(add) method(add_common)  version(5) , servable is not available"),
        ("add", "missing", 0, "Request servable(add) method(missing) , method is not available"),
        ("add", "missing", 1, "Request servable(add) method(missing)  version(1) , method is not available"),
    ],
)
def test_unavailable_texts(servable, method, version, text):
    registry = registry_of(record("a1", version=1), record("a2", version=2))
    with pytest.raises(errors.ServableUnavailable) as info:
        registry.candidates(servable, method, version)
    assert str(info.value) == text
    assert info.value.code == errors.INVALID_INPUTS  # MindSpore Serving's code for what it does not serve


def test_empty_registry_has_no_servable():
    with pytest.raises(errors.ServableUnavailable) as info:
        WorkerRegistry().candidates("add", "add_common", 0)
    assert str(info.value) == "Request servable(add) method(add_common) , servable is not available"


def test_a_planned_servable_without_a_live_worker_is_unavailable_not_unknown():
    """Its worker died and is being restarted: the client is told to retry (gRPC UNAVAILABLE), with the same text."""
    registry = registry_of(record("other", servable="sub"))
    registry.expected = lambda name, version: name == "add" and version in (0, 1)
    for version, text in (
        (0, "Request servable(add) method(add_common) , servable is not available"),
        (1, "Request servable(add) method(add_common)  version(1) , servable is not available"),
    ):
        with pytest.raises(errors.WorkerUnavailable) as info:
            registry.candidates("add", "add_common", version)
        assert str(info.value) == text
        assert info.value.code == errors.WORKER_UNAVAILABLE
    with pytest.raises(errors.ServableUnavailable):  # a version this master does not run
        registry.candidates("add", "add_common", 2)
    with pytest.raises(errors.ServableUnavailable):
        registry.candidates("nope", "add_common", 0)


def test_newest_version_without_the_method_is_method_not_available():
    # version 0 routes to the newest version only, even when an older one has the method
    registry = registry_of(record("old", version=1, methods=("legacy",)), record("new", version=2, methods=("fresh",)))
    with pytest.raises(errors.ServableUnavailable) as info:
        registry.candidates("add", "legacy", 0)
    assert str(info.value) == "Request servable(add) method(legacy) , method is not available"
    assert keys(registry.candidates("add", "legacy", 1)) == ["old"]


# ---------------------------------------------------------------- pick


def test_pick_least_outstanding():
    registry = WorkerRegistry()
    busy, idle, busier = record("busy", outstanding=4), record("idle", outstanding=1), record("busier", outstanding=9)
    for _ in range(5):
        assert registry.pick([busy, idle, busier]) is idle


def test_ties_rotate():
    registry = WorkerRegistry()
    a, b, c = record("a"), record("b"), record("c", outstanding=2)
    picked = [registry.pick([a, b, c]).key for _ in range(6)]
    assert collections.Counter(picked) == {"a": 3, "b": 3}
    assert all(first != second for first, second in zip(picked, picked[1:]))


def test_ties_rotate_over_three_workers():
    registry = WorkerRegistry()
    workers = [record(name) for name in "xyz"]
    picked = [registry.pick(workers).key for _ in range(9)]
    assert collections.Counter(picked) == {"x": 3, "y": 3, "z": 3}
    assert picked[:3] == picked[3:6] == picked[6:]


def test_pick_follows_outstanding_as_it_changes():
    registry = WorkerRegistry()
    a, b = record("a"), record("b")
    first = registry.pick([a, b])
    first.outstanding += 2
    second = registry.pick([a, b])
    assert second is not first
    second.outstanding += 1
    assert registry.pick([a, b]) is second


# ---------------------------------------------------------------- bookkeeping


def test_add_replaces_the_record_with_the_same_key():
    registry = WorkerRegistry()
    first = record("add/v1/device0", pid=10)
    assert registry.add(first) is None
    second = record("add/v1/device0", pid=11)
    assert registry.add(second) is first
    assert registry.get("add/v1/device0") is second
    assert registry.all() == [second]


def test_remove_checks_the_pid():
    registry = registry_of(record("k", pid=10))
    assert registry.remove("k", pid=99) is None
    assert registry.get("k") is not None
    removed = registry.remove("k", pid=10)
    assert removed.pid == 10
    assert registry.get("k") is None
    assert registry.remove("k") is None


def test_remove_without_pid_and_clear():
    registry = registry_of(record("a"), record("b"))
    assert registry.remove("a").key == "a"
    assert keys(registry.clear()) == ["b"]
    assert registry.all() == []


def test_servable_versions():
    registry = registry_of(
        record("a3", version=3),
        record("a1", version=1),
        record("b3", version=3),
        record("s", servable="sub", version=7),
    )
    assert registry.servable_versions("add") == [1, 3]
    assert registry.servable_versions("sub") == [7]
    assert registry.servable_versions("none") == []


def test_candidates_are_cached_until_a_worker_comes_or_goes():
    registry = WorkerRegistry()
    registry.add(record("a", version=1))
    first = registry.candidates("add", "add_common", 0)
    assert registry.candidates("add", "add_common", 0) is first  # the same list while nothing changes
    registry.add(record("b", version=1))
    assert keys(registry.candidates("add", "add_common", 0)) == ["a", "b"]
    registry.add(record("c", version=2))
    assert keys(registry.candidates("add", "add_common", 0)) == ["c"]
    registry.remove("c")
    assert keys(registry.candidates("add", "add_common", 0)) == ["a", "b"]
    registry.clear()
    with pytest.raises(errors.ServableUnavailable):
        registry.candidates("add", "add_common", 0)


def test_record_input_names_are_read_once():
    from mindspore_serving.proto import internal_pb2

    method = internal_pb2.MethodSignature(name="m", input_names=["x1", "x2"])
    rec = WorkerRecord(
        key="k", pid=1, address="a", servable_name="s", version_number=1, batch_size=1, methods={"m": method}
    )
    assert rec.input_names("m") == ["x1", "x2"]
    assert rec.input_names("m") is rec.input_names("m")


def test_listeners_hear_every_registration_and_removal():
    registry = WorkerRegistry()
    heard = []
    registry.listeners.append(lambda change, record: heard.append((change, record.key)))
    first, second = record("a"), record("b")
    registry.add(first)
    registry.add(second)
    registry.remove("a")
    registry.remove("a")  # gone already: nothing to tell
    registry.clear()
    assert heard == [("added", "a"), ("added", "b"), ("removed", "a"), ("removed", "b")]
