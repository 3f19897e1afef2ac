"""GPU tests (marker ``gpu``): RowSum and Softmax against NumPy float64 references on fresh random data.

Outputs are poisoned (NaN) before every launch, so an element nobody wrote fails the comparison. Shapes
cover rows that are not a multiple of the rows per stage, rows that are not a multiple of the box width,
tiny (n = 4) and long rows (both modes), single rows, folded N-D arrays and padded rows.
"""
import numpy as np
import pytest

from numbatma import TensorMapError
from numba import cuda

from numbatma.kernels import RowSum, Softmax, row_sum, softmax

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()

EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}  # one ulp at 1.0 (rounding: half)


def random_rows(shape, dtype=np.float32, scale=1.0, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(dtype)


def poisoned(shape, dtype=np.float32):
    return cuda.to_device(np.full(shape, np.nan, dtype=dtype))


def ref_sum(x):
    return x.astype(np.float64).sum(-1)


def ref_softmax(x):
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def assert_sum_close(got, x, dtype="float32"):
    want = ref_sum(x)
    scale = np.abs(x.astype(np.float64)).sum(-1)
    got = got.astype(np.float64)
    assert got.shape == want.shape
    assert not np.isnan(got).any(), "some sums were never written"
    # float32 accumulation of random-signed data; then one rounding to the output type
    tol = 1e-5 * scale + 2 * EPS[dtype] * np.abs(want) + 1e-30
    bad = np.abs(got - want) > tol
    assert not bad.any(), f"{bad.sum()} sums off, worst {np.max(np.abs(got - want) - tol)} beyond tolerance"


def assert_softmax_close(got, x, dtype="float32"):
    want = ref_softmax(x)
    got = got.astype(np.float64)
    assert got.shape == want.shape
    assert not np.isnan(got).any(), "some outputs were never written (or are NaN)"
    rtol = 1e-5 if dtype == "float32" else 2 * EPS[dtype]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-7 if dtype == "float32" else 1e-5)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=0, atol=1e-4 if dtype == "float32" else 0.05)


# -- RowSum --------------------------------------------------------------------------------------------
SUM_SHAPES = [
    (1, 4),
    (1000, 4),
    (4099, 4),  # rows mode with several 256-row boxes per stage and a partial last block
    (513, 36),
    (4100, 256),
    (333, 1000),
    (1, 1000),
    (257, 16384),  # chunked
    (1, 16384),
    (37, 100000),
    (7, 3, 64),
]


