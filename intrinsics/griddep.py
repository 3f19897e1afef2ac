"""Programmatic dependent launch (PDL): the device side of grid dependency control.

A kernel launched *dependent* (``numbatma.prepare_launch(..., dependent=True)`` or inside
``numbatma.dependent_launch()``: the launch attribute programmatic stream serialization) may start before the
kernel ahead of it on the stream has finished. The earlier kernel says when its dependents may start
(``griddepcontrol_launch_dependents``); the dependent kernel waits, where it first needs the earlier kernel's
results, until that kernel has completed and its memory is visible (``griddepcontrol_wait``). Whatever the
dependent does before its wait (setting up barriers, loading its own inputs, prefetching descriptors) overlaps the
tail of the earlier kernel.
"""
from __future__ import annotations

from ._asm import Ptx
from ._define import SIMULATING, device_op, emit_only
from numbatma.errors import TypingError

__all__ = ["griddepcontrol_launch_dependents", "griddepcontrol_wait"]

# PTX ISA 7.8, sm_90 and newer: every numbatma target has both.
LAUNCH_DEPENDENTS = Ptx("griddepcontrol.launch_dependents;", min_sm=90)
WAIT = Ptx("griddepcontrol.wait;", min_sm=90)

if not SIMULATING:
    from numba.cuda import types


def _hopper_only(op, ptx):
    """``emit_only(ptx)``, refused (a typing error at the kernel's line) when the kernel is compiled for a
    target older than sm_90: the typer's verdict is cached across targets, so the check is made here, at each
    lowering (a ptxas error on the PTX otherwise, far from the call)."""
    emit = emit_only(ptx)

    def codegen(context, builder, sig, args):
        from numbatma import _numba_internals as internals

        cc = internals.compile_capability()
        if cc is not None and tuple(cc[:2]) < (9, 0):
            target = f"sm_{cc[0]}{cc[1]}" + (str(cc[2]) if len(cc) > 2 else "")
            raise TypingError(
                f"{op}: grid dependency control ({ptx.text.rstrip(';')}) needs compute capability 9.0 or newer, but "
                f"this kernel is compiled for {target}; compile it for sm_90a (numbatma.compile.compile_ptx, "
                f"cuda.compile_ptx(..., cc=(9, 0, 'a')), or cuda.jit on an H100/H200), or leave the call out of "
                f"kernels for older GPUs", loc=internals.lowering_loc())
        return emit(context, builder, sig, args)

    return codegen


@device_op(simulate=lambda: sim_griddepcontrol_launch_dependents())
def griddepcontrol_launch_dependents(typingctx):
    """Signal that the kernels launched dependent on this one (programmatic stream serialization) may be
    scheduled: once every CTA of this grid has executed it or exited, the next kernel on the stream may start
    while this one still runs.

    A hint, not a hand-off: it publishes nothing (the dependent still calls ``griddepcontrol_wait`` before
    reading what this kernel writes, and that wait lasts until this kernel has completed), and the dependent
    may start later than the signal or only at this kernel's end. Calling it early (at the kernel's start)
    lets the dependent's prologue overlap the whole of this kernel; calling it late keeps the dependent's CTAs
    off the SMs this kernel still needs. Within a CTA the first call, by any thread, counts and repeated calls
    do nothing; in a kernel no dependent launch follows it does nothing.

    Simulator: the CUDA simulator runs launches one after another, so there is nothing to release: a no-op."""
    return types.void(), _hopper_only("griddepcontrol_launch_dependents", LAUNCH_DEPENDENTS)


@device_op(simulate=lambda: sim_griddepcontrol_wait())
def griddepcontrol_wait(typingctx):
    """Wait until the prerequisite grids (for a kernel launched dependent: the kernel before it on its stream)
    have completed and their memory operations are performed and visible to this grid. In a kernel launched
    without the attribute it returns at once (stream order already did the waiting).

    The caller guarantees: a kernel launched dependent that reads what an earlier kernel wrote (or writes what
    an earlier kernel still reads) calls it, in every thread that does so, before those accesses; only work
    that does not touch the earlier kernel's data may come before it. This holds whether or not the earlier
    kernel calls ``griddepcontrol_launch_dependents``: without the call, the exit of its last CTA releases
    the dependent, which may then start before the earlier kernel's writes are visible. The instruction is a compiler memory barrier too (loads are not
    moved above it).

    Simulator: the CUDA simulator runs launches one after another, so the earlier kernel has finished before
    this one starts: it returns at once."""
    return types.void(), _hopper_only("griddepcontrol_wait", WAIT)


# -- simulator semantics ----------------------------------------------------------------------------------------
def sim_griddepcontrol_launch_dependents():
    """``griddepcontrol.launch_dependents``: Numba's simulator runs each launch to its end before the next one
    starts (and numbatma's dependent launches are ordinary launches there), so no dependent grid waits to be
    released: nothing to do."""
    return None


def sim_griddepcontrol_wait():
    """``griddepcontrol.wait``: every kernel launched before this one in the simulator has completed and
    written its memory already (launches run one after another): return at once."""
    return None


PTX = {
    "griddepcontrol_launch_dependents": LAUNCH_DEPENDENTS,
    "griddepcontrol_wait": WAIT,
}
