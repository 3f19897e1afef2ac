"""Device-side pieces shared by the ready-made kernels, written once: the persistent tile loop and the
TMA-store tail ("commit the stage's stores, wait until the store ``lag`` stages back has read its shared
memory, give that stage back").

All are ``cuda.jit(device=True, inline="always")`` functions (or factories of them, for compile-time
constants such as ``lag``): after inlining the kernel is the same code as when written out by hand.
"""
from __future__ import annotations

import functools

from numba import cuda

from numbatma.intrinsics import (bulk_commit_group, bulk_wait_group_read, griddepcontrol_launch_dependents,
                                 griddepcontrol_wait)

__all__ = ["persistent_share", "store_release", "grid_dependency_sync"]


@cuda.jit(device=True, inline="always")
def grid_dependency_sync():
    """Every kernel of :mod:`numbatma.kernels` calls this, in every thread, after its shared-memory set-up
    (barrier initialisation) and before its first access to global memory: ``griddepcontrol.wait`` (when the
    kernel was launched dependent, inside ``numbatma.dependent_launch()``: until the kernel before it on the
    stream has completed and its writes are visible; otherwise it returns at once), then
    ``griddepcontrol.launch_dependents`` (a dependent kernel launched after this one may start its own set-up
    now; it still waits for this kernel's end before touching memory). So a chain of plans launched dependent
    overlaps each kernel's launch and prologue with the tail of the one before."""
    griddepcontrol_wait()
    griddepcontrol_launch_dependents()


@cuda.jit(device=True, inline="always")
def persistent_share(ntiles):
    """This CTA's share of ``ntiles`` work items in a persistent grid: ``(first, step, mine)``; the CTA takes
    items ``first + i * step`` for ``i`` in ``range(mine)`` (``first = blockIdx.x``, ``step = gridDim.x``).
    The host side is :func:`numbatma.kernels._launch.persistent_grid`."""
    first = cuda.blockIdx.x
    step = cuda.gridDim.x
    mine = (ntiles - first + step - 1) // step
    return first, step, mine


@functools.lru_cache(maxsize=None)
def store_release(lag):
    """A device function ``release(pipe, i)`` for the consumer side of a :class:`Pipeline` whose stage ``i``
    (counted from 0 by this thread) was just TMA-stored: commit the stores issued as one bulk group; from the
    ``lag``-th stage on, wait until at most ``lag`` groups are still reading shared memory
    (``cp.async.bulk.wait_group.read lag``: the store of stage ``i - lag`` has read its tile) and release the
    oldest stage to the producer. ``lag = 0``: each stage is released once its own store has read it; ``1``:
    the store stays in flight while the next stage is computed. Call ``bulk_wait_group(0)`` once at the end.
    (CuTe DSL calls this a TMA-store pipeline.)"""

    @cuda.jit(device=True, inline="always")
    def release(pipe, i):
        bulk_commit_group()
        if i >= lag:
            bulk_wait_group_read(lag)
            pipe.consumer_release()

    return release
