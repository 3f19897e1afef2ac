"""Copy a 2-D array through shared memory with TMA (load on an mbarrier, then store), check it against NumPy.

    python examples/tma_copy.py

Runs on an NVIDIA GPU with TMA (compute capability 9.0+: H100/H200, B200, RTX 50xx). Without one it runs
the same kernel in Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, on a smaller array) and says so.
"""
import os
import sys

import numpy as np
from numba import cuda

import numbatma
from numbatma.utils import small_problem
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load,
    tma_store,
)

BM, BN = 64, 32  # box: 64 rows x 32 float32 columns = 8 KiB


@cuda.jit
def tma_copy_kernel(src, dst):
    tile = cuda.shared.array((BM, BN), np.float32, alignment=128)  # TMA needs 128-byte aligned tiles
    bar = cuda.shared.array(1, np.uint64)
    row, col = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)  # one arrival per phase: the issuing thread's
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, src.box_bytes)  # box_bytes is a compile-time constant
        tma_load(tile, src, (row, col), bar)  # coordinates in the array's own (row, col) order
        mbarrier_wait_parity(bar, 0)  # phase 0 completes when the bytes have landed
        tma_store(dst, (row, col), tile)
        bulk_commit_group()
        bulk_wait_group(0)


def simulate_instead(reason):
    """Re-run this script in the CUDA simulator (the environment variable must be set before numba loads)."""
    print(f"tma_copy.py: {reason}; running the same kernel in the CUDA simulator (NUMBA_ENABLE_CUDASIM=1).",
          flush=True)
    os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, NUMBA_ENABLE_CUDASIM="1"))


def main():
    if not numbatma.SIMULATING:
        if not cuda.is_available():
            simulate_instead("no CUDA GPU was found")
        cc = cuda.get_current_device().compute_capability
        if cc < (9, 0):
            simulate_instead(f"this GPU has compute capability {cc[0]}.{cc[1]}; TMA needs 9.0+")
    # not multiples of the box: TMA clips the edge boxes (smaller in the simulator: a Python thread per thread)
    rows, cols = (150, 100) if small_problem() else (1000, 1000)
    host = np.random.default_rng().standard_normal((rows, cols)).astype(np.float32)
    src = cuda.to_device(host)
    dst = cuda.to_device(np.full_like(host, np.nan))
    src_map = numbatma.TensorMap(src, (BM, BN))
    dst_map = numbatma.TensorMap(dst, (BM, BN))
    grid = (-(-cols // BN), -(-rows // BM))
    tma_copy_kernel[grid, 32](src_map, dst_map)  # descriptors travel by value (__grid_constant__)
    ok = np.array_equal(dst.copy_to_host(), host)
    where = " (CUDA simulator)" if numbatma.SIMULATING else ""
    print(f"TMA copy of a {rows}x{cols} float32 array in {BM}x{BN} boxes{where}: "
          f"{'OK, matches NumPy' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
