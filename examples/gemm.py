"""A tensor-core GEMM in plain Python: TMA loads into a multi-stage pipeline, warp specialization, wgmma.

    python examples/gemm.py [M N K]          (default 8192 8192 8192; float16 in, float16 out)

C = A @ B with A (M, K) row-major and B given as Bᵀ, an (N, K) row-major array (the "NT" layout of most
weights), float32 accumulation. The whole kernel is below, written with numbatma's public API only; the library
kernel ``numbatma.kernels.Gemm`` is the same design made persistent (one CTA per SM walking many tiles in an
L2-friendly order) and general (both B layouts, alpha/beta, exact stores of any N, more dtypes). The script
checks the result against float64 dot products and prints TFLOP/s for this kernel, for ``Gemm`` and, when
torch is installed, for cuBLAS.

One CTA computes one 128 x 256 tile of C with 384 threads in three warpgroups:

* **warpgroup 0 - the producer.** It gives most of its registers away (``setmaxnreg_dec``): it only issues
  TMA loads. One elected thread walks the K dimension in steps of 64: for each step it waits for a free stage
  of the ``Pipeline`` (``producer_acquire``), TMA-loads the 128 x 64 A box and the 256 x 64 B box into it
  (128-byte swizzle: the layout wgmma reads without bank conflicts) and commits (the stage's mbarrier
  completes when both boxes' bytes have landed: the pipeline counts the transaction bytes).
* **warpgroups 1 and 2 - the consumers** (``setmaxnreg_inc``: 232 registers each, 128 of them the
  accumulator). Each owns 64 rows of the tile and keeps a 64 x 256 float32 accumulator in registers
  (``wgmma_zeros(256)``). Per k-step: wait for the stage, four ``wgmma`` of K = 16 whose shared-memory
  descriptors ``wgmma_desc`` derives from the tile and its TensorMap (no descriptor bits by hand), commit
  the group, then wait until the *previous* k-step's group is done and release that stage to the producer.
  So one group of tensor-core work is always queued while the next stage is awaited: the tensor cores never
  wait for the consumer's bookkeeping, and the producer runs up to ``STAGES`` k-steps ahead.
* **epilogue**: each consumer converts its accumulator to float16 straight into a shared tile laid out for
  the C TensorMap (``wgmma_store`` applies the same 128-byte swizzle), fences the async proxy, syncs its
  warpgroup on a named barrier, and one thread TMA-stores the four 64 x 64 boxes. TMA clips at the edges
  of C, so M and K may be anything; N must be a multiple of 8 (each row of C a whole number of 16-byte
  units: a TMA store never writes past the end of a row - numbatma refuses the descriptor otherwise).

Registers: 168 per thread at launch (``max_registers``) fill the 64K-register file for 384 threads;
``setmaxnreg`` then moves them from the producer (40) to the consumers (232): 40 + 2 x 232 = 3 x 168.

Needs an H100/H200 (sm_90a: wgmma exists only there). Without one the script runs a small problem in the
CUDA simulator, which executes the same kernel (it decodes the wgmma descriptors and multiplies with NumPy).
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
    fence_proxy_async_shared_cta,
    named_barrier_sync,
    setmaxnreg_dec,
    setmaxnreg_inc,
    shared_view,
    tma_store,
    wgmma,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_store,
    wgmma_wait_group,
    wgmma_zeros,
)
from numbatma.utils import gpu_or_simulator, small_problem

BM, BN, BK = 128, 256, 64  # the CTA's tile of C, and the k-step (64 float16 = one 128-byte swizzle row)
STAGES = 3  # 3 x (128 + 256) x 64 x 2 bytes = 144 KiB of stages, plus 64 KiB of epilogue tiles
WARPGROUP = 128
A_ELEMS, STAGE_ELEMS = BM * BK, (BM + BN) * BK  # one stage: the A box, then the B box
EPI_BASE = STAGES * STAGE_ELEMS  # the epilogue tiles follow the stages (in float16 elements)
EPI_ELEMS = 64 * BN  # one consumer's 64 x 256 output tile: four 64 x 64 boxes side by side
C_BOXES = BN // 64  # (a module constant: shapes must be compile-time constants)
SMEM_BYTES = (EPI_BASE + 2 * EPI_ELEMS) * 2
MAX_REGISTERS, PRODUCER_REGISTERS, CONSUMER_REGISTERS = 168, 40, 232

_jit = cuda.jit if numbatma.SIMULATING else cuda.jit(max_registers=MAX_REGISTERS)


@_jit
def gemm_kernel(a_map, b_map, c_map, k):
    smem = cuda.shared.array(0, np.float16, alignment=1024)  # dynamic: 1024-byte aligned for the swizzle
    pipe = Pipeline(STAGES, 1, 8)  # full: 1 producer arrival (+ TMA bytes); empty: one arrival per consumer warp
    m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
    ktiles = (k + BK - 1) // BK
    wg = cuda.threadIdx.x // WARPGROUP
    if wg == 0:  # ---- producer ----
        setmaxnreg_dec(PRODUCER_REGISTERS)
        if cuda.threadIdx.x < 32 and elect_one_sync():
            for kt in range(ktiles):
                s = pipe.producer_acquire()
                base = s * STAGE_ELEMS
                pipe.load(shared_view(smem, base, (BM, BK)), a_map, (m0, kt * BK))
                pipe.load(shared_view(smem, base + A_ELEMS, (BN, BK)), b_map, (n0, kt * BK))
                pipe.producer_commit()
    else:  # ---- consumers: warpgroup 1 takes rows 0..63 of the tile, warpgroup 2 rows 64..127 ----
        setmaxnreg_inc(CONSUMER_REGISTERS)
        row = 64 * (wg - 1)
        # 64 x 256 float32 accumulator, 128 registers per thread; wgmma_fence: the zeros are written, wgmma may
        # use the registers from here on (wgmma that accumulate into them need no fence between them)
        acc = wgmma_fence(wgmma_zeros(BN))
        for kt in range(ktiles):
            s = pipe.consumer_wait()
            base = s * STAGE_ELEMS
            a_tile = shared_view(smem, base, (BM, BK))
            b_tile = shared_view(smem, base + A_ELEMS, (BN, BK))
            # four k-slices of 16, written out so that the four wgmma issue back to back (a Python loop here
            # stays a loop in the compiled code: NVVM does not unroll it)
            acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 0), wgmma_desc(b_tile, b_map, "K", 0, 0), 1)
            acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 16), wgmma_desc(b_tile, b_map, "K", 0, 16), 1)
            acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 32), wgmma_desc(b_tile, b_map, "K", 0, 32), 1)
            acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", row, 48), wgmma_desc(b_tile, b_map, "K", 0, 48), 1)
            wgmma_commit_group()
            if kt > 0:
                acc = wgmma_wait_group(1, acc)  # the previous k-step's group is done: its stage is free
                if cuda.threadIdx.x % 32 == 0:
                    pipe.consumer_release()
        acc = wgmma_wait_group(0, acc)  # everything done: acc holds the tile
        if cuda.threadIdx.x % 32 == 0:
            pipe.consumer_release()
        # ---- epilogue: registers -> swizzled shared tile -> TMA store ----
        tile = shared_view(smem, EPI_BASE + (wg - 1) * EPI_ELEMS, (C_BOXES, 64, 64))
        wgmma_store(acc, tile, c_map, 0, 0)  # float32 -> float16, placed where the C TensorMap reads it
        fence_proxy_async_shared_cta()  # make the generic-proxy writes visible to the TMA (async proxy)
        named_barrier_sync(wg, WARPGROUP)  # this warpgroup's 128 threads only
        if cuda.threadIdx.x % WARPGROUP == 0:
            for g in range(C_BOXES):
                tma_store(c_map, (m0 + row, n0 + 64 * g), tile[g])
            bulk_commit_group()
            bulk_wait_group(0)  # the shared tile must outlive the store's reads


class ExampleGemm:
    """Descriptors and launch configuration for ``c = a @ b_t.T`` (built once, launched many times)."""

    def __init__(self, a, b_t, c):
        self.a_map = TensorMap(a, (BM, BK), swizzle=Swizzle.B128)
        self.b_map = TensorMap(b_t, (BN, BK), swizzle=Swizzle.B128)
        self.c_map = TensorMap(c, (64, 64), swizzle=Swizzle.B128)
        (m, k), (n, _) = self.a_map.shape, self.b_map.shape
        self.k = k
        self.grid = ((n + BN - 1) // BN, (m + BM - 1) // BM)

    def launch(self):
        gemm_kernel[self.grid, 3 * WARPGROUP, 0, SMEM_BYTES](self.a_map, self.b_map, self.c_map, self.k)


def time_ms(launch, reps=10):
    """Median of ``reps`` launches timed with CUDA events, after a warm-up."""
    launch()
    cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = cuda.event(timing=True), cuda.event(timing=True)
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return float(np.median(times))


def main():
    gpu_or_simulator("gemm.py", shared_bytes=SMEM_BYTES)
    if small_problem():
        m, n, k = 130, 256, 128  # small: the simulator runs every thread in Python (and compute-sanitizer is slow)
    else:
        m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) >= 4 else (8192, 8192, 8192)
    if n % 8:
        sys.exit(f"N = {n}: this example needs N to be a multiple of 8 (use numbatma.kernels.Gemm for any N)")
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((m, k), dtype=np.float32)).astype(np.float16)
    b_t = (rng.standard_normal((n, k), dtype=np.float32)).astype(np.float16)
    d_a, d_b = cuda.to_device(a), cuda.to_device(b_t)
    d_c = cuda.to_device(np.full((m, n), np.nan, np.float16))  # poisoned: every element must be written

    plan = ExampleGemm(d_a, d_b, d_c)
    plan.launch()
    c = d_c.copy_to_host()
    # check 512 random entries (or all of a small C) against float64 dot products
    rows = rng.integers(0, m, 512) if m * n > 4096 else np.repeat(np.arange(m), n)
    cols = rng.integers(0, n, 512) if m * n > 4096 else np.tile(np.arange(n), m)
    ref = np.einsum("ij,ij->i", a[rows].astype(np.float64), b_t[cols].astype(np.float64))
    scale = np.einsum("ij,ij->i", np.abs(a[rows].astype(np.float64)), np.abs(b_t[cols].astype(np.float64)))
    got = c[rows, cols].astype(np.float64)
    bound = 2.0 ** -11 * np.abs(ref) + k * 2.0 ** -23 * scale + 1e-6  # float16 rounding + float32 sums
    bad = ~(np.abs(got - ref) <= bound)
    name = "CUDA simulator" if numbatma.SIMULATING else cuda.get_current_device().name
    where = name.decode() if isinstance(name, bytes) else name
    if bad.any() or np.isnan(c).any():
        print(f"FAILED ({where}): {int(bad.sum())} of {len(rows)} checked entries wrong, "
              f"{int(np.isnan(c).sum())} never written")
        return 1
    print(f"C = A @ Bᵀ, {m}x{n}x{k} float16 -> float16 ({where}): OK, matches float64 dot products")
    if numbatma.SIMULATING:
        print("(CUDA simulator: a small problem, no timing)")
        return 0

    tflops = 2.0 * m * n * k / 1e9
    rows_out = [("this example (one tile per CTA)", time_ms(plan.launch))]
    from numbatma.kernels import Gemm

    library = Gemm(d_a, d_b, d_c, b_layout="nk")
    rows_out.append(("numbatma.kernels.Gemm (persistent)", time_ms(library.launch)))
    try:
        import torch

        ta, tb = torch.as_tensor(d_a, device="cuda"), torch.as_tensor(d_b, device="cuda")
        tc = torch.empty((m, n), dtype=torch.float16, device="cuda")
        rows_out.append(("cuBLAS (torch.matmul)", time_ms(lambda: torch.matmul(ta, tb.T, out=tc))))
    except Exception as exc:  # noqa: BLE001 - torch is optional
        print(f"(no cuBLAS comparison: {type(exc).__name__}: {exc})")
    for name, ms in rows_out:
        print(f"  {name:38s} {ms:8.3f} ms  {tflops / ms:7.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
