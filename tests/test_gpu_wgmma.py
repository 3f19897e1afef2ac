"""GPU (marker ``gpu``): wgmma (numbatma.intrinsics.wgmma) on an sm_90a GPU against NumPy in float64, on fresh random
data with poisoned / sentinel-filled outputs. The kernels are those of tests/wgmma_kernels.py (the simulator runs
the same ones: tests/sim/test_sim_wgmma.py): one or two warpgroups computing 64 x N tiles for N = 8 .. 256, every
operand kind (bf16, f16, tf32 from FLOAT32 and TFLOAT32 maps, e4m3, e5m2, mixed float8 pairs), float32 and float16
accumulators, A from shared memory (every swizzle) and from registers, B K-major (every swizzle) and MN-major (every
swizzle; N not a multiple of the box width), scale_d = 0 over a NaN accumulator, alpha, bias from global and shared
memory, the epilogue through ``wgmma_store`` (stmatrix / st.shared into swizzled tiles, boxes side by side) and
TMA stores, ``wgmma_store_global`` into strided views with the tile partly outside, and ``P @ V`` chained through
``wgmma_a_fragments``.

Tolerance (``wgmma_kernels.bound``): ``ksteps + 2`` units of the accumulator's precision on the sum of magnitudes
(2^-22 for float32 accumulators, 2^-11 for float16 ones; float8 data are drawn so that every partial sum is
exact, as Hopper's float8 accumulation keeps fewer bits than float32), plus the output's rounding - far below
what a misplaced element or a lost k-step gives. An H100 passed all of them (68 tests, 22 s with 8 workers)."""
import numpy as np
import pytest
from numba import cuda

import numbatma

import wgmma_kernels as K

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng()


@pytest.mark.parametrize("case", K.GPU_CASES, ids=[c.name for c in K.GPU_CASES])
def test_wgmma_tile(case):
    K.run_case(RNG, case)


@pytest.mark.parametrize("row_origin, col_origin", [(0, 0), (-63, 0), (5, -100), (1000, 0), (-2, 3)])
def test_store_global_edges(row_origin, col_origin):
    """Tile origins past every edge of the view: only the elements inside are written."""
    K.run_case(RNG, K.make(n=128, k_steps=2, out="global"), row_origin, col_origin)


@pytest.mark.parametrize("out_dtype", ["bf16", "float16", "float32"])
@pytest.mark.parametrize("row_origin, col_origin", [(0, 0), (3, 4), (5, 1)])
def test_store_global_tile_inside(row_origin, col_origin, out_dtype):
    """The tile wholly inside a larger view: straight-line stores of column pairs where the pairs are 2-element
    aligned (even column origins), element by element where they are not (odd) - the same result either way."""
    K.run_case(RNG, K.make(n=128, k_steps=2, out="global", out_dtype=out_dtype), row_origin, col_origin, around=True)


def test_small_integers_are_exact():
    """Products and sums of small integers are exact in every format: the results must be exact too."""
    case = K.make(n=64, a="bf16", out="rowcol", k_steps=4)
    m, k = 64, case.k
    a = K.to_bits(RNG.integers(-4, 5, (m, k)), "bf16")
    b = K.to_bits(RNG.integers(-4, 5, (case.n, k)), "bf16")
    out = cuda.to_device(np.full((m, case.n), np.nan, np.float32))
    a_map = K.tensormap(cuda.to_device(a), "bf16", (64, 64), 128)
    b_dev = cuda.to_device(b)
    b_map = K.tensormap(b_dev, "bf16", (case.n, 64), 128)
    f1 = cuda.to_device(np.zeros(256, np.float32))
    K.gemm_kernel(case)[1, 128](a_map, cuda.to_device(a), b_map, b_map, out, b_map, f1, f1, np.float32(1), 0, 0, 0,
                                cuda.to_device(np.zeros((m, case.n), np.float32)))
    np.testing.assert_array_equal(out.copy_to_host(), K.from_bits(a, "bf16") @ K.from_bits(b, "bf16").T)


def test_torch_float8_tensor():
    """A torch float8 tensor: the TensorMap takes it (element implied) when DLPack names its type, or says to
    pass its bytes as uint8 with element=...; either way the bytes viewed as uint8 work."""
    torch = pytest.importorskip("torch")
    x = torch.zeros((64, 64), dtype=torch.float8_e4m3fn, device="cuda")
    try:
        tm = numbatma.TensorMap(x, (64, 64), swizzle=64)
    except numbatma.TensorMapError as exc:
        assert "uint8" in str(exc) and "element=" in str(exc), str(exc)
    else:
        assert tm.element == "e4m3" and tm.tma_dtype == "UINT8"
    tm = numbatma.TensorMap(x.view(torch.uint8), (64, 64), swizzle=64, element="e4m3")
    assert tm.numba_type.element == "e4m3"
