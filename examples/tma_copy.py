"""Copy a 2-D array through shared memory with TMA (load on an mbarrier, then store), check it against NumPy.

    python examples/tma_copy.py

Needs an NVIDIA GPU with TMA (compute capability 9.0+: H100/H200, B200, RTX 50xx).
"""
import sys

import numpy as np
from numba import cuda

import numbatma
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


def main():
    if numbatma.SIMULATING:
        print("tma_copy.py: the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) cannot run TMA kernels yet (issue #4);")
        print("run it on a GPU with compute capability 9.0+.")
        return 0
    if not cuda.is_available():
        print("tma_copy.py needs a CUDA GPU with TMA (compute capability 9.0+); none was found.")
        print("(Running kernels in the CPU simulator, NUMBA_ENABLE_CUDASIM=1, is planned: issue #4.)")
        return 0
    cc = cuda.get_current_device().compute_capability
    if cc < (9, 0):
        print(f"tma_copy.py needs compute capability 9.0+ for TMA; this GPU has {cc}.")
        return 0
    rows, cols = 1000, 1000  # not multiples of the box: TMA clips the edge boxes
    host = np.random.default_rng().standard_normal((rows, cols)).astype(np.float32)
    src = cuda.to_device(host)
    dst = cuda.to_device(np.full_like(host, np.nan))
    src_map = numbatma.TensorMap(src, (BM, BN))
    dst_map = numbatma.TensorMap(dst, (BM, BN))
    grid = (-(-cols // BN), -(-rows // BM))
    tma_copy_kernel[grid, 32](src_map, dst_map)  # descriptors travel by value (__grid_constant__)
    ok = np.array_equal(dst.copy_to_host(), host)
    print(f"TMA copy of a {rows}x{cols} float32 array in {BM}x{BN} boxes: {'OK, matches NumPy' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
