"""GPU tests (marker ``gpu``): TMA reduce-stores (``tma_reduce``, ``tma_reduce_hinted``) and tensor L2 prefetches
(``tma_prefetch``, ``tma_prefetch_hinted``) against NumPy on fresh random data.

Each reduce test pre-fills the destination with random data, then every block loads its own tile and reduces it
into a box of the destination: two blocks at the same box, one shifted by an element (overlaps, so reductions
really accumulate), boxes hanging over the end of every axis (clipping; a reduce box may not start before the tensor), and random ones. The data
is chosen so the result does not depend on the order of the blocks (exact float sums; inc/dec with one tile for
every block). Prefetch outputs are poisoned first.
"""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    fence_proxy_async_shared_cta,
)
from numbatma.intrinsics.tma import tma_reduce

import tma_ops_kernels as K

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()
PAIRS = [(kind, dtype) for kind, dtypes in K.LEGAL.items() for dtype in dtypes]


class _Bfloat16View:
    """A uint16 device array presented as bfloat16 (typestr ``<V2``, which numbatma reads as bfloat16)."""

    def __init__(self, dev):
        self.dev = dev
        if hasattr(dev, "_ary"):  # (under the CUDA simulator, where this file can run too)
            self._ary = dev._ary.view(K.np_dtype("bfloat16"))
        else:
            self.__cuda_array_interface__ = dict(dev.__cuda_array_interface__, typestr="<V2")


def to_device(host, dtype):
    """(device array, what a TensorMap is built from) for host data of ``dtype``."""
    if dtype == "bfloat16":
        dev = cuda.to_device(host.view(np.uint16))
        return dev, _Bfloat16View(dev)
    dev = cuda.to_device(host)
    return dev, dev


def to_host(dev, dtype):
    out = dev.copy_to_host()
    return out.view(K.np_dtype(dtype)) if dtype == "bfloat16" else out


def assert_same_bits(got, want):
    assert got.shape == want.shape
    u = f"u{want.dtype.itemsize}"
    np.testing.assert_array_equal(got.view(u), want.view(u))


def run_reduce(kind, dtype, rank, swizzle=0, hinted=False, n_random=6, coords=None, same=None):
    shape, box = K.SHAPES[rank], K.BOXES[rank]
    same = kind in ("inc", "dec") if same is None else same
    if coords is None:
        coords = K.box_coords(rng, shape, box, n_random, K.np_dtype(dtype).itemsize)
    src, src_coords, tiles = K.source_tiles(rng, kind, dtype, box, len(coords), same=same)
    dst = K.random_data(rng, kind, dtype, shape)
    want = K.reference(kind, dst, tiles, coords)
    _, src_arg = to_device(src, dtype)
    d_dst, dst_arg = to_device(dst, dtype)
    d_src = numbatma.TensorMap(src_arg, box, swizzle=swizzle)
    d_out = numbatma.TensorMap(dst_arg, box, swizzle=swizzle)
    kernel = K.reduce_kernel(kind, d_src.shared_shape, dtype, rank, hinted)
    kernel[len(coords), 32](d_src, d_out, cuda.to_device(src_coords), cuda.to_device(coords))
    cuda.synchronize()
    got = to_host(d_dst, dtype)
    assert not np.array_equal(want.view(f"u{want.dtype.itemsize}"), dst.view(f"u{dst.dtype.itemsize}")), \
        "the test data leaves the destination unchanged"
    return got, want


@pytest.mark.parametrize("kind, dtype", PAIRS, ids=[f"{k}-{d}" for k, d in PAIRS])
def test_every_reduction_and_dtype(kind, dtype):
    got, want = run_reduce(kind, dtype, 2)
    assert_same_bits(got, want)


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("kind, dtype", [("add", "float32"), ("xor", "uint64"), ("min", "int32"),
                                         ("add", "bfloat16")])
def test_every_rank_with_partial_boxes(kind, dtype, rank):
    got, want = run_reduce(kind, dtype, rank)
    assert_same_bits(got, want)


