import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

LONGEST_FIRST = (
    "e2e/test_hf_serving.py",
    "e2e/test_llm_tensor_parallel.py",
    "faults/test_fault_agent_loss.py",
    "faults/test_fault_readiness.py",
    "faults/test_fault_drain.py",
    "faults/test_fault_hangs.py",
)
"""Modules started first when pytest-xdist spreads the suite (`make test` runs `-n 2 --dist loadgroup`): a long
module begun last would leave one worker running alone at the end. The rest keep their order: the other processes'
modules (e2e, faults, security), then the unit tests, whose many short modules even out the workers' ends."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(item.fspath)
        if os.sep + "e2e" + os.sep in path or os.sep + "security" + os.sep in path:
            item.add_marker(pytest.mark.e2e)
        if os.sep + "security" + os.sep in path:
            item.add_marker(pytest.mark.security)
        if os.sep + "faults" + os.sep in path:  # real processes too: `-m "not e2e"` leaves them out
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.faults)
    _group_for_xdist(items)


def _module(item):
    return os.path.relpath(str(item.fspath), os.path.join(ROOT, "tests")).replace(os.sep, "/")


def _shared_session_fixture(item):
    """The name of a session-scoped fixture of the suite's own conftests that the item uses, or None."""
    for name, definitions in item._fixtureinfo.name2fixturedefs.items():
        definition = definitions[-1]
        if definition.scope == "session" and definition.baseid:  # baseid "": a plugin's fixture (tmp_path_factory)
            return name
    return None


def _group_for_xdist(items):
    """One pytest-xdist group per module, so that a module's servers start once, on one worker; modules sharing a
    session-scoped server or runner share a group for the same reason. Items are ordered longest modules first."""
    groups = {}
    for item in items:
        shared = _shared_session_fixture(item)
        if shared is not None:
            groups[_module(item)] = shared
    for item in items:
        module = _module(item)
        item.add_marker(pytest.mark.xdist_group(groups.get(module, module)))

    def rank(item):
        module = _module(item)
        if module in LONGEST_FIRST:
            return LONGEST_FIRST.index(module)
        return len(LONGEST_FIRST) + (0 if not module.startswith("unit/") else 1)

    items.sort(key=rank)  # stable: each module's tests keep their order
