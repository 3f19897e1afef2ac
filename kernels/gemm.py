"""GEMM on Hopper tensor cores: ``C = alpha * A @ B + beta * C`` with TMA, wgmma and warp specialization,
written with numbatma's public API only.

Design: a persistent grid of one CTA per SM, 384 threads in three
warpgroups.

* **Producer** (warpgroup 0, ``setmaxnreg_dec(40)``): one elected thread walks this CTA's output tiles and their
  k-steps and TMA-loads, for each k-step, the A tile (``BM x BK``, 128-byte swizzle) and the B tile (``BN x BK``
  when B is given as (N, K): K-major; ``BN / 64`` boxes of ``BK x 64`` when B is (K, N): N-major) into the next
  free stage of a ``stages``-deep :class:`numbatma.intrinsics.Pipeline` (the stage's barrier expects the
  boxes' bytes).
* **Consumers** (warpgroups 1 and 2, ``setmaxnreg_inc(232)``): each owns 64 rows of the ``BM = 128`` rows of a
  tile and a ``64 x BN`` float32 accumulator in registers (``BN / 2`` per thread). Per k-step: wait for the
  stage, ``BK / 16`` wgmma (descriptors from :func:`wgmma_desc`), commit, wait until the previous k-step's
  group is done and release its stage (one arrival per warp) - so one group is always in flight.
* **Epilogue** (each consumer warpgroup for its 64 rows): ``alpha`` scaling in registers, optionally
  ``+ beta * C`` (the C chunk TMA-loaded into shared memory first), conversion to C's type and a TMA store,
  in chunks of 128-byte-wide columns through two buffers per warpgroup (a chunk is written while the previous
  one's store is in flight). Columns past the last 16-byte unit of C's rows get ordinary stores (TMA stores
  never write outside C: ``_exact_store``).
* **Tile order**: tiles are numbered in groups of ``group_m`` tile rows (consecutive CTAs share B tiles and
  A tiles in L2).

The classic multistage kernel (two warpgroups that both compute, one of whose threads also issues the TMA loads
``stages`` k-steps ahead), once ``Gemm(..., warp_specialized=False)``, is a comparison row of the benchmark only:
``benchmarks/gemm_multistage.py``.

Shapes: A (M, K) row-major; B (K, N) row-major (``b_layout="kn"``) or (N, K) (``b_layout="nk"``: Bᵀ given);
C (M, N). bfloat16 or float16 inputs (both the same), float32 accumulation, C bfloat16, float16 or float32.
Any M, N, K that TMA can describe (every row 16-byte aligned: K, and N for "kn", a multiple of 8 elements,
or padded views); partial tiles are zero-filled on load and clipped on store.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from numbatma import (L2Promotion, SIMULATING, Swizzle, TensorMap, TensorMapError, array_layout, cluster_kernel,
                      max_active_clusters)
from numbatma.intrinsics import (
    Pipeline,
    cluster_ctarank,
    cluster_sync,
    bulk_commit_group,
    bulk_wait_group,
    elect_one_sync,
    fence_mbarrier_init,
    lagged_release,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_ref,
    mbarrier_wait_parity,
    register_budget,
    shared_view,
    store_buffers,
    tile_origin,
    tma_load,
    tma_store,
    wgmma,
    wgmma_add_tile,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_scale,
    wgmma_store,
    wgmma_zeros,
    warp_specialize,
    warpgroup_sync,
)

from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync
from ._exact_store import ExactStore, tail_store_2d
from . import _launch
from ._launch import SMEM_PER_BLOCK, ceil_div, persistent_grid
from ._options import choice_option, int_option, scalar_option
from ._plan import Plan, run

__all__ = ["Gemm", "gemm", "GemmConfig"]

BM = 128  # two consumer warpgroups x 64 rows
BK = 64  # 64 bf16/f16 = one 128-byte swizzle row
WARPGROUP = 128
BUDGET = register_budget(2)  # one producer warpgroup (40 registers) and two consumers (232): 168 x 384 at launch
MAX_REGISTERS = BUDGET.launch
INPUT_DTYPES = ("bfloat16", "float16")
OUTPUT_DTYPES = ("bfloat16", "float16", "float32")
_STATIC_SMEM = 1024  # barriers (static shared memory, before the 1024-aligned dynamic buffer)


@dataclass(frozen=True)
class GemmConfig:
    """What a :class:`Gemm` plan runs: the output tile ``(BM, bn)``, k-step ``BK``, pipeline ``stages``, the
    tile-order group and the grid."""

    bn: int
    stages: int
    group_m: int
    epilogue_cols: int  # columns of C per epilogue chunk (128 bytes)
    smem_bytes: int
    cluster_m: int = 1  # 2: pairs of CTAs on neighbouring row tiles share (multicast) the B tile

    @property
    def tile(self):
        return (BM, self.bn, BK)


def default_config(m, n, k, out_itemsize, *, bn=None, stages=None, group_m=8, cluster_m=None, b_nk=True):
    """The tile heuristic: the widest tile that still keeps the SMs busy - ``bn = 256`` (the widest wgmma, the
    most work per byte loaded) when N > 128 and there are 128 x 256 tiles for at least 3/4 of the SMs, else
    ``bn = 128`` when N > 64 and there are 128 x 128 tiles for at least half of them, else 64 (measured on an
    H100: 1024^3 runs faster on 128 narrow tiles than on 64 wider ones; 128 when ``cluster_m=2`` with B given as
    (K, N), which needs an even number of 64-column boxes); as many stages as shared memory
    holds (at most 5) next to the epilogue's buffers."""
    if bn is None:
        sms = _launch.sm_count()
        tiles_m = ceil_div(m, BM)
        if n > 128 and tiles_m * ceil_div(n, 256) * 4 >= 3 * sms:
            bn = 256
        elif n > 64 and tiles_m * ceil_div(n, 128) * 2 >= sms:
            bn = 128
        else:
            bn = 64
        if cluster_m == 2 and not b_nk and bn == 64:
            bn = 128  # (K, N) boxes are 64 columns wide: the two CTAs of a cluster share an even number
    if bn % 64 or not 64 <= bn <= 256:
        raise TensorMapError(f"Gemm: the tile width bn must be 64, 128, 192 or 256, got {bn}")
    epilogue_cols = 128 // out_itemsize
    stage_bytes = (BM + bn) * BK * 2
    epilogue_bytes = 2 * 2 * 64 * epilogue_cols * out_itemsize  # 2 warpgroups x 2 buffers
    fit = (SMEM_PER_BLOCK - _STATIC_SMEM - epilogue_bytes) // stage_bytes
    if stages is None:
        stages = min(5, fit)
    if not 1 <= stages <= fit:
        raise TensorMapError(
            f"Gemm: stages={stages} with a {BM}x{bn}x{BK} tile needs {stages * stage_bytes + epilogue_bytes} bytes "
            f"of shared memory; at most {fit} stages fit in the {SMEM_PER_BLOCK} bytes a block may use")
    # Two CTAs split the B tile evenly (each multicasts its share to both; every CTA's stage barrier expects
    # twice its own share): (N, K) boxes split in row halves, (K, N) tiles are bn / 64 boxes, split two ways.
    symmetric = b_nk or (bn // 64) % 2 == 0
    if cluster_m is None:  # H100 (benchmarks/RESULTS.md): +1.2% at 8192^3 since the CTA-scope release; one run
        cluster_m = 1
    if cluster_m not in (1, 2):
        raise TensorMapError(f"Gemm: cluster_m must be 1 or 2, got {cluster_m}")
    if cluster_m == 2 and not symmetric:
        raise TensorMapError(f"Gemm: cluster_m=2 with B given as (K, N) needs bn = 128 or 256 (an even number of "
                             f"64-column boxes for the two CTAs to share), got bn={bn}")
    return GemmConfig(bn, stages, int(group_m), epilogue_cols,
                      stages * stage_bytes + epilogue_bytes, int(cluster_m))


@kernel_factory
def _gemm_kernel(nb_dtype, out_dtype, bn, stages, b_nk, group_m, epilogue_cols, has_beta,
                 tma_part, has_tail, cluster_m=1):
    """The kernel for one configuration (every argument a compile-time constant of the closure).
    ``cluster_m == 2``: clusters of two CTAs on neighbouring row tiles of the same column tile; each loads
    half of the B tile and multicasts it to both."""
    a_elems = BM * BK
    stage_elems = (BM + bn) * BK
    b_groups = bn // 64
    out_itemsize = out_dtype.bitwidth // 8
    epi_elems = 64 * epilogue_cols  # one epilogue buffer, in elements of C
    epi_base = stages * stage_elems * 2 // out_itemsize  # after the stages, in elements of C
    chunks = bn // epilogue_cols
    lag_waits = 1 if stages > 1 else 0
    store_tail = tail_store_2d((64, epilogue_cols), out_itemsize, swizzle=128)
    acquire_buffer, publish_buffer = store_buffers(2)  # two epilogue buffers per consumer warpgroup

    half = bn // 2
    if b_nk and cluster_m == 2:  # each CTA of the pair loads half of the (N, K) box and multicasts it
        @cuda.jit(device=True, inline="always")
        def load_b(pipe, smem, b_map, base, n0, kt):
            r = cluster_ctarank()
            pipe.load_multicast(shared_view(smem, base + a_elems + r * half * BK, (half, BK)), b_map,
                                (n0 + r * half, kt * BK), 3)
    elif cluster_m == 2:  # (K, N): each CTA loads every other 64-column box and multicasts it
        @cuda.jit(device=True, inline="always")
        def load_b(pipe, smem, b_map, base, n0, kt):
            for g in range(cluster_ctarank(), b_groups, 2):
                pipe.load_multicast(shared_view(smem, base + a_elems + g * BK * 64, (BK, 64)), b_map,
                                    (kt * BK, n0 + 64 * g), 3)
    elif b_nk:  # B given as (N, K): one K-major box per stage
        @cuda.jit(device=True, inline="always")
        def load_b(pipe, smem, b_map, base, n0, kt):
            pipe.load(shared_view(smem, base + a_elems, (bn, BK)), b_map, (n0, kt * BK))
    else:  # B given as (K, N): bn / 64 N-major boxes of BK x 64 side by side
        @cuda.jit(device=True, inline="always")
        def load_b(pipe, smem, b_map, base, n0, kt):
            for g in range(b_groups):
                pipe.load(shared_view(smem, base + a_elems + g * BK * 64, (BK, 64)), b_map, (kt * BK, n0 + 64 * g))

    if b_nk:
        @cuda.jit(device=True, inline="always")
        def b_operand(smem, b_map, base, kk):
            return wgmma_desc(shared_view(smem, base + a_elems, (bn, BK)), b_map, "K", 0, 16 * kk)
    else:
        @cuda.jit(device=True, inline="always")
        def b_operand(smem, b_map, base, kk):
            return wgmma_desc(shared_view(smem, base + a_elems, (b_groups, BK, 64)), b_map, "MN", 0, 16 * kk)

    if cluster_m == 2:
        @cuda.jit(device=True, inline="always")
        def release(pipe):
            """Give the oldest stage back to the producers of both CTAs (they multicast into it)."""
            pipe.consumer_release_remote(cluster_ctarank() ^ 1)
            pipe.consumer_release()

        @cuda.jit(device=True, inline="always")
        def work(t, tiles_m, tiles_n):
            """Unit t of the cluster: a pair of row tiles (this CTA takes the one of its rank)."""
            tm, tn = tile_origin(t, (tiles_m + 1) // 2, tiles_n, group_m)
            return (2 * tm + cluster_ctarank()) * BM, tn * bn

        @cuda.jit(device=True, inline="always")
        def units(tiles_m, tiles_n):
            return (tiles_m + 1) // 2 * tiles_n, cuda.blockIdx.x // 2, cuda.gridDim.x // 2
    else:
        release = None  # (lagged_release's default: pipe.consumer_release())

        @cuda.jit(device=True, inline="always")
        def work(t, tiles_m, tiles_n):
            tm, tn = tile_origin(t, tiles_m, tiles_n, group_m)
            return tm * BM, tn * bn

        @cuda.jit(device=True, inline="always")
        def units(tiles_m, tiles_n):
            return tiles_m * tiles_n, cuda.blockIdx.x, cuda.gridDim.x

    mma_step, mma_drain = lagged_release(lag_waits, release)  # one wgmma group in flight (none with one stage)

    @cuda.jit(device=True, inline="always")
    def load_stage(pipe, smem, a_map, b_map, m0, n0, kt):
        """Acquire the producer's next stage and TMA-load one k-step's A and B boxes into it (the stage's full
        barrier expects their bytes), then commit it."""
        s = pipe.producer_acquire()
        base = s * stage_elems
        pipe.load(shared_view(smem, base, (BM, BK)), a_map, (m0, kt * BK))
        load_b(pipe, smem, b_map, base, n0, kt)
        pipe.producer_commit()

    @cuda.jit(device=True, inline="always")
    def mma_stage(acc, smem, a_map, b_map, s, wg):
        """The warpgroup's four wgmma (BK = 64: four k-steps of 16, written out so that they issue back to
        back with constant descriptor offsets) on stage ``s``: its 64 rows of A times the B tile; committed."""
        base = s * stage_elems
        a_tile = shared_view(smem, base, (BM, BK))
        row = 64 * wg
        # wgmma.fence on every k-step (as the PTX rules ask before wgmma that follow other register
        # accesses): without it ptxas inserts its own where it sees divergent code between k-steps and then
        # serializes every wgmma (warning C7519)
        acc = wgmma_fence(acc)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 0), b_operand(smem, b_map, base, 0), 1)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 16), b_operand(smem, b_map, base, 1), 1)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 32), b_operand(smem, b_map, base, 2), 1)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 48), b_operand(smem, b_map, base, 3), 1)
        wgmma_commit_group()
        return acc

    @cuda.jit(device=True, inline="always")
    def epilogue(acc, cdyn, c_map, c_load, c_tail, cbar, aligned, m0, n0, wg, tw, alpha, beta, state):
        """Warpgroup ``wg``'s 64 rows of the tile: scale, add beta * C, convert, TMA-store in chunks of
        ``epilogue_cols`` columns through two buffers. ``state``: (C-load barrier phase, chunks so far)."""
        cphase, done = state
        acc = wgmma_scale(acc, alpha)
        row = m0 + 64 * wg
        for j in range(chunks):
            tile = shared_view(cdyn, epi_base + (2 * wg + (done & 1)) * epi_elems, (64, epilogue_cols))
            done += 1
            acquire_buffer(wg, tw)  # the store that last read this buffer (two chunks ago) has read it
            col = n0 + j * epilogue_cols
            if has_beta:
                if tw == 0:
                    mbarrier_arrive_expect_tx(mbarrier_ref(cbar, wg), c_load.box_bytes)
                    tma_load(tile, c_load, (row, col), mbarrier_ref(cbar, wg))
                mbarrier_wait_parity(mbarrier_ref(cbar, wg), cphase)
                cphase ^= 1
                acc = wgmma_add_tile(acc, tile, c_load, 0, j * epilogue_cols, beta)
                warpgroup_sync(wg)  # everyone read C before the tile is overwritten
            wgmma_store(acc, tile, c_map, 0, j * epilogue_cols)
            if publish_buffer(wg, tw):  # (fence, warpgroup barrier: the tile is whole; thread 0 stores it)
                if tma_part and col < aligned:  # c_map describes C's columns [0, aligned): exact
                    tma_store(c_map, (row, col), tile)
                bulk_commit_group()
            if has_tail and col + epilogue_cols > aligned:  # the rows' last partial 16-byte unit
                store_tail(tile, c_tail, row, col, aligned, tw, WARPGROUP)
        return cphase, done

    @cuda.jit(device=True, inline="always")
    def producer(args):
        """One elected thread walks this CTA's tiles and their k-steps, TMA-loading each into the next stage."""
        pipe, smem, cdyn, cbar, a_map, b_map, c_map, c_load, c_tail, aligned, alpha, beta, work_split = args
        tiles_m, tiles_n, ktiles, total, first, step = work_split
        if cuda.threadIdx.x < 32:
            if elect_one_sync():
                for t in range(first, total, step):
                    m0, n0 = work(t, tiles_m, tiles_n)
                    for kt in range(ktiles):
                        load_stage(pipe, smem, a_map, b_map, m0, n0, kt)

    @cuda.jit(device=True, inline="always")
    def consumer(cw, args):
        """Consumer warpgroup ``cw``: its 64 rows of each tile, k-step by k-step, then the epilogue."""
        pipe, smem, cdyn, cbar, a_map, b_map, c_map, c_load, c_tail, aligned, alpha, beta, work_split = args
        tiles_m, tiles_n, ktiles, total, first, step = work_split
        tw = cuda.threadIdx.x - (cw + 1) * WARPGROUP
        lane = cuda.threadIdx.x % 32
        state = (0, 0)
        for t in range(first, total, step):
            m0, n0 = work(t, tiles_m, tiles_n)
            acc = wgmma_zeros(bn)
            for kt in range(ktiles):
                s = pipe.consumer_wait()
                acc = mma_stage(acc, smem, a_map, b_map, s, cw)
                # keep this k-step's group in flight; release the previous one's stage (one stage: wait)
                acc = mma_step(pipe, acc, kt, lane)
            acc = mma_drain(pipe, acc, lane)
            state = epilogue(acc, cdyn, c_map, c_load, c_tail, cbar, aligned, m0, n0, cw, tw, alpha, beta, state)
        if tw == 0:
            bulk_wait_group(0)

    roles = warp_specialize(BUDGET, producer, consumer)  # 40 registers for the producer, 232 for consumers
    jit = cuda.jit(**({} if SIMULATING else {"max_registers": MAX_REGISTERS}))
    if cluster_m == 2:
        jit = _compose(cluster_kernel((2, 1, 1)), jit)

    @jit
    def gemm_kernel(a_map, b_map, c_map, c_load, c_tail, aligned, m, n, k, alpha, beta):
        smem = cuda.shared.array(0, nb_dtype, alignment=1024)
        cdyn = cuda.shared.array(0, out_dtype, alignment=1024)  # (the same dynamic buffer, as C elements)
        cbar = cuda.shared.array(2, np.uint64)
        if cuda.threadIdx.x == 0 and has_beta:
            mbarrier_init(mbarrier_ref(cbar, 0), 1)
            mbarrier_init(mbarrier_ref(cbar, 1), 1)
            fence_mbarrier_init()
        # full: producer + TMA bytes; empty: one arrival per consumer warp (of both CTAs of a cluster)
        pipe = Pipeline(stages, 1, 8 * cluster_m)
        if cluster_m > 1:
            cluster_sync()  # every CTA's barriers are initialised before any multicast or remote arrive
        grid_dependency_sync()
        tiles_m = (m + BM - 1) // BM
        tiles_n = (n + bn - 1) // bn
        total, first, step = units(tiles_m, tiles_n)
        roles((pipe, smem, cdyn, cbar, a_map, b_map, c_map, c_load, c_tail, aligned, alpha, beta,
               (tiles_m, tiles_n, (k + BK - 1) // BK, total, first, step)))
        if cluster_m > 1:
            cluster_sync()  # no CTA leaves while its partner may still multicast into it or arrive on it

    return gemm_kernel


def _compose(outer, inner):
    return lambda fn: outer(inner(fn))


class Gemm(Plan):
    """A planned ``c[...] = alpha * a @ b + beta * c`` on tensor cores (see the module docstring).

    ``a``: (M, K); ``b``: (K, N), or (N, K) with ``b_layout="nk"``; ``c``: (M, N). Any CUDA arrays (numba,
    CuPy, torch): bfloat16 or float16 inputs (the same for both), ``c`` bfloat16, float16 or float32. Options:
    ``alpha``, ``beta`` (Python numbers; ``plan.alpha`` / ``plan.beta`` may change between launches, but
    ``beta`` must stay 0 or non-zero as built), ``bn`` (tile width: 64..256), ``stages``, ``group_m``
    (tile-order group), ``cluster_m`` (1 or 2), ``grid`` (CTAs; default one per SM). ``plan.config`` shows the choice;
    ``launch(stream)`` runs it (asynchronously) and returns ``c`` (the plan contract of
    :class:`numbatma.kernels.Plan`).
    """

    def __init__(self, a, b, c, *, alpha=1.0, beta=0.0, b_layout="kn", bn=None, stages=None,
                 group_m=8, cluster_m=None, grid=None, **unknown):
        op = "Gemm"
        if unknown:
            _refuse_unknown(op, unknown)
        alpha, beta = scalar_option(op, "alpha", alpha), scalar_option(op, "beta", beta)
        b_layout = choice_option(op, "b_layout", b_layout, ("kn", "nk"))
        bn = int_option(op, "bn", bn, choices=(64, 128, 192, 256), none_ok=True)
        stages = int_option(op, "stages", stages, none_ok=True)  # (the range: default_config, from what fits)
        group_m = int_option(op, "group_m", group_m, 1, 1 << 16)
        cluster_m = int_option(op, "cluster_m", cluster_m, choices=(1, 2), none_ok=True)
        grid = int_option(op, "grid (number of CTAs)", grid, 1, 2**31 - 1, none_ok=True)
        la, lb, lc = array_layout(a), array_layout(b), array_layout(c)
        for what, lay in (("a", la), ("b", lb), ("c", lc)):
            if len(lay.shape) != 2:
                raise TensorMapError(f"{op}: {what} is a {lay.name}; Gemm takes 2-D arrays.")
        if la.dtype.name not in INPUT_DTYPES or lb.dtype != la.dtype:
            raise TensorMapError(f"{op}: a is a {la.name} and b a {lb.name}; both must be bfloat16 or both float16.")
        if lc.dtype.name not in OUTPUT_DTYPES:
            raise TensorMapError(f"{op}: c is a {lc.name}; supported output dtypes: {', '.join(OUTPUT_DTYPES)}.")
        if b_layout not in ("kn", "nk"):
            raise TensorMapError(f"{op}: b_layout must be 'kn' (b is (K, N)) or 'nk' (b is (N, K)), got {b_layout!r}")
        m, k = la.shape
        kb, n = lb.shape if b_layout == "kn" else lb.shape[::-1]
        if kb != k or lc.shape != (m, n):
            bshape = "(K, N)" if b_layout == "kn" else "(N, K)"
            raise TensorMapError(
                f"{op}: shapes do not multiply: a is {la.shape}, b is {lb.shape} (read as {bshape}), c is "
                f"{lc.shape}; need a (M, K), b {bshape}, c (M, N).")
        self.shape = (m, n, k)
        self.dtype, self.out_dtype = la.dtype, lc.dtype
        self.b_layout = b_layout
        self.c = c
        self.alpha, self.beta = alpha, beta
        self.has_beta = beta != 0.0  # (the kernel reads C only when built with beta != 0)
        self.kernel = None
        if m == 0 or n == 0:
            return
        if k == 0:
            raise TensorMapError(f"{op}: K is 0 (a is {la.shape}); nothing to multiply.")
        self.config = default_config(m, n, k, lc.dtype.itemsize, bn=bn, stages=stages, group_m=group_m,
                                     cluster_m=cluster_m, b_nk=b_layout == "nk")
        cfg = self.config
        promo = L2Promotion.B256
        self.a_map = TensorMap(a, (BM, BK), swizzle=Swizzle.B128, l2_promotion=promo)
        if b_layout == "nk":  # (with a cluster pair, each CTA loads half of the B tile)
            self.b_map = TensorMap(b, (cfg.bn // cfg.cluster_m, BK), swizzle=Swizzle.B128, l2_promotion=promo)
        else:
            self.b_map = TensorMap(b, (BK, 64), swizzle=Swizzle.B128, l2_promotion=promo)
        c_box = (64, cfg.epilogue_cols)
        self.out = ExactStore(c, c_box, swizzle=Swizzle.B128)
        self.c_map = self.out.map
        has_beta = self.has_beta
        self.c_load = TensorMap(c, c_box, swizzle=Swizzle.B128) if has_beta else self.c_map
        self.tiles = (ceil_div(m, BM), ceil_div(n, cfg.bn))
        self.ntiles = self.tiles[0] * self.tiles[1]
        self.units = ceil_div(self.tiles[0], cfg.cluster_m) * self.tiles[1]  # work items of a CTA (pair)
        if grid is not None:
            grid = max(1, min(int(grid) // cfg.cluster_m, self.units)) * cfg.cluster_m
        self._grid = grid
        self.block = 3 * WARPGROUP  # one producer warpgroup and two consumers (BUDGET.threads)
        self.flops = 2.0 * m * n * k
        self.kernel = _gemm_kernel(self.a_map.numba_type.dtype, self.c_map.numba_type.dtype, cfg.bn, cfg.stages,
                                   b_layout == "nk", cfg.group_m, cfg.epilogue_cols, has_beta,
                                   self.out.tma, self.out.has_tail, cfg.cluster_m)

    @property
    def grid(self):
        """CTAs: one per SM (persistent), never more than there is work; with clusters, as many clusters as
        the GPU holds at once (``numbatma.max_active_clusters``: a cluster's CTAs share a GPC, so a grid of one
        CTA per SM would leave some clusters waiting for a second wave)."""
        if self._grid is None:
            cm = self.config.cluster_m
            if cm == 1:
                self._grid = persistent_grid(self.units)
            else:
                fits = max_active_clusters(self.kernel, self.launch_args(), self.block, self.config.smem_bytes,
                                           (cm, 1, 1))
                self._grid = cm * max(1, min(self.units, fits))
        return self._grid

    @property
    def args(self):
        """The kernel's arguments (valid offline, e.g. for ``numbatma.compile``)."""
        m, n, k = self.shape
        return (self.a_map, self.b_map, self.c_map, self.c_load, self.out.tail, self.out.aligned, m, n, k,
                np.float32(self.alpha), np.float32(self.beta))

    threads = property(lambda self: self.block, doc="``block`` (the earlier name).")
    #: ``c`` is both read (beta != 0) and written: it must not overlap a or b (no exact alias either).
    writes = ("c",)
    overlap_note = "c's tiles are stored while other CTAs still load a and b"
    #: ``plan.alpha``: any real number, read at every launch. ``plan.beta``: read at every launch too, but the
    #: kernel reads C only when built with beta != 0, so beta stays 0 or non-zero as built.
    settable = {"alpha": lambda plan, value: scalar_option("Gemm", "alpha", value),
                "beta": lambda plan, value: _beta_rule(plan, value)}

    @property
    def shared_mem(self):
        return self.config.smem_bytes

    @property
    def output(self):
        return self.c

    def __repr__(self):
        m, n, k = self.shape
        return f"Gemm({m}x{n}x{k}, {self.dtype.name} -> {self.out_dtype.name}, b_layout={self.b_layout!r}, {self.config})"


#: Gemm's options (what :func:`_refuse_unknown` lists).
OPTIONS = ("alpha", "beta", "b_layout", "bn", "stages", "group_m", "cluster_m", "grid")


def _refuse_unknown(op, unknown):
    """TypeError for options :class:`Gemm` does not take (``unknown``: name -> value, as passed), naming the first
    one and the user's value. ``warp_specialized`` gets its own message: the multistage kernel it selected is now a
    benchmark module, not an option."""
    name, value = next(iter(unknown.items()))
    if "warp_specialized" in unknown:
        value = unknown["warp_specialized"]
        raise TypeError(
            f"{op}: warp_specialized is no longer an option, got warp_specialized={value!r}: {op} always builds the "
            f"warp-specialized kernel; the multistage (not warp-specialized) kernel it selected for comparison now "
            f"lives in benchmarks/gemm_multistage.py (MultistageGemm).")
    raise TypeError(f"{op}: unknown option {name}={value!r}; the options are {', '.join(OPTIONS)} (and stream for "
                    f"the function form gemm)")


def _beta_rule(plan, value):
    """``plan.beta = value``: a real number that is 0 exactly when the plan's beta was (a kernel built for beta = 0
    never reads C; one built for beta != 0 always does, so 0 * NaN in C would not give the beta = 0 result)."""
    value = scalar_option("Gemm", "beta", value)
    if (value != 0.0) != plan.has_beta:
        built = "beta != 0 (reads C)" if plan.has_beta else "beta = 0 (never reads C)"
        raise ValueError(f"Gemm: beta cannot change from {plan.beta!r} to {value!r} on a built plan: its kernel was "
                         f"built for {built}; build a new plan (Gemm(..., beta={value!r})) or call gemm(..., "
                         f"beta={value!r}).")
    return value


def gemm(a, b, c, **options):
    """``c[...] = alpha * a @ b + beta * c`` with :class:`Gemm` (options as there, plus ``stream``); returns c."""
    return run(Gemm, a, b, c, **options)