@pytest.mark.parametrize("shape", SUM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_row_sum_float32(shape):
    x = random_rows(shape)
    out = poisoned(shape[:-1])
    plan = RowSum(cuda.to_device(x), out)
    plan.launch()
    assert_sum_close(out.copy_to_host(), x)


@pytest.mark.parametrize(
    "shape, options",
    [
        ((333, 1000), dict(mode="chunked")),
        ((333, 1000), dict(mode="chunked", chunk_boxes=1, stages=2)),
        ((64, 2048), dict(mode="rows")),
        ((333, 1000), dict(warps=4, stages=2, stage_bytes=8192)),
        ((1000, 64), dict(threads_per_row=8, rows_per_stage=512)),
        ((300, 4096), dict(ctas_per_sm=2)),
        ((300, 4096), dict(fastmath=True, l2_promotion=256)),
    ],
)
def test_row_sum_options(shape, options):
    x = random_rows(shape)
    out = poisoned(shape[:-1])
    RowSum(cuda.to_device(x), out, **options).launch()
    assert_sum_close(out.copy_to_host(), x)


@pytest.mark.parametrize("shape", [(1000, 8), (333, 1000), (41, 20000)], ids=lambda s: "x".join(map(str, s)))
def test_row_sum_float16(shape):
    x = random_rows(shape, np.float16)
    out = poisoned(shape[:-1], np.float16)
    row_sum(cuda.to_device(x), out)
    assert_sum_close(out.copy_to_host(), x, "float16")


def test_row_sum_reuse_and_stream():
    x = random_rows((500, 1000))
    out = poisoned((500,))
    plan = RowSum(cuda.to_device(x), out)
    stream = cuda.stream()
    for _ in range(3):
        plan.launch(stream)
    stream.synchronize()
    assert_sum_close(out.copy_to_host(), x)


def test_row_sum_out_of_leading_shape_and_rank_one():
    x = random_rows((3, 5, 1000))
    out = poisoned((3, 5))
    assert row_sum(cuda.to_device(x), out) is out
    assert_sum_close(out.copy_to_host(), x)
    v = random_rows((4001,))  # one row of any length (its stride needs no 16-byte multiple)
    out1 = poisoned((1,))
    row_sum(cuda.to_device(v), out1)
    assert_sum_close(out1.copy_to_host().reshape(()), v)


def test_softmax_of_one_odd_length_row():
    """One row of 1001 float32: a TMA store reaching its end would write 12 bytes past the array; the kernel
    stores the first 1000 elements with TMA and the last with an ordinary store."""
    x = random_rows((1, 1001))
    parent = cuda.to_device(np.full(1008, -7.0, np.float32))
    softmax(cuda.to_device(x), parent[:1001].reshape(1, 1001))
    got = parent.copy_to_host()
    assert_softmax_close(got[:1001].reshape(1, 1001), x)
    assert (got[1001:] == -7.0).all()


# -- Softmax -------------------------------------------------------------------------------------------
SOFTMAX_SHAPES = [
    (1, 4),
    (1000, 4),
    (4099, 4),
    (513, 36),
    (4100, 256),
    (333, 1000),
    (1, 1000),
    (129, 4096),
    (257, 16384),  # rows mode, one 64 KiB row per stage
    (1, 16384),
    (16, 65536),  # chunked (two passes)
    (3, 30000),
    (7, 3, 200),
]


@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_softmax_float32(shape):
    x = random_rows(shape)
    out = poisoned(shape)
    Softmax(cuda.to_device(x), out).launch()
    assert_softmax_close(out.copy_to_host(), x)


# chunked with small chunks: the running maximum of the first pass is rescaled across chunks
MODES = {"rows": dict(mode="rows"), "chunked": dict(mode="chunked", chunk_boxes=2)}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("scale, offset", [(1e4, 0.0), (10.0, 1e4), (30.0, -1e4)])
def test_softmax_large_magnitudes_are_stable(mode, scale, offset):
    x = random_rows((77, 3000), scale=scale, offset=offset)
    x[5] = np.sort(x[5])  # growing row: the maximum moves with every chunk
    out = poisoned(x.shape)
    Softmax(cuda.to_device(x), out, **MODES[mode]).launch()
    assert_softmax_close(out.copy_to_host(), x)


@pytest.mark.parametrize("mode", list(MODES))
def test_softmax_masked_rows(mode):
    x = random_rows((40, 5000))
    x[:, :3000] = -np.inf  # whole leading chunks masked
    x[3, :-1] = -np.inf  # a row with one finite element
    out = poisoned(x.shape)
    Softmax(cuda.to_device(x), out, **MODES[mode]).launch()
    assert_softmax_close(out.copy_to_host(), x)


@pytest.mark.parametrize(
    "shape, options",
    [
        ((333, 1000), dict(mode="chunked")),
        ((333, 1000), dict(mode="chunked", chunk_boxes=1, stages=2, store_lag=1)),
        ((333, 1000), dict(warps=4, stages=2, stage_bytes=8192)),
        ((333, 1000), dict(threads_per_row=128)),
        ((1000, 64), dict(threads_per_row=8, rows_per_stage=512)),
        ((300, 4096), dict(store_lag=2)),
        ((300, 4096), dict(ctas_per_sm=2)),
        ((300, 4096), dict(warps=16, threads_per_row=64)),
        ((300, 4096), dict(fastmath=True, l2_promotion=256)),
        ((20, 20000), dict(mode="rows", stages=1)),
        ((300, 4096), dict(registers=False)),  # rows mode's shared-memory loops
        ((300, 4096), dict(warps=8)),
        ((300, 16384), dict(warps=8, stages=2)),  # 64 elements per thread in registers
        ((300, 4096), dict(ctas_per_sm=2, stages=2)),
        ((100, 12), dict()),  # a group wider than the row
    ],
)
def test_softmax_options(shape, options):
    x = random_rows(shape, scale=3.0)
    out = poisoned(shape)
    Softmax(cuda.to_device(x), out, **options).launch()
    assert_softmax_close(out.copy_to_host(), x)


@pytest.mark.parametrize("shape", [(1000, 8), (333, 1000), (41, 20000), (4, 70000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_softmax_float16(shape):
    x = random_rows(shape, np.float16, scale=4.0)
    out = poisoned(shape, np.float16)
    assert softmax(cuda.to_device(x), out) is out
    assert_softmax_close(out.copy_to_host(), x, "float16")


def test_softmax_padded_rows_leave_the_padding_alone():
    rows, n, pitch = 100, 1000, 1024
    host = random_rows((rows, pitch))
    sentinel = np.float32(-7.0)
    out_host = np.full((rows, pitch), np.nan, np.float32)
    out_host[:, n:] = sentinel
    x_base, out_base = cuda.to_device(host), cuda.to_device(out_host)
    Softmax(x_base[:, :n], out_base[:, :n]).launch()
    got = out_base.copy_to_host()
    assert_softmax_close(got[:, :n], host[:, :n])
    assert (got[:, n:] == sentinel).all(), "the store wrote past the end of the rows"


def test_softmax_reuse_in_place():
    x = random_rows((256, 2048))
    d = cuda.to_device(x)
    plan = Softmax(d, d)  # in place: each stage is read completely before it is written back
    plan.launch()
    assert_softmax_close(d.copy_to_host(), x)


def test_cupy_arrays():
    cp = pytest.importorskip("cupy")
    x = random_rows((300, 1000))
    out = cp.full((300, 1000), cp.nan, dtype=cp.float32)
    softmax(cp.asarray(x), out)
    assert_softmax_close(cp.asnumpy(out), x)
    sums = cp.full((300,), cp.nan, dtype=cp.float32)
    row_sum(cp.asarray(x), sums)
    assert_sum_close(cp.asnumpy(sums), x)


def test_bfloat16_torch_tensors():
    torch = pytest.importorskip("torch")
    x = torch.randn(333, 2048, dtype=torch.bfloat16, device="cuda") * 4
    out = torch.full_like(x, float("nan"))
    softmax(x, out)
    torch.cuda.synchronize()
    xf = x.float().cpu().numpy()
    assert_softmax_close(out.float().cpu().numpy(), xf, "bfloat16")
    sums = torch.full((333,), float("nan"), dtype=torch.bfloat16, device="cuda")
    row_sum(x, sums)
    torch.cuda.synchronize()
    assert_sum_close(sums.float().cpu().numpy(), xf, "bfloat16")
