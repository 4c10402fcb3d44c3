import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


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
