"""Small helpers for scripts built on numbatma: is a suitable GPU here, a quick CUDA-event timer, and a
device-side random fill (no host round trip for large inputs)."""
from __future__ import annotations

import numpy as np
from numba import cuda  # module level: the simulator swaps it inside kernels defined here

from numbatma import SIMULATING


def small_problem():
    """True when an example should run a small problem: in the CUDA simulator (a Python thread per CUDA thread),
    or when ``NUMBATMA_SMALL_PROBLEMS=1`` (the GPU suite sets it to run the examples under compute-sanitizer,
    which slows every memory access down)."""
    import os

    return SIMULATING or os.environ.get("NUMBATMA_SMALL_PROBLEMS", "") not in ("", "0")


def gpu_problem(min_cc=(9, 0), feature="TMA", shared_bytes=0):
    """None when this process can run a kernel needing compute capability ``min_cc`` (and
    ``shared_bytes`` of shared memory per block), else a one-line reason to print."""
    need = f"compute capability {min_cc[0]}.{min_cc[1]}+"
    if SIMULATING:
        return f"the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) cannot run {feature} kernels; run it on a GPU with {need}"
    if not cuda.is_available():
        return f"it needs a CUDA GPU with {feature} ({need}); none was found"
    device = cuda.get_current_device()
    cc = device.compute_capability
    if cc < tuple(min_cc):
        return f"it needs {need} for {feature}; this GPU has {cc[0]}.{cc[1]}"
    if shared_bytes:
        optin = device.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        if optin < shared_bytes:
            return f"it needs {shared_bytes} bytes of shared memory per block; this GPU allows {optin}"
    return None


def gpu_or_simulator(script, min_cc=(9, 0), feature="TMA", shared_bytes=0):
    """For example scripts: return normally when this process can run the kernels - on a suitable GPU, or
    in the CUDA simulator (then ``numbatma.SIMULATING`` is true; use small shapes) - and otherwise say why
    and re-run the script in the simulator (the variable must be set before Numba is imported)."""
    import os
    import sys

    if SIMULATING:
        return
    reason = gpu_problem(min_cc, feature, shared_bytes)
    if reason is None:
        return
    print(f"{script}: {reason}; running it in the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) on a small problem.",
          flush=True)
    os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, NUMBA_ENABLE_CUDASIM="1"))


def median_ms(launch, warmup=2, runs=10):
    """Median time of ``launch()`` in milliseconds from CUDA events around each call, after ``warmup``
    untimed calls. (Host launch cost is included; benchmarks/bandwidth.py times blocks of launches.)"""
    for _ in range(warmup):
        launch()
    cuda.synchronize()
    times = []
    for _ in range(runs):
        start, stop = cuda.event(timing=True), cuda.event(timing=True)
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return float(np.median(times))


_fill_kernel = None


def fill_uniform(array, seed):
    """Fill a 2-D float32 device array with pseudo-random values in [-1, 1) on the GPU (an integer hash of
    each element's flat index and ``seed``: reproducible, no host transfer)."""
    global _fill_kernel
    if SIMULATING:  # the same values, computed by NumPy (a simulated 1024 x 256 launch takes minutes)
        k = np.arange(array.size, dtype=np.uint64)
        m = np.uint64(0xFFFFFFFF)
        h = (k * np.uint64(0x9E3779B1) + np.uint64(seed)) & m
        h ^= h >> np.uint64(16)
        h = (h * np.uint64(0x7FEB352D)) & m
        h ^= h >> np.uint64(15)
        h = (h * np.uint64(0x846CA68B)) & m
        h ^= h >> np.uint64(16)
        values = (h >> np.uint64(8)).astype(np.float32) * np.float32(2.0 ** -23) - np.float32(1.0)
        array.copy_to_device(values.reshape(array.shape))
        return
    if _fill_kernel is None:

        @cuda.jit
        def fill(a, seed):
            cols = a.shape[1]
            start, stride = cuda.grid(1), cuda.gridsize(1)
            for k in range(start, a.size, stride):
                h = (np.uint64(k) * np.uint64(0x9E3779B1) + np.uint64(seed)) & np.uint64(0xFFFFFFFF)
                h ^= h >> np.uint64(16)
                h = (h * np.uint64(0x7FEB352D)) & np.uint64(0xFFFFFFFF)
                h ^= h >> np.uint64(15)
                h = (h * np.uint64(0x846CA68B)) & np.uint64(0xFFFFFFFF)
                h ^= h >> np.uint64(16)
                a[k // cols, k % cols] = np.float32(h >> np.uint64(8)) * np.float32(2.0 ** -23) - np.float32(1.0)

        _fill_kernel = fill
    _fill_kernel[1024, 256](array, seed)
