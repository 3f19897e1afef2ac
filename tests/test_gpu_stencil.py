"""GPU tests (marker ``gpu``): the 5-point Laplacian against NumPy (zero padding) on fresh random data, with
poisoned (NaN) outputs, awkward shapes, every tunable, padded views, streams, CuPy / PyTorch inputs."""
import numpy as np
import pytest
from numba import cuda

from numbatma import TensorMapError
from numbatma.kernels import Laplacian5, laplacian5

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()

SHAPES = [(1, 4), (2, 8), (37, 68), (33, 132), (1000, 1004), (4096, 4096)]


def reference(a):
    p = np.pad(a, 1)
    return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - a.dtype.type(4) * p[1:-1, 1:-1]


def check(got, a):
    want = reference(a)
    assert got.shape == want.shape
    assert not np.isnan(got).any(), f"{np.isnan(got).sum()} output elements were never written"
    tol = 1e-5 if a.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def run(a, **options):
    src = cuda.to_device(a)
    dst = cuda.to_device(np.full(a.shape, np.nan, a.dtype))
    out = laplacian5(src, dst, **options)
    assert out is dst
    cuda.synchronize()
    return dst.copy_to_host()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_numpy(shape, dtype):
    if dtype == np.float64 and shape[1] % 2:
        pytest.skip("float64 rows need an even column count")
    a = rng.standard_normal(shape).astype(dtype)
    check(run(a), a)


def test_float64_odd_multiple_of_16_bytes():
    a = rng.standard_normal((45, 130)).astype(np.float64)  # 130 * 8 bytes per row: a multiple of 16
    check(run(a), a)


@pytest.mark.parametrize(
    "options",
    [
        dict(tile=(8, 32), stages=2, consumer_warps=1, ctas_per_sm=4),
        dict(tile=(7, 16), stages=1, consumer_warps=1),
        dict(tile=(16, 248), stages=3, consumer_warps=8, ctas_per_sm=1),
        dict(tile=(64, 128), stages=3, consumer_warps=8, ctas_per_sm=1),
        dict(tile=(32, 128), stages=8, consumer_warps=4, ctas_per_sm=1),
        dict(tile=(20, 96), stages=5, consumer_warps=2),
        dict(tile=(1, 4), stages=2, consumer_warps=1),
        dict(walk="strips"),
        dict(tile=(8, 32), stages=2, walk="strips", ctas_per_sm=4),
        dict(l2_promotion=0),
    ],
)
def test_tunables(options):
    a = rng.standard_normal((1000, 1004)).astype(np.float32)
    check(run(a, **options), a)


def test_plan_relaunch_sees_new_data_and_streams():
    a = rng.standard_normal((515, 516)).astype(np.float32)
    src = cuda.to_device(a)
    dst = cuda.to_device(np.full(a.shape, np.nan, a.dtype))
    plan = Laplacian5(src, dst)
    stream = cuda.stream()
    plan.launch(stream)
    stream.synchronize()
    check(dst.copy_to_host(), a)
    b = rng.standard_normal(a.shape).astype(np.float32)
    src.copy_to_device(b)
    dst.copy_to_device(np.full(a.shape, np.nan, a.dtype))
    plan.launch()
    cuda.synchronize()
    check(dst.copy_to_host(), b)


def test_padded_views_with_odd_width():
    # 67 columns in rows of 72: the stencil sees a (37, 67) array. Columns 67..71 must stay untouched (a TMA
    # store reaching the row end would write column 67: the kernel stores the last column with ordinary stores).
    a = rng.standard_normal((37, 67)).astype(np.float32)
    src_pad = np.full((37, 72), 1e30, np.float32)  # neighbours past column 66 must read as 0, not as 1e30
    src_pad[:, :67] = a
    dst_pad = np.full((37, 72), np.nan, np.float32)
    dst_pad[:, 67:] = 7.0
    d_src, d_dst = cuda.to_device(src_pad), cuda.to_device(dst_pad)
    laplacian5(d_src[:, :67], d_dst[:, :67])
    cuda.synchronize()
    got = d_dst.copy_to_host()
    check(got[:, :67], a)
    assert (got[:, 67:] == 7.0).all(), "the kernel wrote past the view's last column"


def test_strided_rows_view_of_a_bigger_array():
    big = rng.standard_normal((300, 512)).astype(np.float32)
    d_big = cuda.to_device(big)
    d_out = cuda.to_device(np.full((100, 200), np.nan, np.float32))
    laplacian5(d_big[100:200, 128:328], d_out)  # row stride 2048 bytes, start 16-byte aligned
    cuda.synchronize()
    check(d_out.copy_to_host(), big[100:200, 128:328])


@pytest.mark.parametrize("shape", [(37, 67), (8, 6)])
def test_width_not_a_multiple_of_16_bytes_is_a_clear_error(shape):
    with pytest.raises(TensorMapError, match="row stride|16-byte units"):
        laplacian5(cuda.device_array(shape, np.float32), cuda.device_array(shape, np.float32))


def test_a_single_row_of_any_width():
    # one row of 5 float32 (20 bytes): TMA stores the first 4 elements, an ordinary store the fifth
    a = rng.standard_normal((1, 5)).astype(np.float32)
    check(run(a), a)


def test_in_place_is_an_error():
    d = cuda.device_array((16, 16), np.float32)
    with pytest.raises(TensorMapError, match="overlap"):
        laplacian5(d, d)


def test_cupy_arrays():
    cp = pytest.importorskip("cupy")
    a = rng.standard_normal((257, 260)).astype(np.float32)
    src = cp.asarray(a)
    dst = cp.full(a.shape, cp.nan, dtype=cp.float32)
    laplacian5(src, dst)
    cp.cuda.runtime.deviceSynchronize()
    check(cp.asnumpy(dst), a)


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((129, 516)).astype(np.float64)
    src = torch.from_numpy(a).cuda()
    dst = torch.full(a.shape, float("nan"), dtype=torch.float64, device="cuda")
    laplacian5(src, dst)
    torch.cuda.synchronize()
    check(dst.cpu().numpy(), a)


def test_bandwidth_report():
    """Not a pass/fail speed test: prints TB/s (one read + one write per element) for the lead to tune."""
    n = 8192
    a = rng.standard_normal((n, n)).astype(np.float32)
    src = cuda.to_device(a)
    dst = cuda.device_array_like(src)
    plan = Laplacian5(src, dst)
    plan.launch()
    cuda.synchronize()
    start, stop = cuda.event(), cuda.event()
    reps = 20
    rates = []
    for _ in range(3):
        start.record()
        for _ in range(reps):  # back to back, so the launch cost on the host is hidden after the first
            plan.launch()
        stop.record()
        stop.synchronize()
        t = cuda.event_elapsed_time(start, stop) * 1e-3 / reps
        rates.append(2 * a.nbytes / t / 1e12)
    print(f"\n{plan}: {max(rates):.2f} TB/s (best of 3 x {reps} launches)")
    check(dst.copy_to_host(), a)
    assert max(rates) > 0
