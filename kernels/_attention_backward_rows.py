"""The two row kernels of :class:`numbatma.kernels.AttentionBackward` and their plans (split from
attention_backward.py: one idea a module): the preprocess - ``delta = rowsum(dO ∘ O)`` and ``lse · log2 e`` per
query row (padded to 64-row blocks), dq's float32 accumulator and the deterministic mode's turn counters zeroed - and
the postprocess - dq = ``scale`` x the accumulator, converted to q's type. A block a (batch, head) and 32 rows, each
row taken by as many lanes as it has words, up to 32 (preprocess) / one thread a word (postprocess), 8-byte words
where every row allows (:func:`aligned`), else 4-byte ones, 32-bit index arithmetic (numba widens to 64 bits, and a
64-bit division is a subroutine call)."""
from __future__ import annotations

import numpy as np
from numba import cuda, int32, uint32, uint64
from numba.cuda import libdevice

from numbatma import SIMULATING
from numbatma.intrinsics import pack_bf16x2, pack_f16x2, unpack_bf16x2, unpack_f16x2
from numbatma.views import ArrayLayout

from ._attention_config import LOG2E_F32, POS_INF, ZERO
from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync
from ._launch import ceil_div
from ._plan import Plan

BQ = 64  # query rows per block of the main kernel (the statistics are padded to whole blocks)
PREP_WARPS = 4  # warps per block of the preprocess kernel
PREP_ROWS = 8  # rows per warp of the preprocess kernel (a block: one (batch, head), 32 rows)

# -- preprocess and postprocess ------------------------------------------------------------------------------------
@cuda.jit(device=True, inline="always")
def _load_words(u, wide):
    """(lo, hi) 32-bit words of a 64-bit load (``wide``), or the word itself and 0."""
    return (uint32(u & 0xFFFFFFFF), uint32(u >> 32)) if wide else (uint32(u), uint32(0))


