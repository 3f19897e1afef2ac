"""Approximate float32 math on the SFU (MUFU), without the subnormal handling of ``math.exp2`` & co.

numba lowers ``math.exp2(x)`` to libdevice's ``exp2f``, which (without ``fastmath``, i.e. with denormals kept)
costs four instructions on sm_90: a compare with -126, a conditional halving of ``x``, ``MUFU.EX2`` and a
conditional squaring of the result. Kernels that only need ``exp2`` of values whose result may flush to zero below
2^-126 - a softmax, where every weight is added to a sum of at least 1 - take :func:`fast_exp2`: the one
instruction ``ex2.approx.ftz.f32`` (``MUFU.EX2``), with no ``fastmath`` for the rest of the kernel (whose
``-inf`` comparisons and exact divisions stay as written).
"""
from __future__ import annotations

import numpy as np

from ._asm import Ptx
from ._define import SIMULATING, device_op, fail

__all__ = ["fast_exp2"]

EX2_APPROX_FTZ = Ptx("ex2.approx.ftz.f32 $y, $x;", ins=(("x", "f32"),), out=("y", "f32"), memory=False, min_sm=20)

_TINY = np.float32(2.0 ** -126)  # the smallest normal float32: below it, ftz flushes to (signed) zero

if not SIMULATING:
    from numba.cuda import types


@device_op(simulate=lambda x: sim_fast_exp2(x))
def fast_exp2(typingctx, x):
    """``2 ** x`` in float32 by ``ex2.approx.ftz.f32`` (one ``MUFU.EX2``): relative error at most 2^-22.5 (the
    PTX ISA's bound for ``ex2.approx``), a subnormal ``x`` taken as 0, a result below 2^-126 flushed to +0;
    ``fast_exp2(-inf) = 0``, ``fast_exp2(+inf) = +inf``, NaN gives NaN. ``x``: a float32 (a float64 or an
    integer is refused: convert it, so that the conversion is visible). The caller guarantees that flushing
    results below 2^-126 to zero is harmless (a softmax's weights: they add to at least 1)."""
    if x != types.float32:
        fail("fast_exp2", f"x must be a float32 (ex2.approx.f32 takes one), got {x}; convert it with "
                          f"numpy.float32(...) first")

    def codegen(context, builder, sig, args):
        return EX2_APPROX_FTZ.emit(builder, x=args[0])

    return types.float32(types.float32), codegen


# -- simulator semantics ---------------------------------------------------------------------------------------
def sim_fast_exp2(x):
    """``ex2.approx.ftz.f32`` in NumPy float32: ``exp2`` of ``x`` (a subnormal ``x`` as 0), a result below 2^-126
    flushed to 0. (The hardware's last-bits error is not modelled: the simulator gives the rounded exact value.)"""
    if not isinstance(x, np.float32):  # (the GPU typer's rule: a Python float is a float64 there)
        raise TypeError(f"fast_exp2: x must be a float32, got {type(x).__name__} {x!r}; convert it with "
                        f"numpy.float32(...) first")
    if abs(x) < _TINY:
        x = np.float32(0.0)
    with np.errstate(over="ignore", under="ignore"):
        y = np.exp2(x, dtype=np.float32)
    return np.float32(0.0) if y < _TINY else y


PTX = {"fast_exp2": EX2_APPROX_FTZ}
