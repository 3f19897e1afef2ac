"""The G2S load / S2G store pair of seed 003 ("TMA for Dummies", CuTe DSL), written with numbatma.

Load: one thread issues, the mbarrier completes, every thread waits. The tile is then modified by all
threads with ordinary stores, so before the TMA store each writer executes ``fence_proxy_async_shared_cta``
and the block synchronises ("store = fence before"). The store completes through a bulk group.
"""
import sys

import numpy as np
from numba import cuda

import numbatma
from numbatma.utils import gpu_or_simulator
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load,
    tma_store,
)

CTA_M, CTA_N = 32, 64


@cuda.jit
def scale_tiles(src, dst, alpha):
    tile = cuda.shared.array((CTA_M, CTA_N), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    m, n = cuda.blockIdx.y * CTA_M, cuda.blockIdx.x * CTA_N
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:  # G2S: one thread, completion on the barrier
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (m, n), bar)
    mbarrier_wait_parity(bar, 0)
    for i in range(cuda.threadIdx.x, CTA_M * CTA_N, cuda.blockDim.x):
        tile[i // CTA_N, i % CTA_N] *= alpha
    fence_proxy_async_shared_cta()  # make the generic-proxy writes visible to TMA
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:  # S2G: one thread, completion through a bulk group
        tma_store(dst, (m, n), tile)
        bulk_commit_group()
        bulk_wait_group(0)


def main():
    gpu_or_simulator("seed_003_load_store.py")
    x = np.random.default_rng().standard_normal((300, 500)).astype(np.float32)
    d_x = cuda.to_device(x)
    d_y = cuda.to_device(np.full_like(x, np.nan))
    src, dst = numbatma.TensorMap(d_x, (CTA_M, CTA_N)), numbatma.TensorMap(d_y, (CTA_M, CTA_N))
    scale_tiles[(-(-500 // CTA_N), -(-300 // CTA_M)), 128](src, dst, np.float32(3.0))
    ok = np.array_equal(d_y.copy_to_host(), x * np.float32(3.0))
    print(f"TMA load -> scale -> TMA store of a 300x500 array: {'OK' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
