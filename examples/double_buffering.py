"""Double buffering with TMA (async-copy "Pattern 1"): every thread of the block computes on one tile while
thread 0 has the next tile already on its way into the other buffer.

    python examples/double_buffering.py

y = 2 * x + 1 on an 8192 x 8192 float32 array (256 MiB in, 256 MiB out), checked against NumPy; prints
the achieved bandwidth (bytes read + written per second).

The kernel is persistent: a block walks the tiles ``blockIdx.x, blockIdx.x + gridDim.x, ...``.

* Input: a 2-stage ``Pipeline`` (full/empty mbarrier per stage). Thread 0 is its producer: before
  computing tile ``i`` it acquires the other stage and TMA-loads tile ``i + 1`` into it. All threads are
  consumers: ``consumer_wait`` for tile ``i``, compute, ``consumer_release``.
* Output: two shared output tiles, written by all threads with ordinary stores, made visible to the TMA
  unit (``fence_proxy_async_shared_cta`` + block barrier), then TMA-stored by thread 0. Thread 0 waits
  (``bulk_wait_group_read(0)``) for the previous store to have read its tile before the barrier, so the
  next iteration may overwrite that tile.
* The four 16 KiB tiles (64 KiB) are more than the 48 KiB of static shared memory a kernel may declare,
  so they are carved out of *dynamic* shared memory (sized at launch; numbatma raises the kernel's limit).
  Each tile is a flat slice ``dyn[k * TILE:(k + 1) * TILE]``: a shared array TMA accepts as a tile (its
  bytes are one box), indexed ``[r * BN + c]``. (``.reshape`` of such a slice compiles to a call into
  numba-cuda's run-time reshape helper, ``numba_attempt_nocopy_reshape``; flat slices need no call.)

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
    fence_proxy_async_shared_cta,
    tma_store,
)

ROWS, COLS = ((8192, 8192) if not small_problem() else (128, 256))  # 256 MiB of float32 (small: simulator, sanitizer)
BM, BN = 32, 128  # tile: 32 rows x 128 float32 = 16 KiB (innermost coordinates: multiples of 128 elements)
TILE = BM * BN
THREADS = 256
STAGES = 2  # double buffering
SMEM_BYTES = (STAGES + 2) * TILE * 4  # 2 input stages + 2 output tiles = 64 KiB (dynamic)
BLOCKS_PER_SM = 3  # 3 x 64 KiB fit in the 228 KiB of an H100/H200 SM


@cuda.jit
def double_buffer_kernel(src, dst, ntiles):
    # dynamic shared memory, sized at launch: [stage 0 | stage 1 | out 0 | out 1], TILE floats each
    dyn = cuda.shared.array(0, np.float32, alignment=1024)
    pipe = Pipeline(STAGES, 1, THREADS)  # full: 1 arrival (thread 0); empty: every thread releases

    tid = cuda.threadIdx.x
    tiles_per_row = COLS // BN
    first = cuda.blockIdx.x
    step = cuda.gridDim.x
    mine = (ntiles - first + step - 1) // step  # tiles of this block

    if tid == 0 and mine > 0:  # prologue: tile 0 into stage 0
        t = first
        pipe.producer_acquire()
        pipe.load(dyn[0:TILE], src, ((t // tiles_per_row) * BM, (t % tiles_per_row) * BN))
        pipe.producer_commit()

    for i in range(mine):
        t = first + i * step
        row, col = (t // tiles_per_row) * BM, (t % tiles_per_row) * BN
        if tid == 0 and i + 1 < mine:  # prefetch tile i + 1 into the other stage
            n = t + step
            s = pipe.producer_acquire()  # waits until every thread released tile i - 1
            pipe.load(dyn[s * TILE:(s + 1) * TILE], src, ((n // tiles_per_row) * BM, (n % tiles_per_row) * BN))
            pipe.producer_commit()

        s = pipe.consumer_wait()  # tile i has landed
        x = dyn[s * TILE:(s + 1) * TILE]
        o = STAGES + (i & 1)  # out tile; its last store (tile i - 2) has read it: see bulk_wait_group_read
        y = dyn[o * TILE:(o + 1) * TILE]
        for j in range(TILE // THREADS):  # a constant trip count: unrolled, 16 independent loads
            k = tid + j * THREADS  # element (k // BN, k % BN) of the tile; consecutive threads, no conflicts
            y[k] = np.float32(2.0) * x[k] + np.float32(1.0)
        pipe.consumer_release()  # this thread is done reading stage s

        fence_proxy_async_shared_cta()  # my writes to y -> visible to the TMA (async proxy)
        if tid == 0:
            bulk_wait_group_read(0)  # store of tile i - 1 has read its out tile: free after the barrier
        cuda.syncthreads()
        if tid == 0:
            tma_store(dst, (row, col), y)
            bulk_commit_group()

    if tid == 0:
        bulk_wait_group(0)  # the stores are complete before the block (and its shared memory) goes away


def main():
    gpu_or_simulator("double_buffering.py")
    x = cuda.device_array((ROWS, COLS), np.float32)
    y = cuda.device_array((ROWS, COLS), np.float32)
    fill_uniform(x, 12345)
    src, dst = numbatma.TensorMap(x, (BM, BN)), numbatma.TensorMap(y, (BM, BN))
    ntiles = (ROWS // BM) * (COLS // BN)
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    grid = min(ntiles, sms * BLOCKS_PER_SM)

    def launch():
        double_buffer_kernel[grid, THREADS, 0, SMEM_BYTES](src, dst, ntiles)

    launch()
    cuda.synchronize()
    hx = x.copy_to_host()
    ref = np.float32(2.0) * hx + np.float32(1.0)
    got = y.copy_to_host()
    if not np.array_equal(got, ref):
        bad = np.argwhere(got != ref)
        r, c = bad[0]
        print(f"FAILED: {len(bad)} elements differ from NumPy; first at ({r}, {c}): got {got[r, c]}, "
              f"expected {ref[r, c]}")
        return 1
    ms = None if numbatma.SIMULATING else median_ms(launch)  # the simulator's times mean nothing
    nbytes = 2 * x.nbytes  # read x, write y
    print(f"y = 2x + 1 on {ROWS}x{COLS} float32 ({x.nbytes >> 20} MiB in), {BM}x{BN} tiles, 2-stage TMA "
          f"pipeline, {grid} blocks x {THREADS} threads: OK (matches NumPy)")
    if ms is None:
        print("(CUDA simulator: a small problem, no timing)")
    else:
        print(f"median {ms:.3f} ms -> {nbytes / ms / 1e6:.1f} GB/s (bytes read + written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
