import pytest

from gpuinfo import gpu_reason


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_modifyitems(config, items, _previous=pytest_collection_modifyitems):  # noqa: F811
    """Also: NUMBATMA_DESELECT=<regex> drops tests whose node id matches (used to keep a known fault on the
    GPU from taking down the other tests of its worker while it is investigated)."""
    _previous(config, items)
    import os
    import re

    pattern = os.environ.get("NUMBATMA_DESELECT")
    if pattern:
        keep = [item for item in items if not re.search(pattern, item.nodeid)]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
