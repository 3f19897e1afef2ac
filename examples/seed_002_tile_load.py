"""The 128x64 half-precision TMA tile load of seed 002 ("The TMA Revolution"), written with numbatma.

CuTe's ``make_tma_atom`` becomes ``numbatma.TensorMap`` (built on the host from the array), the
``ClusterTransactionBarrier`` becomes a shared uint64 mbarrier, and ``copy(tma.with(bar), ...)`` becomes
``tma_load``. One thread initialises the barrier, announces the bytes, issues the copy; everybody waits.
"""
import sys

import numpy as np
from numba import cuda

import numbatma
from numbatma.utils import gpu_or_simulator
from numbatma.intrinsics import (
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load,
)

BLK_M, BLK_K = 128, 64  # 128 x 64 float16 = 16 KiB


@cuda.jit
def tma_tile_load(tma, out):
    smem = cuda.shared.array((BLK_M, BLK_K), np.float16, alignment=128)
    tma_barrier = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(tma_barrier, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(tma_barrier, BLK_M * BLK_K * 2)  # == tma.box_bytes
        tma_load(smem, tma, (0, 0), tma_barrier)
    mbarrier_wait_parity(tma_barrier, 0)  # without the wait, smem is garbage
    # smem is filled and ready: here, show it by writing it out with ordinary stores
    for i in range(cuda.threadIdx.x, BLK_M * BLK_K, cuda.blockDim.x):
        out[i // BLK_K, i % BLK_K] = smem[i // BLK_K, i % BLK_K]


def main():
    gpu_or_simulator("seed_002_tile_load.py")
    a = np.random.default_rng().standard_normal((BLK_M, BLK_K)).astype(np.float16)
    d_a = cuda.to_device(a)
    out = cuda.to_device(np.full_like(a, np.nan))
    tma = numbatma.TensorMap(d_a, (BLK_M, BLK_K))  # the "manifest", built on the host
    tma_tile_load[1, 128](tma, out)
    ok = np.array_equal(out.copy_to_host(), a)
    print(f"TMA copy of one {BLK_M}x{BLK_K} float16 tile: {'successful' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
