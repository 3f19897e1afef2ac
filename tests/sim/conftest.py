"""Tests that run under Numba's CUDA simulator: collected only when NUMBA_ENABLE_CUDASIM=1 (the main suite
starts them in a subprocess with that variable set: tests/test_simulator.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))


HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    # (a collection hook sees every item of the session: only touch the ones in this folder)
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
        skip = pytest.mark.skip(reason="simulator tests run with NUMBA_ENABLE_CUDASIM=1 (tests/test_simulator.py)")
        for item in items:
            if os.path.abspath(str(item.fspath)).startswith(HERE + os.sep):
                item.add_marker(skip)