@pytest.mark.parametrize("swizzle, dtype", [(32, "float16"), (64, "float16"), (64, "float32"), (128, "float16"),
                                            (128, "float32")])
def test_swizzled_tiles(swizzle, dtype):
    # rows of 16 elements (32 or 64 bytes), some narrower than the span: the TMA reads the tile it loaded
    got, want = run_reduce("add", dtype, 2, swizzle=swizzle)
    assert_same_bits(got, want)


@pytest.mark.parametrize("kind, dtype", [("max", "int64"), ("add", "float16"), ("inc", "uint32")])
def test_hinted(kind, dtype):
    got, want = run_reduce(kind, dtype, 3, hinted=True)
    assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", ["uint32", "float32", "uint64"])
def test_many_blocks_accumulate_into_one_box(dtype):
    # 96 blocks reduce into the same box (and 32 more into a shifted one): the updates are atomic per element
    shape, box = K.SHAPES[2], K.BOXES[2]
    coords = np.array([(3, 8)] * 96 + [(4, 16)] * 32, np.int32)
    got, want = run_reduce("add", dtype, 2, coords=coords)
    assert_same_bits(got, want)


def test_inc_dec_semantics():
    # inc: old >= v ? 0 : old + 1; dec: (old == 0 or old > v) ? v : old - 1 (unsigned 32-bit)
    old = np.array([0, 1, 5, 6, 7, 0xFFFFFFFF, 4, 0] + [3] * 8, np.uint32)
    val = np.array([5, 5, 5, 5, 5, 5, 0xFFFFFFFF, 0] + [0] * 8, np.uint32)
    expected = {"inc": [1, 2, 0, 0, 0, 0, 5, 0] + [0] * 8, "dec": [5, 0, 4, 5, 5, 5, 3, 0] + [0] * 8}
    for kind, want in expected.items():
        d_src, d_dst = cuda.to_device(val), cuda.to_device(old)
        t_src, t_dst = numbatma.TensorMap(d_src, (16,)), numbatma.TensorMap(d_dst, (16,))
        zero = cuda.to_device(np.zeros((1, 1), np.int32))
        K.reduce_kernel(kind, t_src.shared_shape, "uint32", 1)[1, 32](t_src, t_dst, zero, zero)
        cuda.synchronize()
        np.testing.assert_array_equal(d_dst.copy_to_host(), np.array(want, np.uint32), err_msg=kind)


def test_boxes_entirely_out_of_bounds_change_nothing():
    host = rng.standard_normal((20, 40)).astype(np.float32)
    d_src, d_dst = cuda.to_device(np.ones((4 * 8, 16), np.float32)), cuda.to_device(host)
    t_src, t_dst = numbatma.TensorMap(d_src, (8, 16)), numbatma.TensorMap(d_dst, (8, 16))
    src_coords = np.zeros((2, 2), np.int32)
    src_coords[:, 0] = np.arange(2) * 8
    coords = np.array([[20, 0], [0, 40]], np.int32)  # (past the end only: negative ones fault, probe_reduce.py)
    K.reduce_kernel("add", t_src.shared_shape, "float32", 2)[2, 32](t_src, t_dst, cuda.to_device(src_coords),
                                                                    cuda.to_device(coords))
    cuda.synchronize()
    assert_same_bits(d_dst.copy_to_host(), host)


