"""Model control's logic without processes: version policies, the directory scan and its diff, the poller's
retries, ModelControl's reload keys, failures and drain, and the v2 load/unload parameters."""

import os

import pytest

from mindspore_serving.common import errors
from mindspore_serving.frontends.kserve import _control_parameters, version_parameter
from mindspore_serving.master import model_control as control
from mindspore_serving.master.worker_processes import WorkerPlan, WorkerProcess
from mindspore_serving.master.worker_registry import WorkerRecord, WorkerRegistry
from mindspore_serving.server.model_repository import (
    Change,
    RepositoryPoller,
    ServableSnapshot,
    VersionPolicy,
    parse_policies,
    plan_changes,
    scan,
)

# ---- version policy


@pytest.mark.parametrize(
    "text, available, selected",
    [
        ("latest:1", [1, 2, 3], {3}),
        ("latest", [1, 2], {2}),
        ("latest:2", [3, 1, 7], {3, 7}),
        ("latest:5", [1], {1}),
        ("all", [1, 4], {1, 4}),
        ("specific:1,3", [1, 2, 3], {1, 3}),
        ("specific:9", [1, 2], set()),
        ("latest:1", [], set()),
    ],
)
def test_version_policy_selects(text, available, selected):
    assert VersionPolicy.parse(text).select(available) == selected


@pytest.mark.parametrize("text", ["latest:0", "latest:x", "newest", "all:2", "specific:", "specific:0", "specific:a"])
def test_version_policy_rejects(text):
    with pytest.raises(ValueError, match="invalid version policy"):
        VersionPolicy.parse(text)


def test_parse_policies_default_and_per_servable():
    default, per = parse_policies("latest:2; add=specific:1,2 ;lenet=all")
    assert default == VersionPolicy("latest", 2)
    assert per == {"add": VersionPolicy("specific", 0, (1, 2)), "lenet": VersionPolicy("all", 0)}
    assert parse_policies("") == (VersionPolicy(), {})


# ---- scan and diff


def snap(config=("c",), **versions):
    return ServableSnapshot(config, {int(v[1:]): sig for v, sig in versions.items()})


LATEST = lambda _name: VersionPolicy()  # noqa: E731


def test_plan_loads_new_versions_before_unloading_old_ones():
    served = {("add", 1): (("c",), "s1")}
    changes = plan_changes({"add": snap(v1="s1", v2="s2")}, served, LATEST)
    assert changes == [Change("load", "add", 2), Change("unload", "add", 1)]


def test_plan_reloads_on_a_changed_config_or_folder_and_unloads_what_is_gone():
    served = {("add", 1): (("c",), "s1"), ("old", 1): (("c",), "s")}
    assert plan_changes({"add": snap(("c2",), v1="s1")}, served, LATEST)[0] == Change("load", "add", 1)
    assert plan_changes({"add": snap(v1="s1b")}, served, LATEST)[0] == Change("load", "add", 1)
    assert plan_changes({"add": snap(v1="s1")}, served, LATEST) == [Change("unload", "old", 1)]
    assert plan_changes({}, served, LATEST) == [Change("unload", "add", 1), Change("unload", "old", 1)]


def test_plan_follows_each_servables_policy():
    policies = {"add": VersionPolicy("all", 0)}
    changes = plan_changes(
        {"add": snap(v1="a", v2="b"), "mul": snap(v1="a", v2="b")}, {}, lambda name: policies.get(name, VersionPolicy())
    )
    assert changes == [Change("load", "add", 1), Change("load", "add", 2), Change("load", "mul", 2)]


def test_scan_reads_versions_and_ignores_other_entries(tmp_path):
    (tmp_path / "add" / "1").mkdir(parents=True)
    (tmp_path / "add" / "1" / "m.mindir").write_bytes(b"12")
    (tmp_path / "add" / "0").mkdir()
    (tmp_path / "add" / "x2").mkdir()
    (tmp_path / "add" / "servable_config.py").write_text("")
    (tmp_path / "no_config" / "1").mkdir(parents=True)
    found = scan(str(tmp_path))
    assert list(found) == ["add"] and list(found["add"].versions) == [1]
    before = found["add"].versions[1]
    (tmp_path / "add" / "1" / "m.mindir").write_bytes(b"123")
    assert scan(str(tmp_path), ["add"])["add"].versions[1] != before
    assert scan(str(tmp_path / "absent")) == {}


def test_poller_applies_changes_and_retries_a_failed_load_only_once_it_changed(tmp_path):
    os.makedirs(tmp_path / "add" / "1")
    (tmp_path / "add" / "servable_config.py").write_text("")
    calls, fail = [], {"add": True}

    def load(name, version):
        calls.append(("load", name, version))
        if fail[name]:
            raise RuntimeError("no model")

    poller = RepositoryPoller(str(tmp_path), None, LATEST, load, lambda n, v: calls.append(("unload", n, v)))
    poller.poll_once()
    poller.poll_once()
    assert calls == [("load", "add", 1)] and poller.served == {}
    fail["add"] = False
    (tmp_path / "add" / "1" / "m.mindir").write_bytes(b"1")
    poller.poll_once()
    os.makedirs(tmp_path / "add" / "2")
    poller.poll_once()
    poller.poll_once()
    assert calls[1:] == [("load", "add", 1), ("load", "add", 2), ("unload", "add", 1)]
    assert list(poller.served) == [("add", 2)]


