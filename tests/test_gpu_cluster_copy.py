"""GPU tests (marker ``gpu``, compute capability 9.0+) of the cluster-wide copies: TMA multicast delivers the
same box to every CTA named in the mask (clusters of 2 and 4; a leader or every CTA a slice; a partial
mask; an issuer outside its mask), the mask helpers match the cluster geometry, STAS moves values of every
form into a neighbour's shared memory completing on the neighbour's barrier, and red.async applies every
legal reduction into other CTAs' counters. Fresh random data; outputs poisoned first; NumPy references.

The kernels and references are in tests/cluster_copy_kernels.py, shared with tests/test_cluster_copy_cpu.py
(which compiles every kernel offline: ``kernel_signatures``) and tests/sim/test_sim_cluster_copy.py (which runs
them in clusters of one CTA)."""
import numpy as np
import pytest
from numba import cuda

from numbatma import TensorMap

import cluster_copy_kernels as K

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()

R, C = K.R, K.C
_launch = K.launch


# -- TMA multicast: one CTA issues, the CTAs named in the mask receive --------------------------------------------
_leader = cuda.jit(K.multicast_leader)
_slices = {n: cuda.jit(K.make_multicast_slices(n)) for n in (2, 4)}


def _poisoned_tiles(nblocks):
    return cuda.to_device(np.full((nblocks, R, C), np.nan, np.float32))


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("clusters", [1, 3])
def test_multicast_from_rank0_reaches_every_cta(n, clusters):
    src = rng.standard_normal((clusters * R, C)).astype(np.float32)
    d_src = cuda.to_device(src)
    out = _poisoned_tiles(clusters * n)
    _launch(_leader, (n, 1, 1), clusters * n, K.THREADS, TensorMap(d_src, (R, C)), out, 0, 0)
    got = out.copy_to_host()
    for b in range(clusters * n):
        np.testing.assert_array_equal(got[b], src[(b // n) * R:(b // n + 1) * R], err_msg=f"block {b}")


@pytest.mark.parametrize("n,issuer,mask", [
    (4, 0, 0b0101),   # a partial mask including the issuer
    (4, 1, 0b1100),   # the issuer outside its own mask
    (4, 3, 0b0001),   # a single remote receiver
    (2, 1, 0b0011),   # the last rank issues to all
])
def test_multicast_partial_masks(n, issuer, mask):
    clusters = 2
    src = rng.standard_normal((clusters * R, C)).astype(np.float32)
    d_src = cuda.to_device(src)
    out = _poisoned_tiles(clusters * n)
    _launch(_leader, (n, 1, 1), clusters * n, K.THREADS, TensorMap(d_src, (R, C)), out, issuer, mask)
    got = out.copy_to_host()
    for b in range(clusters * n):
        if mask >> (b % n) & 1:
            np.testing.assert_array_equal(got[b], src[(b // n) * R:(b // n + 1) * R], err_msg=f"block {b}")
        else:
            assert np.isnan(got[b]).all(), f"block {b} is outside the mask but its output was written"


@pytest.mark.parametrize("n", [2, 4])
def test_multicast_slices_from_every_cta(n):
    clusters = 3
    src = rng.standard_normal((clusters * R, C)).astype(np.float32)
    d_src = cuda.to_device(src)
    out = _poisoned_tiles(clusters * n)
    _launch(_slices[n], (n, 1, 1), clusters * n, K.THREADS, TensorMap(d_src, (R // n, C)), out)
    got = out.copy_to_host()
    for b in range(clusters * n):
        np.testing.assert_array_equal(got[b], src[(b // n) * R:(b // n + 1) * R], err_msg=f"block {b}")


# -- mask helpers vs the cluster geometry -----------------------------------------------------------------------
_geometry = cuda.jit(K.mask_geometry)


@pytest.mark.parametrize("cluster", [(2, 1, 1), (4, 1, 1), (8, 1, 1), (2, 2, 1), (1, 2, 1), (2, 2, 2), (1, 4, 2)])
def test_mask_helpers_match_the_cluster_shape(cluster):
    nx, ny, nz = cluster
    grid = (2 * nx, 3 * ny, 1 * nz)
    nblocks = int(np.prod(grid))
    out = cuda.to_device(np.full((nblocks, 7), 0xDEADBEEF, np.uint32))
    _launch(_geometry, cluster, grid, 32, out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got, K.expected_mask_geometry(grid, cluster))


# -- st.async: every CTA stores into its right neighbour ------------------------------------------------------
_stas = {form: cuda.jit(K.make_stas_ring(*form)) for form in K.STAS_FORMS}


@pytest.mark.parametrize("dtype,vec", K.STAS_FORMS)
@pytest.mark.parametrize("n", [2, 4])
def test_st_async_ring(dtype, vec, n):
    clusters = 2
    nblocks = clusters * n
    n_el = K.STAS_THREADS * vec
    src = K.random_values(rng, nblocks * n_el, dtype)
    out = cuda.to_device(K.poison(nblocks * n_el, dtype))
    _launch(_stas[(dtype, vec)], (n, 1, 1), nblocks, K.STAS_THREADS, cuda.to_device(src), out)
    got = out.copy_to_host().reshape(nblocks, n_el)
    blocks = src.reshape(nblocks, n_el)
    for b in range(nblocks):
        left = b - b % n + (b % n - 1) % n  # the CTA whose right neighbour is b
        np.testing.assert_array_equal(got[b].view(np.uint8), blocks[left].view(np.uint8), err_msg=f"block {b}")


_all_to_all = cuda.jit(K.all_to_all)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_st_async_from_every_cta_completes_one_barrier(n):
    clusters = 2
    nblocks = clusters * n
    src = K.random_values(rng, nblocks, np.int32)
    out = cuda.to_device(np.full((nblocks, K.SLOTS), 12345, np.int32))
    _launch(_all_to_all, (n, 1, 1), nblocks, 32, cuda.to_device(src), out)
    got = out.copy_to_host()
    for b in range(nblocks):
        base, r = b - b % n, b % n
        want = np.full(K.SLOTS, -1, np.int32)
        want[:n] = src[base:base + n]
        want[r] = -1
        np.testing.assert_array_equal(got[b], want, err_msg=f"block {b}")


# -- red.async: every CTA reduces into every other CTA's counters ------------------------------------------------
_red = {case: cuda.jit(K.make_red(*case)) for case in K.RED_CASES}


@pytest.mark.parametrize("op,dtype", K.RED_CASES)
@pytest.mark.parametrize("n", [2, 4])
def test_red_async_into_other_ctas(op, dtype, n):
    clusters = 2
    nblocks = clusters * n
    if op in ("inc", "dec"):
        init = rng.integers(0, 2 * K.INC_DEC_BOUND, size=(nblocks, K.COUNTERS)).astype(dtype)  # some above the bound
        vals = np.full((nblocks, K.RED_THREADS), K.INC_DEC_BOUND, dtype)
    else:
        init = K.random_values(rng, (nblocks, K.COUNTERS), dtype)
        vals = K.random_values(rng, (nblocks, K.RED_THREADS), dtype)
    out = cuda.to_device(K.poison((nblocks, K.COUNTERS), dtype))
    _launch(_red[(op, dtype)], (n, 1, 1), nblocks, K.RED_THREADS, cuda.to_device(init), cuda.to_device(vals), out)
    got = out.copy_to_host()
    for b in range(nblocks):
        base = b - b % n
        others = np.concatenate([vals[base + s] for s in range(n) if s != b % n])
        want = K.red_reference(op, np.dtype(dtype), init[b], others)
        np.testing.assert_array_equal(got[b], want, err_msg=f"{op}.{dtype}, block {b}")
