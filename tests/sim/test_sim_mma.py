"""Under NUMBA_ENABLE_CUDASIM=1: mma.sync / ldmatrix / stmatrix / pack (numbatma.intrinsics.mma) against NumPy on
fresh random data with poisoned outputs - the kernels of tests/mma_kernels.py (the GPU runs the same ones:
tests/test_gpu_mma.py): fragment-built m16n8k16 with float32 and float16 accumulators, a two-warp ldmatrix-fed
32 x 8 x K tile with B in both layouts, ldmatrix -> stmatrix round trips at shuffled row addresses for every count
and transpose, bfloat16 / float16 packing rounded to nearest even (checked against ml_dtypes); misuse is
reported."""
import numpy as np
import pytest
from numba import cuda

from numbatma.intrinsics import ldmatrix, mma_m16n8k16, pack_bf16x2, stmatrix
from numbatma.intrinsics._sim import SimulatedHang, SimulatedMisuse

import mma_kernels as K

RNG = np.random.default_rng()


@pytest.mark.parametrize("kind", K.KINDS)
def test_mma_from_fragments(kind):
    K.run_fragment_mma(RNG, kind)


def test_mma_f16_accumulators():
    K.run_fragment_f16acc(RNG)


@pytest.mark.parametrize("kind, b_layout, k", [("bf16", "nk", 64), ("bf16", "kn", 32), ("f16", "kn-x1", 48),
                                               ("f16", "nk", 16)])
def test_ldmatrix_fed_gemm_tile(kind, b_layout, k):
    K.run_gemm(RNG, kind, b_layout, k)


@pytest.mark.parametrize("count", K.COUNTS)
@pytest.mark.parametrize("ld_trans, st_trans", [(False, False), (False, True), (True, False), (True, True)])
def test_ldmatrix_stmatrix_round_trip(count, ld_trans, st_trans):
    K.run_roundtrip(RNG, count, ld_trans, st_trans)


@pytest.mark.parametrize("kind", K.KINDS)
def test_pack_unpack(kind):
    K.run_pack(RNG, kind)


@pytest.mark.parametrize("kind", K.KINDS)
def test_reference_rounding_is_ml_dtypes(kind):
    """The references' NumPy rounding (tests/mma_kernels.py) is round-to-nearest-even as ml_dtypes does it."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x, _ = K.pack_inputs(RNG, kind)
    with np.errstate(over="ignore"):
        want = x.astype(ml_dtypes.bfloat16 if kind == "bf16" else np.float16).view(np.uint16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(K.to_bits(x, kind)[finite], want[finite])


def test_the_exact_product():
    """Small integers: every product and sum is exact, so D must equal A @ B + C exactly."""
    a = K.to_bits(RNG.integers(-4, 5, (16, 16)), "bf16")
    b = K.to_bits(RNG.integers(-4, 5, (1, 16, 8)), "bf16")
    c = RNG.integers(-8, 9, (16, 8)).astype(np.float32)
    d = np.full((16, 8), np.nan, np.float32)
    K.fragment_mma_kernel("bf16")[1, 32](a, b, c, d)
    np.testing.assert_array_equal(d, K.from_bits(a, "bf16") @ K.from_bits(b[0], "bf16") + c)


# -- misuse ---------------------------------------------------------------------------------------------------------
def test_ldmatrix_from_global_memory_is_reported():
    @cuda.jit
    def kern(g, out):
        cuda.syncthreads()  # (mma_kernels.SIM_START)
        r = ldmatrix(g, (cuda.threadIdx.x % 8) * 8, 1, False)
        out[cuda.threadIdx.x] = r[0]

    with pytest.raises(SimulatedMisuse, match=r"ldmatrix: the tile must be a shared-memory array"):
        kern[1, 32](np.zeros(64, np.uint16), np.zeros(32, np.uint32))


def test_misaligned_row_is_reported():
    @cuda.jit
    def kern(out):
        t = cuda.shared.array((8, 16), np.uint16, alignment=16)
        cuda.syncthreads()  # (mma_kernels.SIM_START)
        r = ldmatrix(t, cuda.threadIdx.x % 8 * 16 + 4, 1, False)
        out[cuda.threadIdx.x] = r[0]

    with pytest.raises(SimulatedMisuse, match=r"ldmatrix: lane \d+'s row address \(element offset \d+ of the tile\) "
                                              r"is not 16-byte aligned"):
        kern[1, 32](np.zeros(32, np.uint32))


def test_row_outside_the_tile_is_reported():
    @cuda.jit
    def kern(out):
        t = cuda.shared.array((8, 8), np.uint16, alignment=16)
        cuda.syncthreads()  # (mma_kernels.SIM_START)
        stmatrix(t, (cuda.threadIdx.x % 8) * 8 + 8, (np.uint32(1),), False)

    with pytest.raises(SimulatedMisuse, match=r"stmatrix: lane 7's row \(element offset 64\) is not inside the tile "
                                              r"of 64 elements"):
        kern[1, 32](np.zeros(1))


def test_lanes_disagreeing_on_the_constants_are_reported():
    @cuda.jit
    def kern(out):
        t = cuda.shared.array((32, 8), np.uint16, alignment=16)
        lane = cuda.threadIdx.x
        cuda.syncthreads()  # (mma_kernels.SIM_START)
        if lane < 16:
            r = ldmatrix(t, lane * 8, 2, False)
        else:
            r = ldmatrix(t, lane * 8, 2, True)
        out[lane] = r[0]

    with pytest.raises(SimulatedMisuse, match=r"ldmatrix: the lanes of warp 0 disagree"):
        kern[1, 32](np.zeros(32, np.uint32))


def test_half_a_warp_hangs():
    """mma.sync is warp-collective: a warp whose lanes do not all issue it would hang (undefined on the GPU)."""

    @cuda.jit
    def kern(out):
        z = np.float32(0)
        u = np.uint32(0)
        cuda.syncthreads()  # (mma_kernels.SIM_START)
        if cuda.threadIdx.x < 16:
            d = mma_m16n8k16((z, z, z, z), (u, u, u, u), (u, u), "bf16")
            out[cuda.threadIdx.x] = d[0]

    with pytest.raises(SimulatedHang, match=r"mma_m16n8k16 at .* which all 32 threads 0\.\.31 execute together"):
        kern[1, 32](np.zeros(32, np.float32))


def test_pack_rounds_to_nearest_even():
    @cuda.jit
    def kern(out):
        out[0] = pack_bf16x2(np.float32(1.0 + 2.0 ** -8), np.float32(1.0 + 3 * 2.0 ** -8))

    out = np.zeros(1, np.uint32)
    kern[1, 1](out)
    # 1 + 2^-8 is halfway between 1.0 (0x3F80, even) and 0x3F81: -> 0x3F80; 1 + 3 * 2^-8 -> 0x3F82 (even)
    assert out[0] == 0x3F82_3F80
