"""Tests that run under Numba's CUDA simulator: collected only when NUMBA_ENABLE_CUDASIM=1 (the main suite
starts them in a subprocess with that variable set: tests/test_simulator.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
        skip = pytest.mark.skip(reason="simulator tests run with NUMBA_ENABLE_CUDASIM=1 (tests/test_simulator.py)")
        for item in items:
            item.add_marker(skip)
