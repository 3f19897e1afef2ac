import functools

import pytest


@functools.lru_cache(maxsize=None)
def gpu_reason():
    """None when a GPU with TMA (compute capability >= 9.0) is usable, else why not."""
    try:
        from numba import cuda

        if not cuda.is_available():
            return "no CUDA GPU/driver"
        cc = cuda.get_current_device().compute_capability
        if cc < (9, 0):
            return f"GPU has compute capability {cc}; TMA needs 9.0+"
    except Exception as exc:  # pragma: no cover - depends on the machine
        return f"CUDA unavailable: {exc}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
