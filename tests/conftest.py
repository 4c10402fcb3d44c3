import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

LONGEST_FIRST = (
    "tests/e2e/test_hf_serving.py",
    "tests/packaging/test_wheel_install.py",
    "tests/e2e/test_llm_tensor_parallel.py",
    "tests/faults/test_fault_agent_loss.py",
    "tests/faults/test_fault_readiness.py",
    "tests/faults/test_fault_drain.py",
    "tests/faults/test_fault_hangs.py",
)
"""Modules started first when pytest-xdist spreads the suite (`make test`: `-n 2 --dist loadscope`): a long module
begun last would leave one worker running alone at the end. The rest keep their order: the other processes' modules
(e2e, faults, security), then the unit tests, whose many short modules even out the workers' ends."""

SESSION_GROUPS = {
    "tests/e2e/test_llm_openai_features.py": "llm_server",
    "tests/e2e/test_llm_servable.py": "llm_server",
    "tests/e2e/test_llm_graph_oracle.py": "runner",
    "tests/e2e/test_llm_prompt_scores_oracle.py": "runner",
    "tests/e2e/test_llm_speculative_oracle.py": "runner",
    "tests/e2e/test_llm_verify_graphs.py": "runner",
}
"""The modules using a session-scoped fixture of tests/e2e/conftest.py (the shared LLM server, the in-process graph
runner), by fixture: pytest-xdist runs each such group on one worker, so that the fixture is made once. Checked at
collection against the fixtures the modules really use."""


@pytest.hookimpl(tryfirst=True)
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
    _check_session_groups(items)

    def rank(item):
        module = _module(item)
        if module in LONGEST_FIRST:
            return LONGEST_FIRST.index(module)
        return len(LONGEST_FIRST) + (0 if not module.startswith("tests/unit/") else 1)

    items.sort(key=rank)  # stable: each module's tests keep their order


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's loadscope, with a scope per module, or per group of SESSION_GROUPS."""
    from xdist.scheduler import LoadScopeScheduling  # only when pytest-xdist runs the suite

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return SESSION_GROUPS.get(module, module)

    return ModuleGroups(config, log)


def _module(item):
    return os.path.relpath(str(item.fspath), ROOT).replace(os.sep, "/")


def _check_session_groups(items):
    used = {}
    for item in items:
        for name, definitions in item._fixtureinfo.name2fixturedefs.items():
            definition = definitions[-1]
            if definition.scope == "session" and definition.baseid:  # baseid "": a plugin's (tmp_path_factory)
                used.setdefault(_module(item), set()).add(name)
    for module, names in used.items():
        if module not in SESSION_GROUPS or SESSION_GROUPS[module] not in names:
            raise pytest.UsageError(f"tests/conftest.py's SESSION_GROUPS must list {module} under one of {names}")
