"""GPU tests (marker ``gpu``): bulk (non-tensor) copies, bulk reductions, the L2 prefetch and the
block-cooperative memcpy_async against NumPy on fresh random data. Outputs are poisoned before every
launch, so an element nobody wrote fails the comparison.

The kernels, runners and references are in tests/bulk_kernels.py, shared with tests/test_bulk_cpu.py (which
compiles every kernel for sm_90a offline) and tests/sim/test_sim_bulk.py (which runs them in the simulator)."""
import numpy as np
import pytest
from numba import cuda

from numbatma.cluster import with_cluster

import bulk_kernels as K

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()


# -- global -> shared -> global, run-time sizes and offsets ---------------------------------------------
@pytest.mark.parametrize("nbytes", K.ROUND_TRIP_SIZES)
@pytest.mark.parametrize("prefetch", [False, True])
def test_round_trip_odd_sizes(nbytes, prefetch):
    got, want = K.run_round_trip(rng, nbytes, prefetch)
    np.testing.assert_array_equal(got, want)


# -- the whole-array forms on a 2-D float64 tile (its static shape gives the byte count) -----------------
def test_whole_array_forms():
    dst, out, src = K.run_tile_round_trip(rng, K.ROWS, K.COLS, "float64")
    want = src.copy()
    want[:, 0] *= -1
    np.testing.assert_array_equal(dst, want)
    np.testing.assert_array_equal(out, src.reshape(-1))


# -- reductions: every operation and element type, one block and many blocks -----------------------------
@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("op, dtype", K.REDUCE_CASES)
def test_reduce_one_block(op, dtype, indexed):
    got, want = K.run_reduce(rng, op, dtype, indexed, 1)
    u = f"u{want.itemsize}"
    np.testing.assert_array_equal(got.view(u), want.view(u))


@pytest.mark.parametrize("op, dtype", K.MANY_BLOCK_CASES)
def test_reduce_many_blocks_is_atomic(op, dtype):
    """96 blocks reduce into the same 40 elements: every contribution lands (element-wise atomic)."""
    got, want = K.run_reduce(rng, op, dtype, False, 96)
    np.testing.assert_array_equal(got, want)


def test_reduce_float_add_many_blocks():
    """float64 add of small integers from 64 blocks: exact whatever the order."""
    got, want = K.run_float_add(rng, 64)
    np.testing.assert_array_equal(got, want)


# -- shared -> shared::cluster: within one CTA (own addresses) ---------------------------------------------
@pytest.mark.parametrize("nbytes", K.CLUSTER_SELF_SIZES)
def test_cluster_copy_within_the_cta(nbytes):
    # (an explicit cluster launch, even of one CTA: with a plain launch the copy faults on an H200,
    # scripts/probe_bulk_cluster_self.py)
    got, src = K.run_cluster_copy_self(rng, nbytes)
    np.testing.assert_array_equal(got[:nbytes // 4], src[:nbytes // 4])
    np.testing.assert_array_equal(got[nbytes // 4:], -1)


def test_cluster_copy_between_ctas():
    blocks = 4
    src = rng.integers(-(2**31), 2**31 - 1, blocks * 256, dtype=np.int32)
    out = cuda.to_device(np.full(blocks * 256, 12345, np.int32))
    with_cluster(K.cluster_exchange_kernel, (2, 1, 1))[blocks, 256](cuda.to_device(src), out)
    want = src.reshape(blocks // 2, 2, 256)[:, ::-1].reshape(-1)
    np.testing.assert_array_equal(out.copy_to_host(), want)


# -- block-cooperative memcpy_async ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("nbytes, block", K.MEMCPY_CASES)
def test_memcpy_async(mode, nbytes, block):
    got, src = K.run_block_copy(rng, mode, nbytes, block)
    n = nbytes // 4
    np.testing.assert_array_equal(got[0, :n], src[0].reshape(-1)[:n])
    np.testing.assert_array_equal(got[1, :n], src[1].reshape(-1)[:n])
    np.testing.assert_array_equal(got[0, n:], -1.0)
    np.testing.assert_array_equal(got[1, n:], -1.0)
