"""The multistage (not warp-specialized) tensor-core GEMM: ``c[...] = alpha * a @ b``, the comparison row of
benchmarks/gemm.py ("numbatma not warp-specialized"), built on numbatma's public API only.

Until issue 23 this kernel was ``numbatma.kernels.Gemm(..., warp_specialized=False)``; it is kept here, beside the
benchmark that measures what warp specialization buys, instead of as an option of the library kernel.

Design: the classic multistage kernel - the same tiles, stages and epilogue as :class:`numbatma.kernels.Gemm`, but
no producer warpgroup:

* 256 threads, two warpgroups that both compute: each owns 64 rows of the ``BM = 128`` rows of an output tile and a
  ``64 x bn`` float32 accumulator in registers; a persistent grid (one CTA per SM) walks the tiles in the grouped
  order (``tile_origin``, ``group_m`` tile rows at a time).
* Loads: thread 0 also TMA-loads, first the CTA's first ``stages`` k-steps, then, each time a stage is released (all
  8 warps arrived on its empty barrier), the k-step ``stages`` after the released one - so ``stages`` k-steps are
  always in flight, across tile boundaries.
* Per k-step: wait for the stage, four wgmma (``BK = 64``: four k-steps of 16), commit; with 2+ stages wait until
  the previous k-step's group is done and release its stage (one group stays in flight); with one stage wait for
  this group and release at once.
* Epilogue (each warpgroup for its 64 rows): ``alpha`` scaling in registers, conversion to C's type, TMA stores of
  128-byte-wide column chunks through two shared buffers per warpgroup (``store_buffers(2)``).

Shapes: ``a`` (M, K) row-major; ``b`` (K, N) row-major (``b_layout="kn"``) or (N, K) (``b_layout="nk"``: Bᵀ given);
``c`` (M, N). float16 or bfloat16 inputs (both the same), float32 accumulation, ``c`` float16, bfloat16 or float32.
M and K need not be multiples of the tile (partial tiles are zero-filled on load and clipped on store). TMA needs
16-byte row strides (K, and N for "kn", a multiple of 8 elements, or padded views); the TMA stores write whole
16-byte units of C's rows, so C's rows must be a whole number of them (N a multiple of 8 for 16-bit C, of 4 for
float32) - what :class:`numbatma.kernels.Gemm` does past that (ordinary stores for the tail) is not copied here.

Use::

    plan = MultistageGemm(a, b, c, b_layout="nk")   # any CUDA arrays: numba, CuPy, torch
    plan.launch()                                  # (a numbatma.kernels.Plan: launch(stream) returns c)
    gemm_multistage(a, b, c, b_layout="nk")        # the same, one call
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from numbatma import L2Promotion, Swizzle, TensorMap, TensorMapError, aligned_columns, array_layout
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    persistent_share,
    shared_view,
    store_buffers,
    tile_origin,
    tma_store,
    wgmma,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_scale,
    wgmma_store,
    wgmma_wait_group,
    wgmma_zeros,
)
from numbatma.kernels import Plan, persistent_grid, sm_count

__all__ = ["MultistageGemm", "gemm_multistage", "multistage_kernel", "BM", "BK", "THREADS"]

BM = 128  # two warpgroups x 64 rows
BK = 64  # 64 bf16/f16 = one 128-byte swizzle row
WARPGROUP = 128
THREADS = 2 * WARPGROUP
INPUT_DTYPES = ("bfloat16", "float16")
OUTPUT_DTYPES = ("bfloat16", "float16", "float32")
SMEM_LIMIT = 227 * 1024  # dynamic shared memory a block may use on sm_90
MAX_STAGES = 5


def tile_config(m, n, out_itemsize, bn=None, stages=None):
    """``(bn, stages, epilogue_cols, smem_bytes)``: numbatma.kernels.Gemm's tile rule (``bn = 256`` when N > 128 and
    there are 128 x 256 tiles for 3/4 of the SMs, else 128 when N > 64 and 128 x 128 tiles fill half of them, else
    64) and as many stages as shared memory holds (at most 5) next to the epilogue's buffers."""
    if bn is None:
        sms = sm_count()
        tiles_m = -(-m // BM)
        if n > 128 and tiles_m * -(-n // 256) * 4 >= 3 * sms:
            bn = 256
        elif n > 64 and tiles_m * -(-n // 128) * 2 >= sms:
            bn = 128
        else:
            bn = 64
    if bn not in (64, 128, 192, 256):
        raise TensorMapError(f"MultistageGemm: the tile width bn must be 64, 128, 192 or 256, got {bn!r}")
    epilogue_cols = 128 // out_itemsize
    stage_bytes = (BM + bn) * BK * 2
    epilogue_bytes = 2 * 2 * 64 * epilogue_cols * out_itemsize  # 2 warpgroups x 2 buffers
    fit = (SMEM_LIMIT - epilogue_bytes) // stage_bytes
    if stages is None:
        stages = min(MAX_STAGES, fit)
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= fit:
        raise TensorMapError(f"MultistageGemm: stages must be an int in 1..{fit} (what fits in {SMEM_LIMIT} bytes of "
                             f"shared memory with a {BM}x{bn}x{BK} tile), got {stages!r}")
    return bn, stages, epilogue_cols, stages * stage_bytes + epilogue_bytes


@functools.lru_cache(maxsize=None)
def multistage_kernel(nb_dtype, out_dtype, bn, stages, b_nk, group_m, epilogue_cols):
    """The kernel ``(a_map, b_map, c_map, m, n, k, alpha)`` for one configuration (every argument a compile-time
    constant of the closure): launch it with ``THREADS`` threads and ``tile_config``'s shared-memory bytes.
    ``nb_dtype`` / ``out_dtype``: the Numba element types of A's and C's TensorMaps (``map.numba_type.dtype``)."""
    a_elems = BM * BK
    stage_elems = (BM + bn) * BK
    b_groups = bn // 64
    out_itemsize = out_dtype.bitwidth // 8
    epi_elems = 64 * epilogue_cols  # one epilogue buffer, in elements of C
    epi_base = stages * stage_elems * 2 // out_itemsize  # after the stages, in elements of C
    chunks = bn // epilogue_cols
    lag = stages > 1  # keep one wgmma group in flight (with one stage: wait for each)
    acquire_buffer, publish_buffer = store_buffers(2)

    if b_nk:  # B given as (N, K): one K-major box per stage
        @cuda.jit(device=True, inline="always")
        def load_b(pipe, smem, b_map, base, n0, kt):
            pipe.load(shared_view(smem, base + a_elems, (bn, BK)), b_map, (n0, kt * BK))

        @cuda.jit(device=True, inline="always")
        def b_operand(smem, b_map, base, kk):
            return wgmma_desc(shared_view(smem, base + a_elems, (bn, BK)), b_map, "K", 0, 16 * kk)
    else:  # B given as (K, N): bn / 64 N-major boxes of BK x 64 side by side
        @cuda.jit(device=True, inline="always")
        def load_b(pipe, smem, b_map, base, n0, kt):
            for g in range(b_groups):
                pipe.load(shared_view(smem, base + a_elems + g * BK * 64, (BK, 64)), b_map, (kt * BK, n0 + 64 * g))

        @cuda.jit(device=True, inline="always")
        def b_operand(smem, b_map, base, kk):
            return wgmma_desc(shared_view(smem, base + a_elems, (b_groups, BK, 64)), b_map, "MN", 0, 16 * kk)

    @cuda.jit(device=True, inline="always")
    def origin(t, tiles_m, tiles_n):
        tm, tn = tile_origin(t, tiles_m, tiles_n, group_m)
        return tm * BM, tn * bn

    @cuda.jit(device=True, inline="always")
    def load_stage(pipe, smem, a_map, b_map, m0, n0, kt):
        """Acquire the next stage, TMA-load one k-step's A and B boxes into it, commit it (one thread)."""
        s = pipe.producer_acquire()
        base = s * stage_elems
        pipe.load(shared_view(smem, base, (BM, BK)), a_map, (m0, kt * BK))
        load_b(pipe, smem, b_map, base, n0, kt)
        pipe.producer_commit()

    @cuda.jit(device=True, inline="always")
    def load_step(pipe, smem, a_map, b_map, i, first, step, ktiles, tiles_m, tiles_n):
        """Load this CTA's ``i``-th k-step (counted over all its tiles)."""
        m0, n0 = origin(first + (i // ktiles) * step, tiles_m, tiles_n)
        load_stage(pipe, smem, a_map, b_map, m0, n0, i % ktiles)

    @cuda.jit(device=True, inline="always")
    def mma_stage(acc, smem, a_map, b_map, s, wg):
        """Warpgroup ``wg``'s four wgmma on stage ``s`` (its 64 rows of A times the B tile), committed."""
        base = s * stage_elems
        a_tile = shared_view(smem, base, (BM, BK))
        row = 64 * wg
        acc = wgmma_fence(acc)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 0), b_operand(smem, b_map, base, 0), 1)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 16), b_operand(smem, b_map, base, 1), 1)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 32), b_operand(smem, b_map, base, 2), 1)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 48), b_operand(smem, b_map, base, 3), 1)
        wgmma_commit_group()
        return acc

    @cuda.jit(device=True, inline="always")
    def epilogue(acc, cdyn, c_map, m0, n0, n, wg, tw, alpha, done):
        """Warpgroup ``wg``'s 64 rows of the tile: scale, convert, TMA-store ``epilogue_cols``-column chunks through
        two buffers. ``done``: chunks so far (the buffer of chunk ``j`` is ``j % 2``); returns it."""
        acc = wgmma_scale(acc, alpha)
        row = m0 + 64 * wg
        for j in range(chunks):
            tile = shared_view(cdyn, epi_base + (2 * wg + (done & 1)) * epi_elems, (64, epilogue_cols))
            done += 1
            acquire_buffer(wg, tw)  # the store that last read this buffer (two chunks ago) has read it
            wgmma_store(acc, tile, c_map, 0, j * epilogue_cols)
            if publish_buffer(wg, tw):  # (fence, warpgroup barrier; thread 0 stores)
                col = n0 + j * epilogue_cols
                if col < n:  # (chunks wholly right of C are not stored)
                    tma_store(c_map, (row, col), tile)
                bulk_commit_group()
        return done

    @cuda.jit
    def gemm_multistage_kernel(a_map, b_map, c_map, m, n, k, alpha):
        smem = cuda.shared.array(0, nb_dtype, alignment=1024)
        cdyn = cuda.shared.array(0, out_dtype, alignment=1024)  # (the same dynamic buffer, as C elements)
        pipe = Pipeline(stages, 1, 8)  # full: thread 0 + TMA bytes; empty: one arrival per warp
        tiles_m = (m + BM - 1) // BM
        tiles_n = (n + bn - 1) // bn
        ktiles = (k + BK - 1) // BK
        first, step, mine = persistent_share(tiles_m * tiles_n)
        total = mine * ktiles  # this CTA's k-steps over all its tiles
        wg = cuda.threadIdx.x // WARPGROUP
        tw = cuda.threadIdx.x - wg * WARPGROUP
        lane = cuda.threadIdx.x % 32
        loader = cuda.threadIdx.x == 0
        if loader:  # the first `stages` k-steps
            for i in range(min(stages, total)):
                load_step(pipe, smem, a_map, b_map, i, first, step, ktiles, tiles_m, tiles_n)
        done = 0
        i = 0  # this CTA's k-step counter
        for ti in range(mine):
            m0, n0 = origin(first + ti * step, tiles_m, tiles_n)
            acc = wgmma_zeros(bn)
            for kt in range(ktiles):
                s = pipe.consumer_wait()
                acc = mma_stage(acc, smem, a_map, b_map, s, wg)
                released = -1
                if lag:
                    if kt > 0:
                        acc = wgmma_wait_group(1, acc)
                        released = i - 1
                else:
                    acc = wgmma_wait_group(0, acc)
                    released = i
                if released >= 0:
                    if lane == 0:
                        pipe.consumer_release()
                    nxt = released + stages  # the k-step that goes into the stage just released
                    if loader and nxt < total:
                        load_step(pipe, smem, a_map, b_map, nxt, first, step, ktiles, tiles_m, tiles_n)
                i += 1
            if lag:  # the tile's last group
                acc = wgmma_wait_group(0, acc)
                if lane == 0:
                    pipe.consumer_release()
                nxt = i - 1 + stages
                if loader and nxt < total:
                    load_step(pipe, smem, a_map, b_map, nxt, first, step, ktiles, tiles_m, tiles_n)
            done = epilogue(acc, cdyn, c_map, m0, n0, n, wg, tw, alpha, done)
        if tw == 0:
            bulk_wait_group(0)

    return gemm_multistage_kernel


