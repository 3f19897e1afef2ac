"""A persistent warp-specialized GEMM written with the building blocks of ``numbatma.intrinsics.warp_roles``.

    python examples/warp_roles_gemm.py [M N K]     (default 4096 4096 4096; float16 in, float16 out)

C = A @ Bᵀ with A (M, K) and Bᵀ given as an (N, K) row-major array, float32 accumulation. examples/gemm.py
writes every role out by hand; this kernel lets the blocks do it (docs/tensor_cores.md, "Building blocks for
warp-specialized kernels"):

* ``register_budget(2)`` + ``warp_specialize``: 384 threads; warpgroup 0 (the producer) drops to 40
  registers, consumer warpgroups 0 and 1 rise to 232 (168 each at launch).
* ``persistent_share`` + ``tile_origin``: each CTA walks its share of the 128 x 128 tiles in the grouped
  order (``GROUP_M`` tile rows at a time, so neighbouring CTAs share A rows and B columns in L2).
* producer: one elected thread TMA-loads each k-step's A and B boxes into the next free ``Pipeline`` stage.
* consumers: four wgmma per k-step on their 64 rows, then ``lagged_release(1)``: one group stays in flight
  while the previous k-step's stage goes back to the producer; ``drain`` after the tile's last k-step.
* epilogue: ``store_buffers(2)``: two 64 x 64 shared buffers per consumer, written by ``wgmma_store`` while
  the previous chunk's TMA store is still reading the other one.

Its speed has not been measured yet (the library kernel ``numbatma.kernels.Gemm`` has: docs/gemm.md). Without
an H100/H200 the script runs a small problem in the CUDA simulator and checks it against NumPy.
"""
import sys

import numpy as np
from numba import cuda

import numbatma
from numbatma import Swizzle, TensorMap
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    elect_one_sync,
    lagged_release,
    persistent_grid,
    persistent_share,
    register_budget,
    shared_view,
    store_buffers,
    tile_origin,
    tma_store,
    warp_specialize,
    wgmma,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_store,
    wgmma_zeros,
)
from numbatma.utils import gpu_or_simulator, small_problem

BM, BN, BK = 128, 128, 64  # the tile of C (two consumers x 64 rows) and the k-step (64 float16 = 128 bytes)
STAGES, GROUP_M = 4, 8
WARPGROUP = 128
BUDGET = register_budget(2)  # launch 168, producer 40, consumers 232; BUDGET.threads = 384
A_ELEMS, STAGE_ELEMS = BM * BK, (BM + BN) * BK
EPI_BASE, EPI_ELEMS, CHUNKS = STAGES * STAGE_ELEMS, 64 * 64, BN // 64  # epilogue buffers after the stages
SMEM_BYTES = (EPI_BASE + 2 * 2 * EPI_ELEMS) * 2  # 4 x 32 KiB of stages + 2 consumers x 2 buffers x 8 KiB

mma_step, mma_drain = lagged_release(1)  # one wgmma group in flight
acquire_buffer, publish_buffer = store_buffers(2)


@cuda.jit(device=True, inline="always")
def producer(args):
    pipe, smem, a_map, b_map, c_map, tiles_m, tiles_n, ktiles, first, step, mine = args
    if cuda.threadIdx.x < 32 and elect_one_sync():
        for i in range(mine):
            tm, tn = tile_origin(first + i * step, tiles_m, tiles_n, GROUP_M)
            for kt in range(ktiles):
                base = pipe.producer_acquire() * STAGE_ELEMS
                pipe.load(shared_view(smem, base, (BM, BK)), a_map, (tm * BM, kt * BK))
                pipe.load(shared_view(smem, base + A_ELEMS, (BN, BK)), b_map, (tn * BN, kt * BK))
                pipe.producer_commit()


@cuda.jit(device=True, inline="always")
def consumer(c, args):
    pipe, smem, a_map, b_map, c_map, tiles_m, tiles_n, ktiles, first, step, mine = args
    tw, lane, row = cuda.threadIdx.x % WARPGROUP, cuda.threadIdx.x % 32, 64 * c
    done = 0  # epilogue chunks so far: the buffer of chunk j is j % 2
    for i in range(mine):
        tm, tn = tile_origin(first + i * step, tiles_m, tiles_n, GROUP_M)
        acc = wgmma_zeros(BN)
        for kt in range(ktiles):
            base = pipe.consumer_wait() * STAGE_ELEMS
            a_tile, b_tile = shared_view(smem, base, (BM, BK)), shared_view(smem, base + A_ELEMS, (BN, BK))
            acc = wgmma_fence(acc)
            acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 0), wgmma_desc(b_tile, b_map, "K", 0, 0), 1)
            acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 16), wgmma_desc(b_tile, b_map, "K", 0, 16), 1)
            acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 32), wgmma_desc(b_tile, b_map, "K", 0, 32), 1)
            acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 48), wgmma_desc(b_tile, b_map, "K", 0, 48), 1)
            wgmma_commit_group()
            acc = mma_step(pipe, acc, kt, lane)  # from the 2nd k-step: wait for the previous group, release it
        acc = mma_drain(pipe, acc, lane)
        for j in range(CHUNKS):
            tile = shared_view(smem, EPI_BASE + (2 * c + done % 2) * EPI_ELEMS, (64, 64))
            done += 1
            acquire_buffer(c, tw)  # the store that last read this buffer (two chunks ago) has read it
            wgmma_store(acc, tile, c_map, 0, 64 * j)  # float32 -> float16, swizzled as the C TensorMap reads
            if publish_buffer(c, tw):  # (fence + warpgroup barrier; True in thread 0)
                tma_store(c_map, (tm * BM + row, tn * BN + 64 * j), tile)
                bulk_commit_group()
    if tw == 0:
        bulk_wait_group(0)


