"""Tests that run under Numba's CUDA simulator: collected only when NUMBA_ENABLE_CUDASIM=1 (the main suite
starts them in subprocesses with that variable set, one per file or per shard of a long file:
tests/test_simulator.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))


HERE = os.path.dirname(os.path.abspath(__file__))


def _in_this_folder(item):
    return os.path.abspath(str(item.fspath)).startswith(HERE + os.sep)


def skip_without_the_simulator(items):
    """Without NUMBA_ENABLE_CUDASIM=1 these tests are skipped (they run in tests/test_simulator.py's subprocesses)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
        skip = pytest.mark.skip(reason="simulator tests run with NUMBA_ENABLE_CUDASIM=1 (tests/test_simulator.py)")
        for item in items:
            if _in_this_folder(item):
                item.add_marker(skip)


def keep_one_shard(config, items):
    """NUMBATMA_SIM_SHARD=k/n keeps every n-th test of this folder, starting at the k-th (0-based) in collection
    order, and deselects the others: tests/test_simulator.py runs a long file as n such subprocesses."""
    shard = os.environ.get("NUMBATMA_SIM_SHARD")
    if not shard:
        return
    try:
        k, n = (int(x) for x in shard.split("/"))
        assert 0 <= k < n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"NUMBATMA_SIM_SHARD must be k/n with 0 <= k < n, got {shard!r}") from None
    ours = [item for item in items if _in_this_folder(item)]
    drop = {id(item) for i, item in enumerate(ours) if i % n != k}
    if drop:
        config.hook.pytest_deselected(items=[item for item in items if id(item) in drop])
        items[:] = [item for item in items if id(item) not in drop]


def pytest_collection_modifyitems(config, items):
    # (a collection hook sees every item of the session: only touch the ones in this folder)
    skip_without_the_simulator(items)
    keep_one_shard(config, items)
