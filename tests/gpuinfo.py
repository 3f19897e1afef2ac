"""Whether this machine can run the GPU tests (imported by conftest.py and by tests that need to know)."""
import functools


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
