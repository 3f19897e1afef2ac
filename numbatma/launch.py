"""Prepared launches: a kernel's arguments converted once, launched many times.

A launch through numba-cuda (``kernel[grid, block, stream, smem](*args)``) types every argument, looks up the
compiled overload and marshals each argument again, every time: tens of microseconds of host time, which is
longer than a small GEMM runs. A plan that launches the same kernel with the same arguments again and again
(every kernel of :mod:`numbatma.kernels`) prepares the launch once instead.
"""
from __future__ import annotations

from ._env import SIMULATING

__all__ = ["prepare_launch"]


def prepare_launch(kernel, args, grid, block, shared_mem=0):
    """Return ``run(stream=0)``, which launches the ``cuda.jit`` kernel ``kernel`` on ``grid`` x ``block`` with
    ``shared_mem`` bytes of dynamic shared memory and the arguments ``args`` (compiling it now if needed).

    The arguments are converted now: arrays are passed by their current address and shape, descriptors by
    their current contents, scalars by value. Prepare again when any of them changes (a new array, a
    re-pointed TensorMap, another scalar); writing new data into the same arrays needs nothing. The prepared
    launch keeps ``args`` alive. Under the CUDA simulator, in debug builds, and for host (NumPy) array
    arguments it simply launches through numba each time."""
    if not SIMULATING:
        from ._numba_internals import prepare_launch as prepare

        run = prepare(kernel, args, grid, block, shared_mem)
        if run is not None:
            return run
    args = tuple(args)

    def run(stream=0):
        kernel[grid, block, stream, shared_mem](*args)

    return run