roles = warp_specialize(BUDGET, producer, consumer)
_jit = cuda.jit if numbatma.SIMULATING else cuda.jit(max_registers=BUDGET.launch)


@_jit
def warp_roles_gemm(a_map, b_map, c_map, m, n, k):
    smem = cuda.shared.array(0, np.float16, alignment=1024)  # dynamic: 1024-byte aligned for the swizzle
    pipe = Pipeline(STAGES, 1, 8)  # full: one producer arrival (+ TMA bytes); empty: one per consumer warp
    tiles_m, tiles_n = (m + BM - 1) // BM, (n + BN - 1) // BN
    first, step, mine = persistent_share(tiles_m * tiles_n)  # (shared by both roles: computed before the split)
    roles((pipe, smem, a_map, b_map, c_map, tiles_m, tiles_n, (k + BK - 1) // BK, first, step, mine))


class WarpRolesGemm:
    """Descriptors and launch configuration for ``c = a @ b_t.T`` (``grid``: CTAs, default one per SM)."""

    def __init__(self, a, b_t, c, grid=None):
        self.a_map = TensorMap(a, (BM, BK), swizzle=Swizzle.B128)
        self.b_map = TensorMap(b_t, (BN, BK), swizzle=Swizzle.B128)
        self.c_map = TensorMap(c, (64, 64), swizzle=Swizzle.B128)
        (m, k), (n, _) = self.a_map.shape, self.b_map.shape
        self.shape = (m, n, k)
        tiles = -(-m // BM) * -(-n // BN)
        if grid is None:
            grid = cuda.get_current_device().MULTIPROCESSOR_COUNT if not numbatma.SIMULATING else 1
        self.grid = persistent_grid(tiles, grid)

    @property
    def args(self):
        return (self.a_map, self.b_map, self.c_map, *self.shape)

    def launch(self):
        warp_roles_gemm[self.grid, BUDGET.threads, 0, SMEM_BYTES](*self.args)


def run(m, n, k, grid=None, seed=0):
    """Multiply random float16 matrices; returns (a, b_t, c) as host arrays (c poisoned with NaN before)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32).astype(np.float16)
    b_t = rng.standard_normal((n, k), dtype=np.float32).astype(np.float16)
    d_a, d_b = cuda.to_device(a), cuda.to_device(b_t)
    d_c = cuda.to_device(np.full((m, n), np.nan, np.float16))
    plan = WarpRolesGemm(d_a, d_b, d_c, grid)
    plan.launch()
    return a, b_t, d_c.copy_to_host(), plan


def check(a, b_t, c):
    """Number of entries of c off from float64 dot products by more than float16 rounding + float32 sums."""
    ref = a.astype(np.float64) @ b_t.astype(np.float64).T
    scale = np.abs(a.astype(np.float64)) @ np.abs(b_t.astype(np.float64)).T
    bound = 2.0 ** -11 * np.abs(ref) + a.shape[1] * 2.0 ** -23 * scale + 1e-6
    return int(np.count_nonzero(~(np.abs(c.astype(np.float64) - ref) <= bound)))


def main():
    gpu_or_simulator("warp_roles_gemm.py", shared_bytes=SMEM_BYTES)
    if small_problem():
        m, n, k = 200, 128, 192  # two row tiles (the second partial) walked by one CTA; three k-steps
    else:
        m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) >= 4 else (4096, 4096, 4096)
    if n % 8 or k % 8:
        sys.exit(f"N = {n}, K = {k}: this example needs both multiples of 8 (16-byte rows for TMA)")
    a, b_t, c, plan = run(m, n, k, grid=1 if numbatma.SIMULATING else None)
    where = "CUDA simulator" if numbatma.SIMULATING else cuda.get_current_device().name
    where = where.decode() if isinstance(where, bytes) else where
    bad = check(a, b_t, c)
    if bad:
        print(f"FAILED ({where}): {bad} of {c.size} entries wrong ({int(np.isnan(c).sum())} never written)")
        return 1
    print(f"C = A @ Bᵀ, {m}x{n}x{k} float16 -> float16, {plan.grid} CTA(s) ({where}): OK, matches NumPy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
