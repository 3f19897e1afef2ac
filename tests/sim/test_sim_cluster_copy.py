"""Under NUMBA_ENABLE_CUDASIM=1: the cluster copies in the simulator, where every cluster is one CTA.

A multicast whose mask names only rank 0 (``cluster_mask_all()`` of a one-CTA cluster) is a TMA load (the
tile matches NumPy; reading it before the barrier wait is diagnosed); a mask naming another CTA raises
NotImplementedError; st_async / red_async, undefined on the GPU in a one-CTA cluster, raise SimulatedMisuse
naming the rule (after checking their operands like the typer does).

The GPU tests' kernels (tests/cluster_copy_kernels.py) run here in clusters of one CTA, with the result the
hardware gives for that shape; the kernels defined here exist to reach the cases the simulator diagnoses."""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.cluster import with_cluster  # (numbatma.with_cluster)
from numbatma.intrinsics import (
    cluster_sync,
    fence_mbarrier_init,
    mapa_barrier,
    mapa_shared,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
)
from numbatma.intrinsics._sim import SimulatedMisuse
from numbatma.intrinsics.cluster_copy import (
    cluster_mask,
    cluster_mask_all,
    cluster_mask_column,
    cluster_mask_row,
    red_async,
    st_async,
    tma_load_multicast,
)

import cluster_copy_kernels as K

RNG = np.random.default_rng()
ONE = (1, 1, 1)
R, C = 8, 16
ALL, ROW, COLUMN, RANK0 = -1, -2, -3, -4  # multicast_copy's mask_kind: a helper, or else the mask itself


@cuda.jit
def multicast_copy(desc, out, mask_kind, wait):
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, desc.box_bytes)
    cluster_sync()
    if tid == 0:
        if mask_kind == ALL:
            mask = cluster_mask_all()
        elif mask_kind == ROW:
            mask = cluster_mask_row()
        elif mask_kind == COLUMN:
            mask = cluster_mask_column()
        elif mask_kind == RANK0:
            mask = cluster_mask(0)
        else:
            mask = mask_kind  # a literal mask
        tma_load_multicast(tile, desc, (cuda.blockIdx.x * R, 0), bar, mask)
    if wait:
        mbarrier_wait_parity(bar, 0)
    for c in range(C):
        out[cuda.blockIdx.x * R + tid, c] = tile[tid, c]
    cluster_sync()


@pytest.mark.parametrize("mask_kind", [ALL, ROW, COLUMN, RANK0, 0x1])
@pytest.mark.parametrize("launch", ["plain", "cluster1"])
def test_multicast_to_the_one_cta_is_a_tma_load(mask_kind, launch):
    blocks = 3
    src = RNG.standard_normal((blocks * R, C)).astype(np.float32)
    out = np.full_like(src, np.nan)
    desc = numbatma.TensorMap(src, (R, C))
    if launch == "plain":
        multicast_copy[blocks, R](desc, out, mask_kind, True)
    else:
        with_cluster(multicast_copy, (1, 1, 1))[blocks, R](desc, out, mask_kind, True)
    np.testing.assert_array_equal(out, src)


def test_multicast_read_before_the_wait_is_reported():
    src = np.ones((R, C), np.float32)
    with pytest.raises(SimulatedMisuse, match=r"reads shared bytes .* of the tile the TMA load at .*before that copy "
                                              r"is known complete"):
        multicast_copy[1, R](numbatma.TensorMap(src, (R, C)), np.zeros((R, C), np.float32), ALL, False)


# (the error cases launch one thread: with more, the others' waits may be reported first as a hang)
@pytest.mark.parametrize("mask,ranks", [(0b10, r"\[1\]"), (0b11, r"\[0, 1\]"), (0xF000, r"\[12, 13, 14, 15\]")])
def test_multicast_to_another_cta_is_not_simulated(mask, ranks):
    src = np.ones((R, C), np.float32)
    with pytest.raises(NotImplementedError, match=rf"tma_load_multicast: the mask 0x{mask:04x} names cluster "
                                                  rf"rank\(s\) {ranks}.*runs every cluster as one CTA"):
        multicast_copy[1, 1](numbatma.TensorMap(src, (R, C)), np.zeros((R, C), np.float32), mask, True)


@pytest.mark.parametrize("mask", [0x10000, 0x20001])
def test_multicast_mask_out_of_range_is_misuse(mask):
    src = np.ones((R, C), np.float32)
    with pytest.raises(SimulatedMisuse, match=r"must be a 16-bit set of cluster ranks naming at least one CTA"):
        multicast_copy[1, 1](numbatma.TensorMap(src, (R, C)), np.zeros((R, C), np.float32), mask, True)


