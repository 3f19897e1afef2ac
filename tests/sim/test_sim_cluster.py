"""Under NUMBA_ENABLE_CUDASIM=1: clusters of one CTA. The GPU test kernels (tests/cluster_kernels.py) run with
the hardware's result for a cluster of (1, 1, 1): rank 0 of 1, clusterid == blockIdx, DSMEM to rank 0 is the
CTA's own shared memory, a remote arrive on its own barrier; the cluster barrier is a block barrier. Clusters of
more than one CTA, and ranks other than 0, are refused with a message."""
import math

import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.cluster import cluster_kernel, with_cluster
from numbatma.intrinsics import (
    barrier_cluster_arrive,
    barrier_cluster_arrive_relaxed,
    barrier_cluster_wait,
    cluster_ctarank,
    cluster_sync,
    fence_acq_rel_cluster,
    ld_cluster_u32,
    mapa_barrier,
    mapa_shared,
    mbarrier_arrive_cluster,
    mbarrier_arrive_cluster_cta,
    st_cluster_u32,
)
from numbatma.intrinsics._sim import SimulatedHang, SimulatedMisuse

import cluster_kernels as K

RNG = np.random.default_rng()
ONE = (1, 1, 1)


@pytest.mark.parametrize("grid", [(3, 2, 1), (2, 1, 2)])
@pytest.mark.parametrize("launch", ["plain", "with_cluster", "cluster_kernel"])
def test_cluster_registers_are_a_cluster_of_one(grid, launch):
    out = np.full((math.prod(grid), K.NIDS), K.POISON, np.uint32)
    kernel = cuda.jit(K.k_ids)
    if launch == "plain":
        kernel[grid, 4](out)
    elif launch == "with_cluster":
        with_cluster(kernel, ONE)[grid, 4](out)
    else:
        cluster_kernel(1)(kernel)[grid, 4](out)
    want = K.expected_ids(grid, ONE)
    np.testing.assert_array_equal(out, want)
    # the mapping the GPU tests expect, for a cluster of one: clusterid == blockIdx, nclusterid == gridDim
    assert want[:, 0].max() == 0 and (want[:, 1] == 1).all()
    assert tuple(want[-1, 8:11]) == tuple(d - 1 for d in grid) and tuple(want[0, 11:14]) == grid


def test_dsmem_to_rank_0_is_the_ctas_own_shared_memory():
    grid, nblocks = (3, 1, 1), 3
    vals = RNG.standard_normal((nblocks, K.THREADS)).astype(np.float32)
    pushed = np.full((nblocks, K.THREADS), K.POISON, np.uint32)
    pulled = pushed.copy()
    pushed_f = np.full((nblocks, K.THREADS), np.nan, np.float32)
    pulled_f = pushed_f.copy()
    with_cluster(cuda.jit(K.k_dsmem), ONE)[grid, K.THREADS](vals, pushed, pulled, pushed_f, pulled_f)
    want = (np.arange(nblocks)[:, None] * 1000 + np.arange(K.THREADS)).astype(np.uint32)
    np.testing.assert_array_equal(pushed, want)
    np.testing.assert_array_equal(pulled, want)
    np.testing.assert_array_equal(pushed_f, vals)
    np.testing.assert_array_equal(pulled_f, vals)


def test_remote_arrive_on_the_ctas_own_barrier():
    grid, nblocks = (2, 1, 1), 2
    payload = RNG.integers(0, 2**32, nblocks, dtype=np.uint32)
    got = np.full((nblocks, K.SLOTS), K.POISON, np.uint32)
    with_cluster(cuda.jit(K.k_remote_arrive), ONE)[grid, 8](1, payload, got)
    np.testing.assert_array_equal(got[:, 0], payload)
    assert (got[:, 1:] == K.POISON).all()


def test_big_dynamic_shared_memory():
    pushed = np.full((2, K.DYN_PROBE), K.POISON, np.uint32)
    with_cluster(cuda.jit(K.k_big_dynamic), ONE)[2, 32, 0, K.DYN_WORDS * 4](pushed)
    want = (np.arange(2)[:, None] * 1000 + np.arange(K.DYN_PROBE)).astype(np.uint32)
    np.testing.assert_array_equal(pushed, want)


@cuda.jit
def split_barrier(out, relaxed):
    """Thread 0 writes after arriving; the others read after waiting (the write is before the wait)."""
    box = cuda.shared.array(1, np.int32)
    t = cuda.threadIdx.x
    if t == 0:
        box[0] = 41
    if relaxed:
        barrier_cluster_arrive_relaxed()
    else:
        barrier_cluster_arrive()
    if t == 0:
        fence_acq_rel_cluster()
    barrier_cluster_wait()
    out[t] = box[0] + 1