@cuda.jit
def reduce_constant_tile(dst, row, col, value):
    tile = cuda.shared.array((8, 16), np.float32, alignment=128)
    for i in range(cuda.threadIdx.x, 8 * 16, cuda.blockDim.x):
        tile[i // 16, i % 16] = value
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        tma_reduce("add", dst, (row, col), tile)
        bulk_commit_group()
        bulk_wait_group(0)


def test_clipped_rows_reduce_into_the_16_byte_completion():
    """Like a store (TensorMap.store_overhang), a reduce that clips a row whose end is not on a 16-byte
    boundary also reduces up to that boundary (observed on an H200). Rows of 70 float32 (280 bytes) in an
    array with rows of 72: columns 70 and 71 of the clipped rows get the tile's values added too."""
    host = rng.standard_normal((16, 72)).astype(np.float32)
    dev = cuda.to_device(host)
    view = numbatma.TensorMap(dev[:, :70], (8, 16), allow_store_overhang=True)  # (columns 70, 71 are ours)
    reduce_constant_tile[1, 64](view, 4, 60, np.float32(1.0))
    cuda.synchronize()
    want = host.copy()
    want[4:12, 60:72] += np.float32(1.0)
    assert_same_bits(dev.copy_to_host(), want)


def test_float32_add_keeps_subnormals():
    """Hardware probe: the simulator adds float32 without flushing subnormals (PTX says cp.reduce.async.bulk
    .add.f32 - the non-tensor form - flushes them; cp.reduce.async.bulk.tensor says nothing)."""
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal * 3)
    host = np.zeros((8, 16), np.float32)
    host[0, :] = tiny
    dev = cuda.to_device(host)
    reduce_constant_tile[1, 64](numbatma.TensorMap(dev, (8, 16)), 0, 0, tiny)
    cuda.synchronize()
    want = host + tiny
    assert_same_bits(dev.copy_to_host(), want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_min_max_with_nan_pick_the_number(dtype):
    """Hardware probe: the simulator follows PTX min/max for floats (a NaN operand yields the other one)."""
    dt = K.np_dtype(dtype)
    box = K.BOXES[2]
    old = rng.standard_normal(box).astype(np.float32).astype(dt)
    val = rng.standard_normal(box).astype(np.float32).astype(dt)
    old[0, :4] = np.nan
    val[1, :4] = np.nan
    for kind, pick in (("min", np.fmin), ("max", np.fmax)):
        _, src_arg = to_device(val, dtype)
        d_dst, dst_arg = to_device(old, dtype)
        t_src, t_dst = numbatma.TensorMap(src_arg, box), numbatma.TensorMap(dst_arg, box)
        zero = cuda.to_device(np.zeros((1, 2), np.int32))
        K.reduce_kernel(kind, t_src.shared_shape, dtype, 2)[1, 32](t_src, t_dst, zero, zero)
        cuda.synchronize()
        want = pick(old.astype(np.float32), val.astype(np.float32)).astype(dt)
        assert not np.isnan(want.astype(np.float32)).any()
        assert_same_bits(to_host(d_dst, dtype), want)


# -- prefetch ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hinted", [False, True])
@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_prefetch_then_load_gives_the_box(rank, hinted):
    shape, box = K.SHAPES[rank], K.BOXES[rank]
    host = rng.standard_normal(shape).astype(np.float32)
    coords = K.box_coords(rng, shape, box, 6, 4)
    n = len(coords)
    out_coords = np.zeros_like(coords)
    out_coords[:, 0] = np.arange(n) * box[0]
    d_src = cuda.to_device(host)
    d_out = cuda.to_device(np.full((n * box[0],) + tuple(box[1:]), np.nan, np.float32))
    t_src, t_out = numbatma.TensorMap(d_src, box), numbatma.TensorMap(d_out, box)
    K.prefetch_kernel(t_src.shared_shape, "float32", rank, hinted)[n, 32](
        t_src, t_out, cuda.to_device(coords), cuda.to_device(out_coords))
    cuda.synchronize()
    want = np.zeros((n * box[0],) + tuple(box[1:]), np.float32)
    for b, c in enumerate(coords):  # the box at c, zeros out of bounds
        want[b * box[0]:(b + 1) * box[0]] = K.reference("add", np.zeros(box, np.float32), [host],
                                                        [tuple(-int(x) for x in c)])
    assert_same_bits(d_out.copy_to_host(), want)
    assert_same_bits(d_src.copy_to_host(), host)
