"""A multi-stage LDGSTS (``cp.async``) pipeline: the ``cuda::memcpy_async`` + ``cuda::pipeline`` model of
sm_80+, where every thread of the block copies part of each tile global -> shared, 16 bytes at a time.

    python examples/ldgsts_pipeline.py

Row sums of a 16384 x 4096 float32 array (256 MiB), checked against NumPy; prints the achieved bandwidth
(bytes read + written per second).

Persistent kernel: a block owns the row bands ``blockIdx.x, blockIdx.x + gridDim.x, ...`` (BM rows each)
and walks each band left to right in BM x BN tiles; the tiles of all its bands form one sequence that
streams through a ``STAGES``-deep ``Pipeline``:

* Producer side, every thread: ``producer_acquire`` (the stage is free: all threads released it), two
  16-byte ``cp_async`` copies (consecutive threads, consecutive 16-byte chunks of a row: coalesced), then
  ``producer_commit_async`` - ``cp.async.mbarrier.arrive.noinc``: this thread's arrival on the stage's full
  barrier happens when its copies have landed. Hence ``Pipeline(STAGES, THREADS, THREADS)``: the full
  barrier expects one (asynchronous) arrival per thread.
* Consumer side, every thread: ``consumer_wait`` (all copies of the tile landed), add the tile's values
  into per-row partial sums, ``consumer_release``.
* The producer runs ``STAGES - 1`` tiles ahead; at the end of a band each warp reduces its two rows with
  shuffles and writes the sums.

All copies are 16-byte aligned on both sides (rows of 4096 floats, chunks at multiples of 4 floats, a
128-byte aligned shared buffer). Shared memory: 4 stages x 8 KiB = 32 KiB, static.

Needs an NVIDIA GPU of compute capability 8.0+ (LDGSTS; mbarrier-tracked cp.async). No TMA.
"""
import sys

import numpy as np
from numba import cuda

import numbatma
from numbatma.utils import fill_uniform, gpu_or_simulator, median_ms, small_problem
from numbatma.intrinsics import Pipeline, cp_async

ROWS, COLS = ((16384, 4096) if not small_problem() else (64, 256))  # 256 MiB of float32 (small: simulator, sanitizer)
BM, BN = 16, 128  # tile: 16 rows x 128 float32 = 8 KiB = 512 chunks of 16 bytes
STAGES = 4
THREADS = 256  # 8 warps; warp w sums rows 2w and 2w + 1 of every tile
CHUNK = 4  # float32 per 16-byte copy
CHUNKS_PER_ROW = BN // CHUNK  # 32
COPIES = BM * CHUNKS_PER_ROW // THREADS  # 16-byte copies per thread per tile: 2
ROWS_PER_WARP = BM // (THREADS // 32)  # 2
BLOCKS_PER_SM = 4


@cuda.jit(device=True, inline="always")
def _issue(pipe, stages, x, band, tile, tid):
    """Producer step of one thread: acquire a stage and copy this thread's chunks of tile ``tile`` of row
    band ``band`` into it."""
    s = pipe.producer_acquire()
    for j in range(COPIES):
        q = tid + j * THREADS  # chunk q of the tile: row q // 32, columns 4 (q % 32) .. + 3
        r = q // CHUNKS_PER_ROW
        c = (q - r * CHUNKS_PER_ROW) * CHUNK
        cp_async(stages, (s, r, c), x, (band * BM + r, tile * BN + c), 16)
    pipe.producer_commit_async()


@cuda.jit
def ldgsts_row_sum_kernel(x, out):
    stages = cuda.shared.array((STAGES, BM, BN), np.float32, alignment=128)
    pipe = Pipeline(STAGES, THREADS, THREADS)  # full: every thread's cp.async arrival; empty: every thread

    tid = cuda.threadIdx.x
    warp = tid // 32
    lane = tid % 32
    nbands = ROWS // BM
    tiles = COLS // BN  # per band
    mybands = (nbands - cuda.blockIdx.x + cuda.gridDim.x - 1) // cuda.gridDim.x
    total = mybands * tiles  # the block's tile sequence: band-major

    ahead = min(STAGES - 1, total)
    for k in range(ahead):  # prologue: fill STAGES - 1 stages
        _issue(pipe, stages, x, cuda.blockIdx.x + (k // tiles) * cuda.gridDim.x, k % tiles, tid)

    acc0 = np.float32(0.0)
    acc1 = np.float32(0.0)
    for k in range(total):
        n = k + STAGES - 1
        if n < total:  # keep STAGES - 1 tiles in flight
            _issue(pipe, stages, x, cuda.blockIdx.x + (n // tiles) * cuda.gridDim.x, n % tiles, tid)

        s = pipe.consumer_wait()  # every thread's copies of tile k have landed
        r0 = warp * ROWS_PER_WARP
        for m in range(BN // 32):  # lane + 32 m: conflict-free
            acc0 += stages[s, r0, lane + 32 * m]
            acc1 += stages[s, r0 + 1, lane + 32 * m]
        pipe.consumer_release()

        if k % tiles == tiles - 1:  # band finished: reduce across the warp, write two row sums
            for d in (16, 8, 4, 2, 1):
                acc0 += cuda.shfl_xor_sync(0xFFFFFFFF, acc0, d)
                acc1 += cuda.shfl_xor_sync(0xFFFFFFFF, acc1, d)
            if lane == 0:
                row = (cuda.blockIdx.x + (k // tiles) * cuda.gridDim.x) * BM + r0
                out[row] = acc0
                out[row + 1] = acc1
            acc0 = np.float32(0.0)
            acc1 = np.float32(0.0)


def main():
    gpu_or_simulator("ldgsts_pipeline.py", (8, 0), "mbarrier/cp.async")
    x = cuda.device_array((ROWS, COLS), np.float32)
    out = cuda.device_array(ROWS, np.float32)
    fill_uniform(x, 99)
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    grid = min(ROWS // BM, sms * BLOCKS_PER_SM)

    def launch():
        ldgsts_row_sum_kernel[grid, THREADS](x, out)

    launch()
    cuda.synchronize()
    hx = x.copy_to_host()
    ref = hx.sum(axis=1, dtype=np.float64)
    got = out.copy_to_host().astype(np.float64)
    # float32 sums of 4096 values in another order: allow a few ulps of the sum of magnitudes
    tol = 1e-5 * np.abs(hx).sum(axis=1, dtype=np.float64) + 1e-6
    bad = ~(np.abs(got - ref) <= tol)
    if bad.any():
        r = int(np.argmax(bad))
        print(f"FAILED: {int(bad.sum())} row sums differ from NumPy; first row {r}: got {got[r]}, "
              f"expected {ref[r]}")
        return 1
    ms = None if numbatma.SIMULATING else median_ms(launch)  # the simulator's times mean nothing
    nbytes = x.nbytes + out.nbytes
    print(f"row sums of {ROWS}x{COLS} float32 ({x.nbytes >> 20} MiB), {BM}x{BN} tiles, {STAGES}-stage cp.async "
          f"pipeline, {grid} blocks x {THREADS} threads: OK (max abs error {np.abs(got - ref).max():.2e})")
    if ms is None:
        print("(CUDA simulator: a small problem, no timing)")
    else:
        print(f"median {ms:.3f} ms -> {nbytes / ms / 1e6:.1f} GB/s (bytes read + written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
