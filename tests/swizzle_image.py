"""The shared-memory image of one swizzled TMA tile load: the same kernel runs on the GPU and in the
simulator (tests/test_gpu_swizzle_image.py compares the two byte for byte).

``python swizzle_image.py OUT.npz`` writes every case's image (run it with NUMBA_ENABLE_CUDASIM=1)."""
import functools
import sys

import numpy as np
from numba import cuda

import numbatma
from numbatma.intrinsics import (fence_mbarrier_init, fence_proxy_async_shared_cta, mbarrier_arrive_expect_tx,
                                 mbarrier_init, mbarrier_wait_parity)
from numbatma.intrinsics import tma_load

# (swizzle span, dtype, box, coordinates): rows of exactly the span, rows narrower than it, several
# 1024-byte swizzle atoms, 1-byte to 8-byte elements, rank 3, and a box clipped by the array's edge.
CASES = [
    (32, "float32", (8, 8), (1, 8)),
    (32, "uint8", (16, 32), (3, 32)),
    (64, "float16", (8, 32), (2, 32)),
    (64, "float32", (16, 8), (0, 8)),
    (128, "float32", (16, 32), (1, 32)),
    (128, "uint8", (8, 128), (0, 0)),
    (128, "float64", (8, 16), (4, 16)),
    (128, "float32", (8, 16), (0, 16)),
    (128, "float16", (2, 8, 64), (1, 0, 0)),
    (128, "float32", (16, 32), (72, 96)),  # 8 rows and 16 columns past the edge: zero fill
]


def source(dtype, box):
    """Distinct, deterministic values (an image that puts any byte in the wrong place differs)."""
    shape = tuple(2 * b + 48 for b in box)  # (rows of a multiple of 16 bytes for every dtype)
    n = int(np.prod(shape))
    if np.dtype(dtype).kind == "f":
        return (np.arange(n) % 2039 + 1).astype(dtype).reshape(shape)
    return (np.arange(n) * 7 + 3).astype(dtype).reshape(shape)


@functools.lru_cache(maxsize=None)
def _kernel(dtype, box):
    """``box``: the tile's shared shape (rows narrower than the swizzle span are padded to it)."""
    elems = int(np.prod(box))
    nb = getattr(np, dtype)
    rank = len(box)
    inner = box[-1]
    middle = box[-2] if rank == 3 else 1

    @cuda.jit
    def image(src, coords, out):
        tile = cuda.shared.array(box, nb, alignment=1024)
        bar = cuda.shared.array(1, np.uint64)
        # the bytes between narrow rows are never written by the load: make them the same in both runs
        for k in range(cuda.threadIdx.x, elems, cuda.blockDim.x):
            if rank == 2:
                tile[k // inner, k % inner] = 0
            else:
                tile[k // (middle * inner), k // inner % middle, k % inner] = 0
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, src.box_bytes)
            if rank == 2:
                tma_load(tile, src, (coords[0], coords[1]), bar)
            else:
                tma_load(tile, src, (coords[0], coords[1], coords[2]), bar)
        cuda.syncthreads()
        mbarrier_wait_parity(bar, 0)
        # element k of the dense tile is the k-th element of shared memory: the image, in memory order
        for k in range(cuda.threadIdx.x, elems, cuda.blockDim.x):
            if rank == 2:
                out[k] = tile[k // inner, k % inner]
            else:
                out[k] = tile[k // (middle * inner), k // inner % middle, k % inner]

    return image


def image(span, dtype, box, coords, to_device=lambda a: a):
    """Bytes of the shared tile after the load, in shared-memory order."""
    host = source(dtype, box)
    d_src = to_device(host)
    desc = numbatma.TensorMap(d_src, box, swizzle=span)
    out = np.zeros(int(np.prod(desc.shared_shape)), dtype)  # (bytes the load leaves alone stay 0)
    d_out = to_device(out)
    _kernel(dtype, desc.shared_shape)[1, 128](desc, np.array(coords, np.int64), d_out)
    res = d_out.copy_to_host() if hasattr(d_out, "copy_to_host") else d_out
    return np.ascontiguousarray(res).view(np.uint8)


def all_images(to_device=lambda a: a):
    return {f"case{i}": image(*case, to_device=to_device) for i, case in enumerate(CASES)}


if __name__ == "__main__":
    np.savez(sys.argv[1], **all_images())