@pytest.mark.parametrize("relaxed", [False, True])
def test_split_cluster_barrier_is_a_block_barrier(relaxed):
    out = np.zeros(8, np.int32)
    split_barrier[1, 8](out, relaxed)
    assert (out == 42).all()


# -- refused -----------------------------------------------------------------------------------------------------
def test_clusters_of_more_than_one_cta_are_not_simulated():
    kernel = cuda.jit(K.k_ids)
    with pytest.raises(NotImplementedError, match=r"clusters of \(2, 1, 1\) CTAs cannot run in Numba's CUDA "
                                                  r"simulator.*one after another"):
        with_cluster(kernel, (2, 1, 1))[(4, 1, 1), 4](np.zeros((4, K.NIDS), np.uint32))
    with pytest.raises(NotImplementedError, match="one after another"):
        cluster_kernel((1, 2))(kernel)[(2, 2), 4](np.zeros((4, K.NIDS), np.uint32))


def test_argument_errors_as_on_the_gpu():
    kernel = cuda.jit(K.k_ids)
    with pytest.raises(ValueError, match=r"grid \(3, 1, 1\)"):
        with_cluster(kernel, 2)[3, 4]
    with pytest.raises(ValueError, match="portable maximum is 8"):
        with_cluster(kernel, (3, 3))


@cuda.jit
def mapa_rank(out, rank):
    buf = cuda.shared.array(4, np.uint32)
    out[0] = mapa_shared(buf, rank)


def test_mapa_to_another_rank_raises():
    with pytest.raises(SimulatedMisuse, match=r"mapa_shared: rank 1 is not a CTA of this cluster, which has 1 CTA"):
        mapa_rank[1, 1](np.zeros(1, np.int64), 1)
    out = np.zeros(1, np.int64)
    mapa_rank[1, 1](out, 0)
    assert out[0] != 0


@cuda.jit
def outside_the_array(out):
    buf = cuda.shared.array(4, np.uint32)
    st_cluster_u32(mapa_shared(buf, 0) + 16, 1)


@cuda.jit
def not_a_barrier(out):
    buf = cuda.shared.array(4, np.uint32)
    mbarrier_arrive_cluster(mapa_shared(buf, 0))


@cuda.jit
def not_a_barrier_cta(out):
    buf = cuda.shared.array(4, np.uint32)
    mbarrier_arrive_cluster_cta(mapa_shared(buf, 0))


@cuda.jit
def wait_without_arrive(out):
    barrier_cluster_wait()


@cuda.jit
def arrive_twice(out):
    barrier_cluster_arrive()
    barrier_cluster_arrive()


@pytest.mark.parametrize("kernel, message", [
    (outside_the_array, "st_cluster_u32: address .* is not inside a shared array translated with mapa_shared"),
    (not_a_barrier, "mbarrier_arrive_cluster: address .* is not an mbarrier translated with mapa_barrier"),
    (not_a_barrier_cta, "mbarrier_arrive_cluster_cta: address .* is not an mbarrier translated with mapa_barrier"),
    (wait_without_arrive, "barrier_cluster_wait: this thread has not arrived"),
    (arrive_twice, "barrier_cluster_arrive: this thread already arrived"),
])
def test_misuse_is_named(kernel, message):
    with pytest.raises(SimulatedMisuse, match=message):
        kernel[1, 2](np.zeros(1, np.int32))


@cuda.jit
def remote_arrive_never_completes(out):
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        numbatma.intrinsics.mbarrier_init(bar, 2)
        numbatma.intrinsics.fence_mbarrier_init()
    cluster_sync()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_cluster(mapa_barrier(bar, cluster_ctarank()))
    numbatma.intrinsics.mbarrier_wait_parity(bar, 0)
    out[0] = ld_cluster_u32(mapa_shared(cuda.shared.array(1, np.uint32), 0))


def test_missing_remote_arrival_is_a_hang():
    with pytest.raises(SimulatedHang, match="waits for 2 arrivals"):
        remote_arrive_never_completes[1, 2](np.zeros(1, np.uint32))


@cuda.jit
def remote_arrive_cta_scope(out):
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        numbatma.intrinsics.mbarrier_init(bar, 2)
        numbatma.intrinsics.fence_mbarrier_init()
    cluster_sync()
    mbarrier_arrive_cluster_cta(mapa_barrier(bar, cluster_ctarank()))  # (both threads: the phase completes)
    numbatma.intrinsics.mbarrier_wait_parity(bar, 0)
    out[cuda.threadIdx.x] = 1


def test_remote_arrive_at_cta_scope_completes_the_phase():
    """``mbarrier_arrive_cluster_cta`` counts as an arrival on the barrier it names, as ``mbarrier_arrive_cluster``
    does (only the memory ordering differs on the GPU): two arrivals complete the phase both threads wait on."""
    out = np.zeros(2, np.uint32)
    remote_arrive_cta_scope[1, 2](out)
    assert out.tolist() == [1, 1]
