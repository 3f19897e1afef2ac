"""Kernels and NumPy references shared by the swizzled-view tests: tests/test_swizzle_cpu.py (compile checks),
tests/sim/test_sim_swizzle.py (simulator) and tests/test_gpu_swizzle.py (GPU).

* ``load_kernel``: every block TMA-loads one box of ``src`` (a swizzled tile, or a plain one) and its threads
  copy it out in logical order through ``swizzled(tile, src)[i, ..., c]`` - and a second time through raw
  byte offsets and ``swizzle_offset`` on a flat view of the tile. Both copies must equal the box (zeros where
  the box hangs over the array: the load's out-of-bounds fill).
* ``store_kernel``: every block's threads write the logical values of one box of ``values`` through the view
  (a tile carved from a larger shared buffer with ``shared_view``), fence, sync, and one thread TMA-stores
  the tile through ``dst``: ``dst`` must equal ``values``.

The grid covers the array with boxes; the innermost axis ends 16 bytes into the second box (clipped stores
and loads), and loads start one element before the outermost axis (an out-of-bounds first row).
"""
import functools
import math

import numpy as np
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    shared_view,
    tma_load,
    tma_store,
)
from numbatma.intrinsics.swizzle import swizzle_offset, swizzled

# (swizzle span, dtype, box). Rows of exactly the span, rows narrower than it (each takes a whole span:
# marked), no swizzle, 1- to 8-byte elements, ranks 1-3.
CASES = [
    (0, "float32", (8, 8)),
    (0, "uint8", (4, 48)),
    (0, "float64", (24,)),
    (32, "uint8", (8, 32)),
    (32, "float32", (16, 4)),  # 16-byte rows: shared (16, 8)
    (32, "int32", (8, 8)),
    (64, "float16", (16, 32)),
    (64, "float32", (16, 8)),  # 32-byte rows: shared (16, 16)
    (64, "uint16", (8, 16)),  # 32-byte rows: shared (8, 32)
    (128, "float32", (16, 32)),
    (128, "float64", (8, 16)),
    (128, "uint8", (8, 128)),
    (128, "float16", (8, 32)),  # 64-byte rows: shared (8, 64)
    (128, "float64", (8, 4)),  # 32-byte rows: shared (8, 16)
    (128, "uint16", (16, 8)),  # 16-byte rows: shared (16, 64)
    (128, "float16", (2, 8, 64)),
    (64, "float32", (3, 4, 8)),  # rank 3, 32-byte rows: shared (3, 4, 16)
    (32, "uint8", (2, 4, 32)),
]
IDS = [f"sw{s}-{d}-{'x'.join(map(str, b))}" for s, d, b in CASES]
THREADS = 64
LOAD_ORIGIN = -1  # loads start one element before the outermost axis (rank >= 2)


