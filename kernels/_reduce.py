"""The warp-reduction toolbox of the row kernels (:mod:`numbatma.kernels.rowsum`, :mod:`numbatma.kernels.softmax`):
device functions, made per compile-time configuration and cached.

* :func:`converters`: element <-> float32 for float32, float16 and bfloat16 (bits in uint16; round to
  nearest even, NaN kept);
* :data:`ld` / :data:`st`: shared-memory element access with an unsigned index;
* :func:`shuffle_reducers`: sum and max over aligned groups of 2..32 lanes (butterfly shuffles, unrolled);
* :func:`group_reducers`: sum and max over the threads of a row group, shuffles then (groups wider than a
  warp) a shared-memory exchange behind a named barrier.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int32, int64, uint16, uint64

from numbatma.intrinsics import named_barrier_sync

__all__ = ["FULL_MASK", "NEG_INF", "converters", "dev", "group_reducers", "ld", "shuffle_reducers", "st"]

FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)

def dev(fn):
    """``fn`` as an inlined device function."""
    return cuda.jit(device=True, inline="always")(fn)


# Shared-memory element access with a non-negative index: an unsigned index spares Numba's wraparound
# code for negative indices (a compare, a select and 64-bit adds per access).
ld = dev(lambda buf, i: buf[uint64(i)])


@dev
def st(buf, i, v):
    buf[uint64(i)] = v


@functools.lru_cache(maxsize=None)
def converters(dtype_name):
    """(to_f32, from_f32) for the element type as seen in shared memory."""
    if dtype_name == "float32":
        return dev(lambda v: v), dev(lambda v: v)
    if dtype_name == "float16":
        from numba.cuda.types import float16

        return dev(lambda v: float32(v)), dev(lambda v: float16(v))
    from numba.cuda import libdevice

    def bf16_to_f32(b):
        return libdevice.int_as_float(int32(int64(b) << 16))

    def f32_to_bf16(f):
        u = int64(libdevice.float_as_int(f)) & 0xFFFFFFFF
        if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN: keep it a (quiet) NaN
            return uint16((u >> 16) | 0x40)
        return uint16(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)  # round to nearest even

    return dev(bf16_to_f32), dev(f32_to_bf16)


def xor_level(inner, off, is_max):
    """``inner`` followed by one butterfly level: combine with the lane ``off`` away (xor)."""
    if is_max:

        def level(v):
            v = inner(v)
            return max(v, cuda.shfl_xor_sync(FULL_MASK, v, off))

    else:

        def level(v):
            v = inner(v)
            return v + cuda.shfl_xor_sync(FULL_MASK, v, off)

    return dev(level)


@functools.lru_cache(maxsize=None)
def shuffle_reducers(width):
    """(sum, max) over aligned groups of ``width`` lanes (a power of two <= 32), one shuffle per level,
    unrolled at definition time. Every lane of the warp must call them (full mask)."""
    red_sum = red_max = dev(lambda v: v)
    off = 1
    while off < width:
        red_sum = xor_level(red_sum, off, False)
        red_max = xor_level(red_max, off, True)
        off *= 2
    return red_sum, red_max


@functools.lru_cache(maxsize=None)
def group_reducers(tpr, warps):
    """(group_sum, group_max)(v, scratch, warp, lane, grp) over the ``tpr`` threads of a row group.
    Groups wider than a warp exchange warp results through ``scratch`` (2 * warps float32: max slots
    first, then sum slots) behind named barrier ``1 + grp``; alternating max/sum (softmax) keeps the
    slots from being overwritten before they are read."""
    warp_sum, warp_max = shuffle_reducers(min(tpr, 32))
    if tpr <= 32:

        def group_sum(v, scratch, warp, lane, grp):
            return warp_sum(v)

        def group_max(v, scratch, warp, lane, grp):
            return warp_max(v)

        return dev(group_sum), dev(group_max)
    wpg = tpr // 32

    def group_sum(v, scratch, warp, lane, grp):
        v = warp_sum(v)
        if lane == 0:
            scratch[warps + warp] = v
        named_barrier_sync(1 + grp, tpr)
        first = warps + grp * wpg
        v = scratch[first]
        for k in range(1, wpg):
            v += scratch[first + k]
        return v

    def group_max(v, scratch, warp, lane, grp):
        v = warp_max(v)
        if lane == 0:
            scratch[warp] = v
        named_barrier_sync(1 + grp, tpr)
        first = grp * wpg
        v = scratch[first]
        for k in range(1, wpg):
            v = max(v, scratch[first + k])
        return v

    return dev(group_sum), dev(group_max)

