import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if os.sep + "e2e" + os.sep in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