@kernel_factory
def _prep_kernel(kind, wide, d):
    """The preprocess for 16-bit elements ``kind``, ``wide`` (8-byte) or 4-byte words, head dim ``d``."""
    unpack = unpack_bf16x2 if kind == "bf16" else unpack_f16x2
    words = d * 2 // (8 if wide else 4)  # words of an o / do row
    lanes = min(32, words)  # lanes per row (a warp takes 32 // lanes rows at a time)
    per_lane = words // lanes  # words each lane reads of a row
    pairs_per_lane = d // 2 // lanes  # float32 pairs of the row's dq accumulator each lane zeroes
    group_rows = 32 // lanes
    steps = PREP_ROWS // group_rows  # row groups per warp and block

    @cuda.jit(device=True, inline="always")
    def dot(x, y):
        """sum of the elementwise products of two loads (four 16-bit elements each when ``wide``, else two)."""
        x0, x1 = _load_words(x, wide)
        y0, y1 = _load_words(y, wide)
        a_lo, a_hi = unpack(x0)
        b_lo, b_hi = unpack(y0)
        acc = a_lo * b_lo + a_hi * b_hi
        if wide:
            a_lo, a_hi = unpack(x1)
            b_lo, b_hi = unpack(y1)
            acc += a_lo * b_lo + a_hi * b_hi
        return acc

    @cuda.jit
    def prep(o_w, do_w, lse, stats, dqacc2, turns, heads, sq):
        """Block (x, y): batch-head ``x`` (``b * heads + h``), rows ``PREP_ROWS * (4 y + warp) ..`` of the padded
        length, ``lanes`` lanes a row (a warp takes ``32 // lanes`` rows at a time): stats[b, h, 0, i] =
        lse · log2 e and stats[b, h, 1, i] = sum(do * o) (+inf and 0 past the queries: P and dS are 0 there), dqacc's
        row = 0, and at a query block's first row its dQ turn counter (``deterministic``) = 0. o_w / do_w view the
        rows as 64-bit words (``wide``: four 16-bit elements) or 32-bit ones (two); dqacc2 as pairs of float32
        (uint64). The (batch, head) slices are taken once per block; index arithmetic in 32 bits."""
        grid_dependency_sync()
        lane = uint32(cuda.threadIdx.x % 32)
        g = uint32(lane // lanes)  # the warp's row of a group
        li = uint32(lane - g * lanes)  # the lane within its row
        bh = uint32(cuda.blockIdx.x)
        heads32 = uint32(heads)
        b = uint32(bh // heads32)
        h = uint32(bh - b * heads32)
        padded = uint32(stats.shape[3])
        sq32 = uint32(sq)
        o_r, do_r, acc_r, st_r, lse_r = o_w[b, h], do_w[b, h], dqacc2[b, h], stats[b, h], lse[b, h]
        first = uint32((cuda.blockIdx.y * PREP_WARPS + cuda.threadIdx.x // 32) * PREP_ROWS)
        for step in range(steps):
            i = uint32(first + step * group_rows + g)
            if i < padded:  # (the same for every row of the warp's group: padded is a multiple of 64)
                if li == 0 and i % BQ == 0:
                    turns[b, h, i // BQ] = 0
                acc = ZERO
                if i < sq32:
                    for k in range(per_lane):
                        j = uint32(li + k * lanes)
                        acc += dot(o_r[i, j], do_r[i, j])
                m = lanes // 2
                while m > 0:  # (constant trip count: unrolled; xor within the row's lanes - every lane of the warp
                    acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, m)  # shuffles, its other row past the queries too)
                    m //= 2
                if i < sq32:
                    for k in range(pairs_per_lane):
                        acc_r[i, uint32(li + k * lanes)] = uint64(0)
                    if li == 0:
                        st_r[0, i] = lse_r[i] * LOG2E_F32
                        st_r[1, i] = acc
                elif li == 0:
                    st_r[0, i] = POS_INF
                    st_r[1, i] = ZERO

    return prep


if SIMULATING:
    def _float_words(u):
        """The two float32 of a uint64 (bits 0-31, 32-63)."""
        lo, hi = np.array([int(u)], np.uint64).view(np.float32)
        return lo, hi
else:
    @cuda.jit(device=True, inline="always")
    def _float_words(u):
        """The two float32 of a uint64 (bits 0-31, 32-63): bit casts, no conversion."""
        return libdevice.int_as_float(int32(u & 0xFFFFFFFF)), libdevice.int_as_float(int32(u >> 32))


@kernel_factory
def _post_kernel(kind, wide):
    pack = pack_bf16x2 if kind == "bf16" else pack_f16x2

    @cuda.jit(device=True, inline="always")
    def scaled(u, scale):
        """A uint64 of two float32 -> one uint32 of two 16-bit values, each x ``scale``."""
        lo, hi = _float_words(u)
        return pack(lo * scale, hi * scale)

    @cuda.jit
    def post(dqacc2, dq_w, heads, sq, scale):
        """dq = scale x the float32 accumulator, rounded to nearest even: thread t converts the ``t``-th 64-bit
        word of dq (``wide``: four elements from two uint64 of the accumulator) or 32-bit word (two elements), over
        the rows in order; 32-bit index arithmetic."""
        grid_dependency_sync()
        per_row = uint32(dq_w.shape[3])
        t = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        row = uint32(t // per_row)  # (each product cast back to 32 bits: see prep)
        j = uint32(t - row * per_row)
        sq32 = uint32(sq)
        heads32 = uint32(heads)
        bh = uint32(row // sq32)
        i = uint32(row - bh * sq32)
        b = uint32(bh // heads32)
        h = uint32(bh - b * heads32)
        if b < uint32(dq_w.shape[0]):
            if wide:
                lo = scaled(dqacc2[b, h, i, 2 * j], scale)
                hi = scaled(dqacc2[b, h, i, 2 * j + 1], scale)
                dq_w[b, h, i, j] = uint64(lo) | (uint64(hi) << uint64(32))
            else:
                dq_w[b, h, i, j] = scaled(dqacc2[b, h, i, j], scale)

    return post


class _RowPlan(Plan):
    """A row kernel's plan, built only by :class:`numbatma.kernels.AttentionBackward` from views of the arrays it
    has checked already (no argument read-only where written, no overlap but the ones it allows) and of its own
    fresh float32 scratch: the argument rules are not checked again (a quarter of the backward plan's build time
    on the host)."""
    rebindable = False

    def _check_arguments(self, arrays, options):
        pass


class Prep(_RowPlan):
    writes = ("stats", "dqacc", "turns")

    def __init__(self, o_w, do_w, lse, stats, dqacc2, turns, kind, wide, heads, sq, batch_heads, padded, d):
        self.kernel = _prep_kernel(kind, wide, d)
        self.grid = (batch_heads, ceil_div(padded, PREP_WARPS * PREP_ROWS))
        self.block, self.shared_mem = 32 * PREP_WARPS, 0
        self._args = (o_w, do_w, lse, stats, dqacc2, turns, heads, sq)

    args = property(lambda self: self._args)
    output = property(lambda self: self._args[3])


class Post(_RowPlan):
    writes = ("dq_w",)
    BLOCK = 256

    def __init__(self, dqacc2, dq_w, kind, wide, heads, sq, scale, words):
        self.kernel = _post_kernel(kind, wide)
        self.grid, self.block, self.shared_mem = ceil_div(words, self.BLOCK), self.BLOCK, 0
        self._args = (dqacc2, dq_w, heads, sq, scale)

    args = property(lambda self: self._args)
    output = property(lambda self: self._args[1])


def word_layout(lay, wide):
    """The layout viewed as words along the (contiguous) head dim: uint64 (``wide``: four 16-bit elements, or two
    float32) or uint32 (two 16-bit elements)."""
    per = (8 if wide else 4) // lay.dtype.itemsize
    shape = lay.shape[:3] + (lay.shape[3] // per,)
    return ArrayLayout(lay.ptr, shape, lay.strides[:3] + (8 if wide else 4,), np.dtype(np.uint64 if wide else
                                                                                          np.uint32))


def aligned(lay, n):
    """Whether every row of the layout starts on an ``n``-byte boundary."""
    return lay.ptr % n == 0 and all(st % n == 0 for st in lay.strides[:3])
