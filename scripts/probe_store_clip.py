"""Probe (GPU machine): where does a TMA tile store stop at the innermost edge of the tensor?

For views [:, :w] of a (4, 64) float32 allocation poisoned with -1, one box is stored per case (start
column and box width below, with and without 128B swizzle). Prints the columns written outside the view in
row 0 and anything written in row 1 (the box has one row), so the rule can be read off.
"""
import numpy as np
from numba import cuda

import numbatma
from numbatma.intrinsics import bulk_commit_group, bulk_wait_group, fence_proxy_async_shared_cta, shared_view, tma_store

CASES = [  # (view width, start column, box columns, swizzle)
    (33, 32, 32, 0), (34, 32, 32, 0), (35, 32, 32, 0), (37, 32, 32, 0), (40, 32, 32, 0), (45, 32, 32, 0),
    (49, 32, 32, 0), (33, 0, 64, 0), (5, 0, 32, 0), (5, 0, 8, 0), (9, 4, 8, 0), (17, 16, 16, 0), (21, 16, 16, 0),
    (33, 32, 32, 128), (37, 32, 32, 128), (49, 32, 32, 128), (5, 0, 32, 128), (60, 32, 32, 128),
]

kernels = {}


def kernel_for(cols):
    if cols not in kernels:
        @cuda.jit
        def store_one(dst, col):
            ring = cuda.shared.array(0, np.float32, alignment=1024)
            tile = shared_view(ring, 0, (1, cols))
            for k in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
                tile[0, k] = 1000 + k
            fence_proxy_async_shared_cta()
            cuda.syncthreads()
            if cuda.threadIdx.x == 0:
                tma_store(dst, (0, col), tile)
                bulk_commit_group()
                bulk_wait_group(0)

        kernels[cols] = store_one
    return kernels[cols]


for w, col, cols, swizzle in CASES:
    alloc = cuda.to_device(np.full((4, 64), -1.0, np.float32))
    # (the probe measures the overhang itself, so it opts into it)
    tm = numbatma.TensorMap(alloc[:, :w], (1, cols), swizzle=swizzle, allow_store_overhang=True)
    kernel_for(cols)[1, 64, 0, 4096](tm, col)
    got = alloc.copy_to_host()
    inside = [c for c in range(col, min(w, col + cols)) if got[0, c] == 1000 + c - col]
    outside = [c for c in range(w, 64) if got[0, c] != -1.0]
    row1 = [c for c in range(64) if got[1, c] != -1.0]
    print(f"view width {w:2d} ({4 * w:3d} B), box cols {col}..{col + cols - 1}, swizzle {swizzle:3d}: "
          f"{len(inside)} of {max(0, min(w, col + cols) - col)} inside written; outside the view written: "
          f"{outside}; row 1 written: {row1}")