class MultistageGemm(Plan):
    """A planned ``c[...] = alpha * a @ b`` with the multistage kernel (see the module docstring); a
    :class:`numbatma.kernels.Plan`: ``launch(stream)`` runs it (asynchronously) and returns ``c``.

    Options: ``alpha`` (a real number), ``b_layout`` ("kn": b is (K, N); "nk": b is (N, K)), ``bn`` (64, 128, 192 or
    256; default: Gemm's rule), ``stages`` (default: as many as fit, at most 5), ``group_m`` (tile-order group),
    ``grid`` (CTAs; default one per SM, never more than there are tiles)."""

    writes = ("c",)
    overlap_note = "c's tiles are stored while other CTAs still load a and b"

    def __init__(self, a, b, c, *, alpha=1.0, b_layout="kn", bn=None, stages=None, group_m=8, grid=None):
        op = "MultistageGemm"
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
            raise TypeError(f"{op}: alpha must be a real number, got {alpha!r}")
        if b_layout not in ("kn", "nk"):
            raise TensorMapError(f"{op}: b_layout must be 'kn' (b is (K, N)) or 'nk' (b is (N, K)), got {b_layout!r}")
        if isinstance(group_m, bool) or not isinstance(group_m, int) or group_m < 1:
            raise TensorMapError(f"{op}: group_m must be an int >= 1, got {group_m!r}")
        la, lb, lc = array_layout(a), array_layout(b), array_layout(c)
        for what, lay in (("a", la), ("b", lb), ("c", lc)):
            if len(lay.shape) != 2:
                raise TensorMapError(f"{op}: {what} is a {lay.name}; it takes 2-D arrays.")
        if la.dtype.name not in INPUT_DTYPES or lb.dtype != la.dtype:
            raise TensorMapError(f"{op}: a is a {la.name} and b a {lb.name}; both must be bfloat16 or both float16.")
        if lc.dtype.name not in OUTPUT_DTYPES:
            raise TensorMapError(f"{op}: c is a {lc.name}; supported output dtypes: {', '.join(OUTPUT_DTYPES)}.")
        m, k = la.shape
        kb, n = lb.shape if b_layout == "kn" else lb.shape[::-1]
        if kb != k or lc.shape != (m, n):
            bshape = "(K, N)" if b_layout == "kn" else "(N, K)"
            raise TensorMapError(f"{op}: shapes do not multiply: a is {la.shape}, b is {lb.shape} (read as {bshape}), "
                                 f"c is {lc.shape}; need a (M, K), b {bshape}, c (M, N).")
        if m == 0 or n == 0 or k == 0:
            raise TensorMapError(f"{op}: empty problem (M, N, K) = {(m, n, k)}; every extent must be >= 1.")
        itemsize = lc.dtype.itemsize
        if aligned_columns(n, itemsize) != n:
            raise TensorMapError(
                f"{op}: c's rows are {n * itemsize} bytes (N = {n} {lc.dtype.name}), not a whole number of 16-byte "
                f"units: its TMA stores would write past them; use N a multiple of {16 // itemsize} (or "
                f"numbatma.kernels.Gemm, which stores such a tail exactly).")
        self.shape = (m, n, k)
        self.c = c
        self.alpha = float(alpha)
        self.b_layout = b_layout
        self.bn, self.stages, self.epilogue_cols, self.smem_bytes = tile_config(m, n, itemsize, bn, stages)
        self.group_m = group_m
        promo = L2Promotion.B256
        self.a_map = TensorMap(a, (BM, BK), swizzle=Swizzle.B128, l2_promotion=promo)
        if b_layout == "nk":
            self.b_map = TensorMap(b, (self.bn, BK), swizzle=Swizzle.B128, l2_promotion=promo)
        else:
            self.b_map = TensorMap(b, (BK, 64), swizzle=Swizzle.B128, l2_promotion=promo)
        self.c_map = TensorMap(c, (64, self.epilogue_cols), swizzle=Swizzle.B128)
        self.ntiles = -(-m // BM) * -(-n // self.bn)
        if grid is not None and (isinstance(grid, bool) or not isinstance(grid, int) or grid < 1):
            raise TensorMapError(f"{op}: grid must be an int >= 1 (CTAs), got {grid!r}")
        self.grid = persistent_grid(self.ntiles) if grid is None else min(grid, self.ntiles)
        self.block = THREADS
        self.flops = 2.0 * m * n * k
        self.kernel = multistage_kernel(self.a_map.numba_type.dtype, self.c_map.numba_type.dtype, self.bn,
                                        self.stages, b_layout == "nk", group_m, self.epilogue_cols)

    @property
    def shared_mem(self):
        return self.smem_bytes

    @property
    def args(self):
        """The kernel's arguments (valid offline, e.g. for ``numbatma.compile``)."""
        m, n, k = self.shape
        return (self.a_map, self.b_map, self.c_map, m, n, k, np.float32(self.alpha))

    @property
    def output(self):
        return self.c

    def __repr__(self):
        m, n, k = self.shape
        return (f"MultistageGemm({m}x{n}x{k}, b_layout={self.b_layout!r}, bn={self.bn}, stages={self.stages}, "
                f"group_m={self.group_m}, grid={self.grid})")


def gemm_multistage(a, b, c, stream=None, **options):
    """``c[...] = alpha * a @ b`` with a new :class:`MultistageGemm` (options as there), launched on ``stream``;
    returns ``c``. (Builds the plan every call: for timing, build once and time ``plan.launch``.)"""
    return MultistageGemm(a, b, c, **options).launch(stream)
