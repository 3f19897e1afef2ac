"""Under NUMBA_ENABLE_CUDASIM=1: TMA reduce-stores (tma_reduce, tma_reduce_hinted) against NumPy for every
reduction and legal dtype, with overlapping and partial boxes, swizzled tiles; the hazard checks a TMA store
has; illegal (reduction, dtype) pairs; tensor prefetches change nothing and check their coordinates."""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    fence_proxy_async_shared_cta,
)
from numbatma.intrinsics._sim import SimulatedMisuse
from numbatma.intrinsics.tma import tma_prefetch, tma_reduce

import tma_ops_kernels as K

RNG = np.random.default_rng()
PAIRS = [(kind, dtype) for kind, dtypes in K.LEGAL.items() for dtype in dtypes]


def run_reduce(kind, dtype, rank, swizzle=0, hinted=False, n_random=3):
    shape, box = K.SHAPES[rank], K.BOXES[rank]
    same = kind in ("inc", "dec")  # (the same tile everywhere: overlapping inc/dec are order-independent)
    coords = K.box_coords(RNG, shape, box, n_random, K.np_dtype(dtype).itemsize)
    src, src_coords, tiles = K.source_tiles(RNG, kind, dtype, box, len(coords), same=same)
    dst = K.random_data(RNG, kind, dtype, shape)
    want = K.reference(kind, dst, tiles, coords)
    d_src = numbatma.TensorMap(src, box, swizzle=swizzle)
    d_dst = numbatma.TensorMap(dst, box, swizzle=swizzle)
    kernel = K.reduce_kernel(kind, d_src.shared_shape, dtype, rank, hinted)
    kernel[len(coords), 1](d_src, d_dst, src_coords, coords)
    return dst, want


def assert_same(got, want):
    u = f"u{want.dtype.itemsize}"
    np.testing.assert_array_equal(got.view(u), want.view(u))


@pytest.mark.parametrize("kind, dtype", PAIRS, ids=[f"{k}-{d}" for k, d in PAIRS])
def test_every_reduction_and_dtype(kind, dtype):
    got, want = run_reduce(kind, dtype, 2)
    assert_same(got, want)


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("kind, dtype", [("add", "float32"), ("xor", "uint64"), ("min", "int32")])
def test_every_rank(kind, dtype, rank):
    got, want = run_reduce(kind, dtype, rank)
    assert_same(got, want)


@pytest.mark.parametrize("swizzle, dtype", [(32, "float16"), (64, "float16"), (64, "float32"), (128, "float16"),
                                            (128, "float32")])
def test_swizzled_tiles(swizzle, dtype):
    # rows of 16 elements: 32 or 64 bytes, some narrower than the span (then each row takes a whole span)
    got, want = run_reduce("add", dtype, 2, swizzle=swizzle)
    assert_same(got, want)


def test_hinted():
    got, want = run_reduce("max", "int64", 3, hinted=True)
    assert_same(got, want)


def test_reference_is_not_trivial():
    # the data really changes, and overlapping boxes really accumulate (guards the tests above)
    shape, box = K.SHAPES[2], K.BOXES[2]
    dst = np.zeros(shape, np.float32)
    tiles = [np.ones(box, np.float32)] * 3
    out = K.reference("add", dst, tiles, [(0, 0), (0, 0), (1, 1)])
    assert out[0, 0] == 2 and out[1, 1] == 3 and out[8, 16] == 1 and out[9, 17] == 0


def test_inc_dec_semantics():
    dst = np.array([0, 1, 5, 6, 7, 0xFFFFFFFF] + [3] * 10, np.uint32)
    val = np.array([5, 5, 5, 5, 5, 5] + [0] * 10, np.uint32)
    for kind, want in (("inc", [1, 2, 0, 0, 0, 0] + [0] * 10), ("dec", [5, 0, 4, 5, 5, 5] + [0] * 10)):
        got = dst.copy()
        d_src = numbatma.TensorMap(val.copy(), (16,))
        d_dst = numbatma.TensorMap(got, (16,))
        K.reduce_kernel(kind, d_src.shared_shape, "uint32", 1)[1, 1](d_src, d_dst, np.zeros((1, 1), np.int32),
                                                                     np.zeros((1, 1), np.int32))
        np.testing.assert_array_equal(got, np.array(want, np.uint32), err_msg=kind)


def test_box_entirely_out_of_bounds_changes_nothing():
    dst = RNG.standard_normal((20, 40)).astype(np.float32)
    before = dst.copy()
    src = np.ones((8, 16), np.float32)
    d_src, d_dst = numbatma.TensorMap(src, (8, 16)), numbatma.TensorMap(dst, (8, 16))
    coords = np.array([[20, 0], [0, 40]], np.int32)
    K.reduce_kernel("add", d_src.shared_shape, "float32", 2)[2, 1](d_src, d_dst, np.zeros((2, 2), np.int32), coords)
    assert_same(dst, before)


@pytest.mark.parametrize("coords", [(-8, 0), (0, -16)])
def test_negative_coordinates_are_reported(coords):
    """On an H200 a tile reduce whose box starts before the tensor faults (scripts/probe_reduce.py)."""
    dst = np.zeros((20, 40), np.float32)
    src = np.ones((8, 16), np.float32)
    d_src, d_dst = numbatma.TensorMap(src, (8, 16)), numbatma.TensorMap(dst, (8, 16))
    with pytest.raises(SimulatedMisuse, match="negative"):
        K.reduce_kernel("add", d_src.shared_shape, "float32", 2)[1, 1](d_src, d_dst, np.zeros((1, 2), np.int32),
                                                                       np.array([coords], np.int32))


