"""Device-side pieces shared by the ready-made kernels, written once: the grid-dependency prologue (the persistent
tile loop ``persistent_share`` and the TMA-store tail ``store_release`` are public blocks of
numbatma.intrinsics.warp_roles, which the kernels import from there).

A ``cuda.jit(device=True, inline="always")`` function: after inlining the kernel is the same code as when written
out by hand.
"""
from __future__ import annotations

from numba import cuda

from numbatma.intrinsics import griddepcontrol_launch_dependents, griddepcontrol_wait

__all__ = ["grid_dependency_sync"]


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