def test_multicast_zero_mask_is_misuse():
    @cuda.jit
    def zero_mask(desc):
        tile = cuda.shared.array((R, C), np.float32, alignment=128)
        bar = cuda.shared.array(1, np.uint64)
        mbarrier_init(bar, 1)
        tma_load_multicast(tile, desc, (0, 0), bar, 0)

    with pytest.raises(SimulatedMisuse, match=r"mask 0x0 must be a 16-bit set"):
        zero_mask[1, 1](numbatma.TensorMap(np.ones((R, C), np.float32), (R, C)))


@cuda.jit
def masks(out):
    out[0] = cluster_mask_all()
    out[1] = cluster_mask_row()
    out[2] = cluster_mask_column()
    out[3] = cluster_mask(0)
    out[4] = cluster_mask(3)


def test_mask_helpers_in_a_one_cta_cluster():
    out = np.zeros(5, np.uint32)
    masks[1, 1](out)
    np.testing.assert_array_equal(out, [1, 1, 1, 1, 8])


# -- st.async / red.async: undefined in a one-CTA cluster -------------------------------------------------------
@cuda.jit
def stas(vals, form):
    buf = cuda.shared.array(8, np.int32, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    mbarrier_init(bar, 1)
    fence_mbarrier_init()
    mbarrier_arrive_expect_tx(bar, 4)
    cluster_sync()
    a = mapa_shared(buf, 0)
    b = mapa_barrier(bar, 0)
    if form == 1:
        st_async(a, vals[0], b)
    elif form == 2:
        st_async(a, (vals[0], vals[1]), b)
    elif form == 4:
        st_async(a, (vals[0], vals[1], vals[2], vals[3]), b)
    else:
        st_async(a, (vals[0], vals[1], vals[2]), b)


@pytest.mark.parametrize("dtype,form", [("int32", 1), ("float32", 2), ("uint32", 4), ("float64", 1),
                                        ("int64", 2)])
def test_st_async_needs_a_cluster_of_two(dtype, form):
    with pytest.raises(SimulatedMisuse, match=r"st_async to shared::cluster address 0x[0-9a-f]+: st\.async needs a "
                                              r"cluster of more than one CTA \(PTX: %cluster_nctarank > 1\).*"
                                              r"numbatma\.with_cluster"):
        stas[1, 1](np.arange(4, dtype=dtype), form)


@pytest.mark.parametrize("dtype,form,message", [
    ("int64", 4, r"st\.async\.v4 takes 32-bit elements only"),
    ("int16", 1, r"stores int32, uint32, float32, int64, uint64 or float64 values, got int16"),
    ("int32", 3, r"a scalar, a 2-tuple or a 4-tuple"),
])
def test_st_async_operands_are_checked_as_on_the_gpu(dtype, form, message):
    with pytest.raises(SimulatedMisuse, match=r"st_async: .*" + message):
        stas[1, 1](np.arange(4, dtype=dtype), form)


@cuda.jit
def red(vals, op_index):
    cnt = cuda.shared.array(8, np.uint32)
    bar = cuda.shared.array(1, np.uint64)
    mbarrier_init(bar, 1)
    cluster_sync()
    a = mapa_shared(cnt, 0)
    b = mapa_barrier(bar, 0)
    if op_index == 0:
        red_async("add", a, vals[0], b)
    elif op_index == 1:
        red_async("inc", a, vals[0], b)
    elif op_index == 2:
        red_async("xor", a, vals[0], b)
    else:
        red_async("mul", a, vals[0], b)


@pytest.mark.parametrize("dtype,op_index", [("uint32", 0), ("int32", 0), ("uint64", 0), ("uint32", 1),
                                            ("int32", 2)])
def test_red_async_needs_another_cta(dtype, op_index):
    with pytest.raises(SimulatedMisuse, match=r"red_async to shared::cluster address 0x[0-9a-f]+: red\.async must "
                                              r"target the shared memory of another CTA of the cluster"):
        red[1, 1](np.ones(1, dtype), op_index)


@pytest.mark.parametrize("dtype,op_index,message", [
    ("int64", 0, r"red\.async\.add takes a value of type uint32, int32 or uint64, got int64"),
    ("int32", 1, r"red\.async\.inc takes a value of type uint32, got int32"),
    ("uint64", 2, r"red\.async\.xor takes a value of type int32 or uint32, got uint64"),
    ("uint32", 3, r"the operation must be one of add, and, dec, inc, max, min, or, xor"),
])
def test_red_async_operands_are_checked_as_on_the_gpu(dtype, op_index, message):
    with pytest.raises(SimulatedMisuse, match=r"red_async: " + message):
        red[1, 1](np.ones(1, dtype), op_index)


def test_clusters_of_more_than_one_cta_do_not_run():
    with pytest.raises(NotImplementedError, match=r"cannot run in Numba's CUDA simulator"):
        with_cluster(multicast_copy, (2, 1, 1))[2, R](
            numbatma.TensorMap(np.ones((2 * R, C), np.float32), (R, C)), np.zeros((2 * R, C), np.float32), ALL, True)


# -- the GPU tests' kernels in clusters of one CTA --------------------------------------------------------------
@pytest.mark.parametrize("mask_bits", [0, 1])  # (0: cluster_mask_all())
@pytest.mark.parametrize("clusters", [1, 3])
def test_gpu_multicast_leader_in_clusters_of_one(clusters, mask_bits):
    src = RNG.standard_normal((clusters * K.R, K.C)).astype(np.float32)
    out = cuda.to_device(np.full((clusters, K.R, K.C), np.nan, np.float32))
    desc = numbatma.TensorMap(cuda.to_device(src), (K.R, K.C))
    K.launch(cuda.jit(K.multicast_leader), ONE, clusters, K.THREADS, desc, out, 0, mask_bits)
    np.testing.assert_array_equal(out.copy_to_host(), src.reshape(clusters, K.R, K.C))


def test_gpu_multicast_slices_in_clusters_of_one():
    clusters = 3
    src = RNG.standard_normal((clusters * K.R, K.C)).astype(np.float32)
    out = cuda.to_device(np.full((clusters, K.R, K.C), np.nan, np.float32))
    desc = numbatma.TensorMap(cuda.to_device(src), (K.R, K.C))  # (the one slice is the whole tile)
    K.launch(cuda.jit(K.make_multicast_slices(1)), ONE, clusters, K.THREADS, desc, out)
    np.testing.assert_array_equal(out.copy_to_host(), src.reshape(clusters, K.R, K.C))


def test_gpu_mask_geometry_in_clusters_of_one():
    grid = (2, 3, 2)
    out = cuda.to_device(np.full((int(np.prod(grid)), 7), 0xDEADBEEF, np.uint32))
    K.launch(cuda.jit(K.mask_geometry), ONE, grid, 32, out)
    want = K.expected_mask_geometry(grid, ONE)
    np.testing.assert_array_equal(out.copy_to_host(), want)
    assert (want[:, 2:6] == 1).all() and (want[:, 6] == 1 + 16 + 256).all()


def test_gpu_all_to_all_in_clusters_of_one_sends_nothing():
    """A CTA alone in its cluster has no other CTA to store into: every slot keeps its -1."""
    nblocks = 2
    src = K.random_values(RNG, nblocks, np.int32)
    out = cuda.to_device(np.full((nblocks, K.SLOTS), 12345, np.int32))
    K.launch(cuda.jit(K.all_to_all), ONE, nblocks, 32, cuda.to_device(src), out)
    np.testing.assert_array_equal(out.copy_to_host(), -1)


@pytest.mark.parametrize("op,dtype", [("add", "uint64"), ("min", "int32"), ("inc", "uint32")])
def test_gpu_red_in_clusters_of_one_leaves_the_counters(op, dtype):
    """No other CTA to reduce into: the counters keep their initial values (the barrier expects 0 bytes)."""
    nblocks = 2
    init = K.random_values(RNG, (nblocks, K.COUNTERS), dtype)
    vals = K.random_values(RNG, (nblocks, K.RED_THREADS), dtype)
    out = cuda.to_device(K.poison((nblocks, K.COUNTERS), dtype))
    K.launch(cuda.jit(K.make_red(op, dtype)), ONE, nblocks, K.RED_THREADS, cuda.to_device(init), cuda.to_device(vals),
             out)
    np.testing.assert_array_equal(out.copy_to_host(), init)


@pytest.mark.parametrize("dtype,vec", [("int32", 1), ("uint32", 2), ("float32", 4), ("float64", 2)])
def test_gpu_st_async_ring_in_a_cluster_of_one_is_misuse(dtype, vec):
    """The right neighbour of the only CTA is itself: st.async to the own CTA is undefined (one thread: see the
    error cases above)."""
    src = K.random_values(RNG, K.STAS_THREADS * vec, dtype)
    with pytest.raises(SimulatedMisuse, match=r"st\.async needs a cluster of more than one CTA"):
        with_cluster(cuda.jit(K.make_stas_ring(dtype, vec)), ONE)[1, 1](src, K.poison(src.size, dtype))
