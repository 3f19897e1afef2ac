"""GPU (marker ``gpu``): mma.sync / ldmatrix / stmatrix / bfloat16-float16 packing (numbatma.intrinsics.mma) on the
hardware, against NumPy in float64 on fresh random data with poisoned outputs. The kernels are those of
tests/mma_kernels.py (the simulator runs the same ones: tests/sim/test_sim_mma.py):

* m16n8k16 with fragments built from global memory through ``mma_a_row_col`` / ``mma_b_row_col`` /
  ``mma_c_row_col`` (float32 accumulators, bf16 and f16; float16 accumulators) - the fragment tables of the PTX
  ISA as the tensor cores read them;
* a two-warp 32 x 8 x K tile fed by ``ldmatrix`` (A x4; B x2 from (N, K), x2 .trans or two x1 .trans from (K, N));
* ldmatrix -> stmatrix round trips at shuffled row addresses for every count and transpose (fragments checked
  word for word against the PTX description, the stored tile byte for byte);
* ``pack_*`` rounding to nearest even on ties, subnormals, overflow; ``unpack_*`` bit-exact.

Tolerance of the products: 2 K / 16 + 2 units of the accumulator's precision on the sum of magnitudes
(``mma_kernels.check_product``), far below what a misplaced element gives. An H100 passed all of them (2026-11-25);
NaN inputs of ``pack_*`` gave the canonical 0x7FFF there, which the simulator reproduces."""
import numpy as np
import pytest

import mma_kernels as K

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng()


@pytest.mark.parametrize("kind", K.KINDS)
def test_mma_from_fragments(kind):
    K.run_fragment_mma(RNG, kind, warps=4)


def test_mma_f16_accumulators():
    K.run_fragment_f16acc(RNG, warps=4)


def test_small_integers_are_exact():
    """Products and sums of small integers are exact in every format: D must equal A @ B + C to the bit."""
    for kind in K.KINDS:
        a = K.to_bits(RNG.integers(-4, 5, (16, 16)), kind)
        b = K.to_bits(RNG.integers(-4, 5, (1, 16, 8)), kind)
        c = RNG.integers(-8, 9, (16, 8)).astype(np.float32)
        d = np.full((16, 8), np.nan, np.float32)
        K.fragment_mma_kernel(kind)[1, 32](a, b, c, d)
        np.testing.assert_array_equal(d, K.from_bits(a, kind) @ K.from_bits(b[0], kind) + c)


@pytest.mark.parametrize("kind", K.KINDS)
@pytest.mark.parametrize("b_layout", K.B_LAYOUTS)
@pytest.mark.parametrize("k", [16, 64, 256])
def test_ldmatrix_fed_gemm_tile(kind, b_layout, k):
    K.run_gemm(RNG, kind, b_layout, k)


@pytest.mark.parametrize("count", K.COUNTS)
@pytest.mark.parametrize("ld_trans, st_trans", [(False, False), (False, True), (True, False), (True, True)])
def test_ldmatrix_stmatrix_round_trip(count, ld_trans, st_trans):
    for _ in range(3):  # fresh shuffles
        K.run_roundtrip(RNG, count, ld_trans, st_trans)


@pytest.mark.parametrize("kind", K.KINDS)
def test_pack_unpack(kind):
    K.run_pack(RNG, kind)


def test_large_values_accumulate_in_float32():
    """Inputs of magnitude 2^20: a float32 accumulator keeps them (a float16 one would overflow)."""
    a = K.random_bits(RNG, (32, 64), "bf16", scale=2.0 ** 20)
    b = K.random_bits(RNG, (64, 8), "bf16")
    c = np.zeros((32, 8), np.float32)
    d = np.full((32, 8), np.nan, np.float32)
    K.gemm_kernel("bf16", "kn", 64)[1, 64](a, b, c, d)
    K.check_product(d, K.from_bits(a, "bf16"), K.from_bits(b, "bf16"), c.astype(np.float64), 64)
    assert np.abs(d).max() > 2.0 ** 20