def source_shape(box, itemsize):
    """Two boxes along every axis: the outer ones one element short of two boxes, the innermost 16 bytes
    into the second box (so rows stay a whole number of 16-byte units: TMA strides and exact stores)."""
    if len(box) == 1:
        return (box[0] + 16 // itemsize,)
    return tuple(2 * b - 1 for b in box[:-1]) + (box[-1] + 16 // itemsize,)


def grid_of(shape, box, origin=0):
    """Blocks (x, y, z: innermost axis first) covering the array with boxes whose outermost coordinate starts at
    ``origin``."""
    counts = [-(-(n - (origin if axis == 0 else 0)) // b) for axis, (n, b) in enumerate(zip(shape, box))]
    return tuple(reversed(counts))


def random_array(rng, dtype, shape):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)


def poisoned(dtype, shape):
    """NaN, or the bytes 0xA5 for integers."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.full(shape, np.nan, dt)
    return np.frombuffer(b"\xa5" * (math.prod(shape) * dt.itemsize), dt).reshape(shape).copy()


def box_at(host, start, box):
    """The box of ``host`` at ``start`` with zeros outside the array (a TMA load's zero fill)."""
    out = np.zeros(box, host.dtype)
    src, dst = [], []
    for s, b, n in zip(start, box, host.shape):
        lo, hi = max(s, 0), min(s + b, n)
        if hi <= lo:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - s, hi - s))
    out[tuple(dst)] = host[tuple(src)]
    return out


def _slot_elements(shared_shape, itemsize):
    """Elements of one 1024-byte-aligned slot holding a tile of ``shared_shape``."""
    return -(-math.prod(shared_shape) * itemsize // 1024) * 1024 // itemsize


@functools.lru_cache(maxsize=None)
def load_kernel(dtype, box, shared_shape, span):
    nb = np.dtype(dtype).type
    itemsize = np.dtype(dtype).itemsize
    rank = len(box)
    n = math.prod(box)
    total = math.prod(shared_shape)
    pitch = shared_shape[-1] * itemsize  # bytes from one tile row to the next

    @cuda.jit
    def kernel(src, out, raw, origin):
        tile = cuda.shared.array(shared_shape, nb, alignment=1024)
        bar = cuda.shared.array(1, np.uint64)
        bx, by, bz = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, src.box_bytes)
            if rank == 1:
                tma_load(tile, src, bx * box[0], bar)
            elif rank == 2:
                tma_load(tile, src, (by * box[0] + origin, bx * box[1]), bar)
            else:
                tma_load(tile, src, (bz * box[0] + origin, by * box[1], bx * box[2]), bar)
        cuda.syncthreads()
        mbarrier_wait_parity(bar, 0)
        view = swizzled(tile, src)
        flat = shared_view(tile, 0, (total,))
        cols = view.shape[rank - 1]
        for k in range(cuda.threadIdx.x, n, cuda.blockDim.x):
            c = k % cols
            row = k // cols  # the leading indices folded
            at = swizzle_offset(span, row * pitch + c * itemsize) // itemsize
            if rank == 1:
                out[bx, c] = view[c]
                raw[bx, c] = flat[at]
            elif rank == 2:
                out[by, bx, row, c] = view[row, c]
                raw[by, bx, row, c] = flat[at]
            else:
                i = row // view.shape[1]
                j = row % view.shape[1]
                out[bz, by, bx, i, j, c] = view[i, j, c]
                raw[bz, by, bx, i, j, c] = flat[at]

    return kernel


@functools.lru_cache(maxsize=None)
def store_kernel(dtype, box, shared_shape):
    nb = np.dtype(dtype).type
    rank = len(box)
    n = math.prod(box)
    slot = _slot_elements(shared_shape, np.dtype(dtype).itemsize)
    buffer = 2 * slot  # (a shape must be a constant: no arithmetic in the kernel)

    @cuda.jit
    def kernel(values, dst, which):
        buf = cuda.shared.array(buffer, nb, alignment=1024)
        tile = shared_view(buf, which * slot, shared_shape)  # (a tile carved from a larger buffer)
        view = swizzled(tile, dst)
        bx, by, bz = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        cols = view.shape[rank - 1]
        for k in range(cuda.threadIdx.x, n, cuda.blockDim.x):
            c = k % cols
            row = k // cols
            if rank == 1:
                g = bx * box[0] + c
                if g < values.shape[0]:
                    view[c] = values[g]
            elif rank == 2:
                gr, gc = by * box[0] + row, bx * box[1] + c
                if gr < values.shape[0] and gc < values.shape[1]:
                    view[row, c] = values[gr, gc]
            else:
                i = row // view.shape[1]
                j = row % view.shape[1]
                g0, g1, g2 = bz * box[0] + i, by * box[1] + j, bx * box[2] + c
                if g0 < values.shape[0] and g1 < values.shape[1] and g2 < values.shape[2]:
                    view[i, j, c] = values[g0, g1, g2]
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            if rank == 1:
                tma_store(dst, bx * box[0], tile)
            elif rank == 2:
                tma_store(dst, (by * box[0], bx * box[1]), tile)
            else:
                tma_store(dst, (bz * box[0], by * box[1], bx * box[2]), tile)
            bulk_commit_group()
            bulk_wait_group(0)

    return kernel


def _host(d):
    return d.copy_to_host() if hasattr(d, "copy_to_host") else d


def run_load(rng, span, dtype, box):
    """(through the view, through swizzle_offset, the boxes NumPy expects), each of shape grid + box."""
    itemsize = np.dtype(dtype).itemsize
    host = random_array(rng, dtype, source_shape(box, itemsize))
    d_src = cuda.to_device(host)
    desc = numbatma.TensorMap(d_src, box, swizzle=span)
    origin = LOAD_ORIGIN if len(box) > 1 else 0
    grid = grid_of(host.shape, box, origin)
    blocks = tuple(reversed(grid))  # (outer ..., inner)
    want = np.zeros(blocks + box, host.dtype)
    for b in np.ndindex(*blocks):
        start = [i * e for i, e in zip(b, box)]
        start[0] += origin
        want[b] = box_at(host, start, box)
    d_out = cuda.to_device(poisoned(dtype, want.shape))
    d_raw = cuda.to_device(poisoned(dtype, want.shape))
    load_kernel(dtype, box, desc.shared_shape, span)[grid, THREADS](desc, d_out, d_raw, origin)
    return _host(d_out), _host(d_raw), want


def run_store(rng, span, dtype, box, which=1):
    """(what the stores wrote, what NumPy expects: the values)."""
    itemsize = np.dtype(dtype).itemsize
    values = random_array(rng, dtype, source_shape(box, itemsize))
    d_values = cuda.to_device(values)
    d_dst = cuda.to_device(poisoned(dtype, values.shape))
    desc = numbatma.TensorMap(d_dst, box, swizzle=span)
    grid = grid_of(values.shape, box)
    store_kernel(dtype, box, desc.shared_shape)[grid, THREADS](d_values, desc, which)
    return _host(d_dst), values


def assert_same_bits(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    u = f"u{want.dtype.itemsize}"
    a, b = np.ascontiguousarray(got).view(u), np.ascontiguousarray(want).view(u)
    if not np.array_equal(a, b):
        bad = np.argwhere(a != b)
        raise AssertionError(f"{len(bad)} of {a.size} elements differ, first at {bad[:4].tolist()}: got "
                             f"{[got[tuple(i)] for i in bad[:4]]}, want {[want[tuple(i)] for i in bad[:4]]}")
