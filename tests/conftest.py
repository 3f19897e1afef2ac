import os
import re

import pytest

from gpuinfo import gpu_reason


def skip_gpu_tests_without_a_gpu(items):
    """Tests marked ``gpu`` are skipped (with the reason) unless a GPU with TMA (compute capability 9.0+) is
    usable."""
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


def deselect_by_pattern(config, items):
    """NUMBATMA_DESELECT=<regex> drops tests whose node id matches (used to keep a known fault on the GPU from
    taking down the other tests of its worker while it is investigated)."""
    pattern = os.environ.get("NUMBATMA_DESELECT")
    if pattern:
        keep = [item for item in items if not re.search(pattern, item.nodeid)]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    # one named function per purpose: mark the GPU tests to skip, then drop the deselected ones
    skip_gpu_tests_without_a_gpu(items)
    deselect_by_pattern(config, items)
