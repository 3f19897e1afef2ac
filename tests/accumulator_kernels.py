"""Kernel bodies of the accumulator family (numbatma.intrinsics.accumulator: wgmma_map, wgmma_row_reduce), shared
by the CPU compile tests, the simulator tests and the GPU tests: one warpgroup, an m64nN float32 accumulator
filled from a global array through wgmma_map (every register reads its own element: the layout), written back
with wgmma_store_global, and the rows reduced (max and sum) through wgmma_row_reduce."""
import numpy as np
from numba import cuda, types

from numbatma.intrinsics import wgmma_map, wgmma_row_reduce, wgmma_store_global, wgmma_zeros

N = 64  # accumulator columns (m64n64: 32 registers per thread)
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0.0)


@cuda.jit(device=True, inline="always")
def from_array(v, half, col, ex):
    """Register -> the element of ``x`` at the register's (row, column): ``ex = (x, first row of the thread)``."""
    x, row0 = ex
    return x[row0 + 8 * half, col] + v


@cuda.jit(device=True, inline="always")
def fmax(a, b):
    return max(a, b)


@cuda.jit(device=True, inline="always")
def fadd(a, b):
    return a + b


def map_and_reduce_kernel(x, out, row_max, row_sum):
    """``out = x`` through the registers of one warpgroup; ``row_max`` / ``row_sum`` of every row of ``x``."""
    t = cuda.threadIdx.x
    lane = t % 32
    row0 = 16 * (t // 32) + lane // 4
    acc = wgmma_map(wgmma_zeros(N), from_array, (x, row0))
    wgmma_store_global(acc, out, 0, 0)
    m0, m1 = wgmma_row_reduce(acc, fmax, NEG_INF)
    s0, s1 = wgmma_row_reduce(acc, fadd, ZERO)
    if lane % 4 == 0:
        row_max[row0] = m0
        row_max[row0 + 8] = m1
        row_sum[row0] = s0
        row_sum[row0 + 8] = s1


SIGNATURE = (types.float32[:, ::1], types.float32[:, ::1], types.float32[::1], types.float32[::1])


def run_map_and_reduce(kernel, rng):
    """Launch ``kernel`` (the cuda.jit of map_and_reduce_kernel) on fresh random data, outputs poisoned; check."""
    x = rng.standard_normal((64, N)).astype(np.float32)
    out = cuda.to_device(np.full((64, N), np.nan, np.float32))
    row_max = cuda.to_device(np.full(64, np.nan, np.float32))
    row_sum = cuda.to_device(np.full(64, np.nan, np.float32))
    kernel[1, 128](cuda.to_device(x), out, row_max, row_sum)
    np.testing.assert_array_equal(out.copy_to_host(), x)
    np.testing.assert_array_equal(row_max.copy_to_host(), x.max(1))
    np.testing.assert_allclose(row_sum.copy_to_host(), x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
