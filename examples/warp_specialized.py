"""Warp specialization with TMA (async-copy "Pattern 2"): one producer warp moves data, the other warps
compute.

    python examples/warp_specialized.py

y = alpha * x + beta on an 8192 x 8192 float32 array (256 MiB in, 256 MiB out), checked against NumPy;
prints the achieved bandwidth (bytes read + written per second).

Persistent kernel: a block walks the tiles ``blockIdx.x, blockIdx.x + gridDim.x, ...``; both roles walk
the same sequence.

* Warp 0 is the producer. One lane, chosen with ``elect_one_sync``, runs the loop: ``producer_acquire``
  (wait for a free stage), ``pipe.load`` (TMA load; the stage's full barrier expects the bytes),
  ``producer_commit``. It runs up to ``STAGES`` tiles ahead of the consumers.
* Warps 1..4 are the consumers. All 128 threads ``consumer_wait`` for a tile and compute on it *in place*;
  every writer fences (``fence_proxy_async_shared_cta``) and the consumers meet at a named barrier
  (``named_barrier_sync(1, 128)``; barrier 0 would wait for the producer warp too). Then one consumer
  thread TMA-stores the stage.
* Only that thread releases stages (``Pipeline(STAGES, 1, 1)``), one tile late: it releases tile ``i - 1``
  once ``bulk_wait_group_read(1)`` says the store of tile ``i - 1`` has read the stage, so the producer
  never overwrites a stage that is still being stored.
* 4 stages x 16 KiB = 64 KiB of dynamic shared memory (over the 48 KiB static limit).

Needs an NVIDIA GPU with TMA (compute capability 9.0+).
"""
import sys

import numpy as np
from numba import cuda

import numbatma
from numbatma.utils import fill_uniform, gpu_or_simulator, median_ms, small_problem
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    elect_one_sync,
    fence_proxy_async_shared_cta,
    named_barrier_sync,
    tma_store,
)

ROWS, COLS = ((8192, 8192) if not small_problem() else (128, 256))  # 256 MiB of float32 (small: simulator, sanitizer)
BM, BN = 32, 128  # tile: 32 x 128 float32 = 16 KiB
TILE = BM * BN
STAGES = 4
CONSUMER_WARPS = 4
CONSUMERS = 32 * CONSUMER_WARPS
THREADS = 32 + CONSUMERS  # warp 0 produces, warps 1..4 consume
CONSUMER_BARRIER = 1  # named barrier id of the consumer warps (0 is cuda.syncthreads)
SMEM_BYTES = STAGES * TILE * 4  # 64 KiB (dynamic)
BLOCKS_PER_SM = 3


@cuda.jit
def warp_specialized_kernel(src, dst, ntiles, alpha, beta):
    dyn = cuda.shared.array(0, np.float32, alignment=1024)  # STAGES tiles of TILE floats
    pipe = Pipeline(STAGES, 1, 1)  # full: the producer lane; empty: the storing consumer thread

    warp = cuda.threadIdx.x // 32
    tiles_per_row = COLS // BN
    first = cuda.blockIdx.x
    step = cuda.gridDim.x
    mine = (ntiles - first + step - 1) // step

    if warp == 0:
        # ---------------- producer warp: one elected lane issues every TMA load ----------------
        if elect_one_sync():  # all 32 lanes execute elect.sync; one gets True
            for i in range(mine):
                t = first + i * step
                s = pipe.producer_acquire()
                pipe.load(dyn[s * TILE:(s + 1) * TILE], src, ((t // tiles_per_row) * BM, (t % tiles_per_row) * BN))
                pipe.producer_commit()
    else:
        # ---------------- consumer warps ----------------
        ctid = cuda.threadIdx.x - 32  # 0..CONSUMERS-1
        for i in range(mine):
            t = first + i * step
            s = pipe.consumer_wait()
            tile = dyn[s * TILE:(s + 1) * TILE]
            for j in range(TILE // CONSUMERS):  # 32 independent elements per thread, conflict-free
                k = ctid + j * CONSUMERS
                tile[k] = alpha * tile[k] + beta
            fence_proxy_async_shared_cta()  # my writes -> visible to the TMA store
            named_barrier_sync(CONSUMER_BARRIER, CONSUMERS)  # all consumer writes done
            if ctid == 0:
                tma_store(dst, ((t // tiles_per_row) * BM, (t % tiles_per_row) * BN), tile)
                bulk_commit_group()
                if i > 0:
                    bulk_wait_group_read(1)  # the store of tile i - 1 has read its stage ...
                    pipe.consumer_release()  # ... so give that stage back to the producer
        if ctid == 0:
            bulk_wait_group(0)  # every store complete before the block exits
            if mine > 0:
                pipe.consumer_release()  # the last stage (keeps the barrier phases consistent)


def main():
    gpu_or_simulator("warp_specialized.py")
    alpha, beta = np.float32(1.5), np.float32(-0.25)
    x = cuda.device_array((ROWS, COLS), np.float32)
    y = cuda.device_array((ROWS, COLS), np.float32)
    fill_uniform(x, 2024)
    src, dst = numbatma.TensorMap(x, (BM, BN)), numbatma.TensorMap(y, (BM, BN))
    ntiles = (ROWS // BM) * (COLS // BN)
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    grid = min(ntiles, sms * BLOCKS_PER_SM)

    def launch():
        warp_specialized_kernel[grid, THREADS, 0, SMEM_BYTES](src, dst, ntiles, alpha, beta)

    launch()
    cuda.synchronize()
    hx = x.copy_to_host()
    ref = alpha * hx + beta  # float32; the GPU fuses it into one FMA, so allow an ulp or so
    got = y.copy_to_host()
    err = np.abs(got - ref)
    bad = ~(err <= 1e-6 + 1e-6 * np.abs(ref))
    if bad.any():
        r, c = np.argwhere(bad)[0]
        print(f"FAILED: {int(bad.sum())} elements differ from NumPy; first at ({r}, {c}): got {got[r, c]}, "
              f"expected {ref[r, c]}")
        return 1
    ms = None if numbatma.SIMULATING else median_ms(launch)  # the simulator's times mean nothing
    nbytes = 2 * x.nbytes
    print(f"y = {alpha}x + {beta} on {ROWS}x{COLS} float32 ({x.nbytes >> 20} MiB in), {BM}x{BN} tiles, "
          f"{STAGES}-stage TMA pipeline, 1 producer + {CONSUMER_WARPS} consumer warps, {grid} blocks: OK "
          f"(max abs error {err.max():.2e})")
    if ms is None:
        print("(CUDA simulator: a small problem, no timing)")
    else:
        print(f"median {ms:.3f} ms -> {nbytes / ms / 1e6:.1f} GB/s (bytes read + written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
