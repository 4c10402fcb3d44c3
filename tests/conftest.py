import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(os.sep + tier + os.sep in str(item.fspath) for tier in ("e2e", "faults")):  # real processes
            item.add_marker(pytest.mark.e2e)