# ---- ModelControl on fake processes


class FakeProcesses:
    def __init__(self):
        self.workers, self.loaded, self.terminated, self.fail = {}, [], [], None

    def of_servable(self, name):
        return [w for w in self.workers.values() if w.plan.servable_name == name]

    def load(self, plans):
        if self.fail:
            raise RuntimeError(self.fail)
        for plan in plans:
            self.workers[plan.key] = WorkerProcess(plan)
            self.loaded.append(plan.key)

    def detach(self, keys):
        return [self.workers.pop(key) for key in keys if key in self.workers]

    def terminate(self, worker, _grace):
        self.terminated.append(worker.plan.key)


def plan(version=1, device=0):
    return WorkerPlan("/s", "add", version, None, device, None, "AES-GCM")


def record(key, outstanding=0):
    return WorkerRecord(
        key=key,
        pid=1,
        address="a",
        servable_name="add",
        version_number=1,
        batch_size=1,
        methods={},
        outstanding=outstanding,
        channel=object(),
    )


@pytest.fixture
def setup():
    processes, registry, closed = FakeProcesses(), WorkerRegistry(), []
    return processes, registry, control.ModelControl(processes, registry, lambda: 1.0, closed.append), closed


def test_reload_starts_under_a_new_key_then_retires_the_old_worker(setup):
    processes, registry, model_control, closed = setup
    model_control.load([plan()])
    registry.add(record("add/v1/device0"))
    model_control.load([plan()])
    assert processes.loaded == ["add/v1/device0", "add/v1/device0/g1"]
    assert processes.terminated == ["add/v1/device0"] and registry.get("add/v1/device0") is None and len(closed) == 1
    model_control.load([plan(version=2)])  # another version serves beside it
    assert processes.terminated == ["add/v1/device0"]


def test_failed_load_and_unknown_unload_touch_nothing(setup):
    processes, registry, model_control, _ = setup
    model_control.load([plan()])
    processes.fail = "Fail to start workers: no model"
    with pytest.raises(errors.InvalidInputs, match="no model"):
        model_control.load([plan()])
    with pytest.raises(errors.InvalidInputs, match="not loaded"):
        model_control.unload("add", 2)
    with pytest.raises(errors.InvalidInputs, match="not loaded"):
        model_control.unload("mul")
    assert list(processes.workers) == ["add/v1/device0"] and processes.terminated == []


def test_unload_waits_for_outstanding_work(setup, monkeypatch):
    processes, registry, model_control, _ = setup
    model_control.load([plan()])
    busy = record("add/v1/device0", outstanding=2)
    registry.add(busy)
    polls = []

    def sleep(_seconds):
        polls.append(busy.outstanding)
        busy.outstanding = max(0, busy.outstanding - 1)

    monkeypatch.setattr(control.time, "sleep", sleep)
    model_control.unload("add")
    assert polls == [2, 1, 0] and processes.terminated == ["add/v1/device0"]


def test_load_by_name_maps_errors():
    model_control = control.ModelControl(FakeProcesses(), WorkerRegistry(), lambda: 1.0, lambda _c: None)
    with pytest.raises(errors.InvalidInputs, match="not enabled"):
        model_control.load_by_name("add")

    def plans_for(name, _version):
        if name == "missing":
            raise FileNotFoundError("servable 'missing' is not in the servable directory")
        raise RuntimeError("file 'servable_config.py' not exist")

    model_control.plans_for = plans_for
    with pytest.raises(errors.ServableUnavailable, match="not in the servable directory"):
        model_control.load_by_name("missing")
    with pytest.raises(errors.InvalidInputs, match="servable_config.py"):
        model_control.load_by_name("empty")
    for bad in ("", "../add", ".hidden", "a/b"):
        with pytest.raises(errors.InvalidInputs, match="invalid servable name"):
            model_control.load_by_name(bad)


def test_v2_control_parameters():
    assert _control_parameters(b"") == {} and _control_parameters(b'{"parameters": {"version": 2}}') == {"version": 2}
    assert version_parameter({}) == 0 and version_parameter({"version": "3"}) == 3
    for bad in (b"{", b"[1]", b'{"parameters": 1}'):
        with pytest.raises(errors.InvalidInputs):
            _control_parameters(bad)
    for bad in ({"version": "x"}, {"version": -1}, {"version": True}, {"version": 1.5}):
        with pytest.raises(errors.InvalidInputs):
            version_parameter(bad)