def test_overhang_of_a_clipped_row_is_reduced_too():
    # rows of 70 float32 (280 bytes, not a whole number of 16-byte units) in a padded array: like a store, a
    # reduce completes the clipped rows to 16 bytes (H200), so columns 70 and 71 are reduced as well
    base = RNG.standard_normal((16, 72)).astype(np.float32)
    before = base.copy()
    src = np.ones((8, 16), np.float32)
    d_src = numbatma.TensorMap(src, (8, 16))
    d_dst = numbatma.TensorMap(base[:, :70], (8, 16), allow_store_overhang=True)  # (columns 70, 71 are ours)
    K.reduce_kernel("add", d_src.shared_shape, "float32", 2)[1, 1](d_src, d_dst, np.zeros((1, 2), np.int32),
                                                                   np.array([[4, 60]], np.int32))
    want = before.copy()
    want[4:12, 60:72] += 1
    assert_same(base, want)


# -- typing and misuse -------------------------------------------------------------------------------------
@cuda.jit
def reduce_with(kind, dst, tile_value):
    tile = cuda.shared.array((8, 16), np.int64, alignment=128)
    for i in range(8):
        for j in range(16):
            tile[i, j] = tile_value
    fence_proxy_async_shared_cta()
    tma_reduce(kind, dst, (0, 0), tile)
    bulk_commit_group()
    bulk_wait_group(0)


@pytest.mark.parametrize("kind, dtype", [("add", "int64"), ("add", "float64"), ("min", "float32"),
                                         ("inc", "int32"), ("and", "float32"), ("mul", "int32")])
def test_illegal_reduction_is_refused(kind, dtype):
    dst = np.zeros((8, 16), dtype)
    with pytest.raises(Exception, match=rf"tma_reduce: .*{kind}"):
        reduce_with[1, 1](kind, numbatma.TensorMap(dst, (8, 16)), 1)


@cuda.jit
def reduce_unfenced(dst):
    tile = cuda.shared.array((8, 16), np.float32, alignment=128)
    tile[0, 0] = 1.0
    tma_reduce("add", dst, (0, 0), tile)
    bulk_commit_group()
    bulk_wait_group(0)


def test_tile_written_without_fence_is_misuse():
    dst = np.zeros((8, 16), np.float32)
    with pytest.raises(SimulatedMisuse, match="tma_reduce from a shared tile .* without fence_proxy_async"):
        reduce_unfenced[1, 1](numbatma.TensorMap(dst, (8, 16)))


@cuda.jit
def reduce_then_overwrite(dst, wait_read):
    tile = cuda.shared.array((8, 16), np.float32, alignment=128)
    for i in range(8):
        for j in range(16):
            tile[i, j] = 0.0
    tile[0, 0] = 1.0
    fence_proxy_async_shared_cta()
    tma_reduce("add", dst, (0, 0), tile)
    bulk_commit_group()
    if wait_read:
        bulk_wait_group_read(0)
    tile[0, 0] = 2.0
    bulk_wait_group(0)


def test_tile_overwritten_while_the_reduce_reads_it_is_misuse():
    dst = np.zeros((8, 16), np.float32)
    with pytest.raises(SimulatedMisuse, match="may still be reading"):
        reduce_then_overwrite[1, 1](numbatma.TensorMap(dst, (8, 16)), False)
    dst[:] = 0
    reduce_then_overwrite[1, 1](numbatma.TensorMap(dst, (8, 16)), True)
    assert dst[0, 0] == 1 and dst.sum() == 1


# -- prefetch ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hinted", [False, True])
@pytest.mark.parametrize("rank", [1, 3, 5])
def test_prefetch_then_load(rank, hinted):
    shape, box = K.SHAPES[rank], K.BOXES[rank]
    src = RNG.standard_normal(shape).astype(np.float32)
    before = src.copy()
    coords = K.box_coords(RNG, shape, box, 2, 4)
    out = np.full((len(coords) * box[0],) + tuple(box[1:]), np.nan, np.float32)
    out_coords = np.zeros_like(coords)
    out_coords[:, 0] = np.arange(len(coords)) * box[0]
    d_src, d_out = numbatma.TensorMap(src, box), numbatma.TensorMap(out, box)
    K.prefetch_kernel(d_src.shared_shape, "float32", rank, hinted)[len(coords), 1](d_src, d_out, coords, out_coords)
    want = np.zeros_like(out)
    for b, c in enumerate(coords):  # the box with zeros out of bounds
        boxed = K.reference("add", np.zeros(box, np.float32), [src], [tuple(-int(x) for x in c)])
        want[b * box[0]:(b + 1) * box[0]] = boxed
    assert_same(out, want)
    assert_same(src, before)


@cuda.jit
def prefetch_wrong_rank(src):
    tma_prefetch(src, (0, 0, 0))


def test_prefetch_checks_the_coordinate_count():
    with pytest.raises(Exception, match=r"tma_prefetch: the descriptor has rank 2 .* 3 coordinates"):
        prefetch_wrong_rank[1, 1](numbatma.TensorMap(np.zeros((8, 16), np.float32), (8, 16)))
