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

__all__ = ["fast_exp2", "poly_exp2"]

EX2_APPROX_FTZ = Ptx("ex2.approx.ftz.f32 $y, $x;", ins=(("x", "f32"),), out=("y", "f32"), memory=False, min_sm=20)

# poly_exp2: 2^x = 2^g · 2^r, r = the integer nearest x (x + 1.5·2^23 + 127 leaves r + 127 in the low mantissa
# bits), g = x - r in [-1/2, 1/2], 2^g by the cubic of least maximal relative error there (7.5e-5, 13.7 bits: more
# than a 16-bit P keeps), 2^r made from those bits by a shift into the exponent field, one multiplication.
POLY_EXP2_COEFFS = np.array([0.9999281167984009, 0.6932609677314758, 0.24261054396629333, 0.05517132207751274],
                            dtype=np.float32)  # c0 + c1 g + c2 g^2 + c3 g^3 (fitted here: Lawson's weighted LSQ)
_MAGIC = np.float32(12582912.0 + 127.0)  # 1.5 · 2^23 + the exponent bias
_LOW = np.float32(-127.0)  # x clamped below: 2^-127's bits are those of 0.0, so 2^x is then exactly 0


def _hex(v):
    return "0f%08X" % int(np.float32(v).view(np.uint32))


EX2_POLY = Ptx(
    "{ .reg .f32 f, t, r, p; .reg .b32 e; "
    f"max.NaN.f32 f, $x, {_hex(_LOW)}; add.rn.f32 t, f, {_hex(_MAGIC)}; sub.rn.f32 r, t, {_hex(_MAGIC)}; "
    "sub.rn.f32 f, f, r; "
    f"fma.rn.f32 p, f, {_hex(POLY_EXP2_COEFFS[3])}, {_hex(POLY_EXP2_COEFFS[2])}; "
    f"fma.rn.f32 p, p, f, {_hex(POLY_EXP2_COEFFS[1])}; fma.rn.f32 p, p, f, {_hex(POLY_EXP2_COEFFS[0])}; "
    "mov.b32 e, t; shl.b32 e, e, 23; mov.b32 t, e; mul.rn.ftz.f32 $y, p, t; }",
    ins=(("x", "f32"),), out=("y", "f32"), memory=False, min_sm=80)

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


@device_op(simulate=lambda x: sim_poly_exp2(x))
def poly_exp2(typingctx, x):
    """``2 ** x`` in float32 on the FMA units, no ``MUFU``: ``max.NaN`` (x clamped below at -127), two adds of
    1.5·2^23 + 127 that round x to the nearest integer r, three ``fma`` for 2^(x - r) (a cubic, relative error at
    most 7.5e-5, about 13.7 bits - finer than a bfloat16 or float16 weight keeps), a shift that makes 2^r and one
    ``mul.ftz``: nine instructions (FMNMX, FADD x3, FFMA x3, SHF, FMUL). Like :func:`fast_exp2`, results below
    2^-126 flush to 0 (``poly_exp2(-inf) = 0``) and NaN gives NaN; x from 127.5 to 128.5 gives +inf. The caller
    guarantees x <= 127 (beyond 128.5 the exponent wraps around: the simulator refuses any x above 127, +inf
    too). Use it beside :func:`fast_exp2` to take part of a kernel's ``exp2`` off the multi-function unit when
    that unit is the bottleneck."""
    if x != types.float32:
        fail("poly_exp2", f"x must be a float32, got {x}; convert it with numpy.float32(...) first")

    def codegen(context, builder, sig, args):
        return EX2_POLY.emit(builder, x=args[0])

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


def _fma32(a, b, c):
    """float32 fma: the product exact in float64, one rounding of the sum there, then to float32 (equal to the
    hardware's single rounding but in rare double-rounding ties)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def sim_poly_exp2(x):
    """:func:`poly_exp2`'s instructions in NumPy float32, step by step (so its results match the GPU's bits)."""
    if not isinstance(x, np.float32):
        raise TypeError(f"poly_exp2: x must be a float32, got {type(x).__name__} {x!r}; convert it with "
                        f"numpy.float32(...) first")
    if x > 127:
        from ._define import sim

        raise sim().SimulatedMisuse(f"poly_exp2: x = {float(x)!r} is above 127: on the GPU its exponent would wrap "
                                    f"around (use fast_exp2 for such x)")
    f = x if (np.isnan(x) or x >= _LOW) else _LOW
    t = np.float32(f + _MAGIC)
    r = np.float32(t - _MAGIC)
    g = np.float32(f - r)
    c0, c1, c2, c3 = POLY_EXP2_COEFFS
    p = _fma32(_fma32(_fma32(g, c3, c2), g, c1), g, c0)
    scale = np.array((int(np.array(t).view(np.uint32)) << 23) & 0xFFFFFFFF, dtype=np.uint32).view(np.float32)[()]
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.float32(p * scale)
    return np.float32(0.0) if abs(y) < _TINY else y  # (mul.ftz)


PTX = {"fast_exp2": EX2_APPROX_FTZ, "poly_exp2": EX2_POLY}
