"""Probe (GPU machine): does a TMA tile store clip at the view's last column for every swizzle mode?

A (8, 36) float32 allocation poisoned with -1; the descriptor describes the view [:, :33]; one box whose
first column is 32 is stored (only column 32 is inside the view). Reports which of columns 32..35 were
written, for the by-value descriptor (cuda.core encoding) and for the same descriptor encoded by
cuTensorMapEncodeTiled and read from global memory (TensorMapArray).
"""
import numpy as np
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    fence_proxy_async_shared_cta,
    shared_view,
    tensormap_acquire,
    tma_store,
)


def make_kernels(cols):
    @cuda.jit
    def by_value(dst):
        ring = cuda.shared.array(0, np.float32, alignment=1024)
        tile = shared_view(ring, 0, (8, cols))
        for k in range(cuda.threadIdx.x, 8 * cols, cuda.blockDim.x):
            tile[k // cols, k % cols] = 100 + k
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            tma_store(dst, (0, 32), tile)
            bulk_commit_group()
            bulk_wait_group(0)

    @cuda.jit
    def from_global(descs):
        ring = cuda.shared.array(0, np.float32, alignment=1024)
        tile = shared_view(ring, 0, (8, cols))
        for k in range(cuda.threadIdx.x, 8 * cols, cuda.blockDim.x):
            tile[k // cols, k % cols] = 100 + k
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            tma_store(tensormap_acquire(descs, 0), (0, 32), tile)
            bulk_commit_group()
            bulk_wait_group(0)

    return by_value, from_global


for swizzle, cols in ((0, 32), (32, 8), (64, 16), (128, 32)):
    by_value, from_global = make_kernels(cols)
    for how in ("by value (cuda.core)", "global (driver encode)"):
        alloc = cuda.to_device(np.full((8, 36), -1.0, np.float32))
        view = alloc[:, :33]
        tm = numbatma.TensorMap(view, (8, cols), swizzle=swizzle)
        if how.startswith("by value"):
            by_value[1, 128, 0, 8192](tm)
        else:
            from_global[1, 128, 0, 8192](numbatma.TensorMapArray([tm]))
        got = alloc.copy_to_host()
        written = [c for c in range(32, 36) if got[0, c] != -1.0]
        print(f"swizzle {swizzle:3d} box (8, {cols:2d}) {how:24s}: columns written among 32..35: {written} "
              f"(col 32 = {got[0, 32]}, col 33 = {got[0, 33]})")
