"""Under NUMBA_ENABLE_CUDASIM=1: every kernel of numbatma.kernels on small shapes (partial tiles included)
against NumPy, from host arrays and simulator device arrays."""
import numpy as np
import pytest
from numba import cuda

from numbatma.kernels import Axpy, Laplacian5, RowSum, Softmax, StreamCopy, Transpose, _launch, tma_copy

RNG = np.random.default_rng()


@pytest.fixture(autouse=True)
def two_sms(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 2)  # a persistent grid of 2: several tiles per CTA


def data(shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_tma_copy_rank3():
    x = data((3, 10, 24))
    y = np.full_like(x, np.nan)
    tma_copy(x, y, box=(2, 8, 8))
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("stages, two_roles", [(1, False), (3, False), (2, True)])
def test_stream_copy(stages, two_roles):
    x = data((40, 68))
    y = np.full_like(x, np.nan)
    assert StreamCopy(cuda.to_device(x), y, stages=stages, tile_bytes=1024, two_roles=two_roles).launch() is y
    np.testing.assert_array_equal(y, x)


def test_axpy():
    x, y = data((24, 64)), data((24, 64))
    out = np.full_like(x, np.nan)
    assert Axpy(1.5, x, y, out, stages=2, tile_bytes=2048).launch() is out
    np.testing.assert_allclose(out, np.float32(1.5) * x + y, rtol=1e-6, atol=1e-6)


def test_transpose():
    x = data((40, 72))
    y = np.full((72, 40), np.nan, np.float32)
    assert Transpose(x, y).launch() is y  # (every plan's launch returns its output)
    np.testing.assert_array_equal(y, x.T)


def test_row_sum_and_softmax():
    x = data((12, 200))
    s = np.full(12, np.nan, np.float32)
    assert RowSum(x, s).launch() is s
    np.testing.assert_allclose(s, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    out = np.full_like(x, np.nan)
    assert Softmax(x, out).launch() is out
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_laplacian():
    x = data((20, 36))
    out = np.full_like(x, np.nan)
    Laplacian5(x, out, tile=(8, 16)).launch()
    p = np.pad(x, 1)
    ref = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * x
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
