"""Under NUMBA_ENABLE_CUDASIM=1: the function forms reuse their cached plans (``Plan.rebind``) and still compute
the right thing on every call. Each call gets new arrays of the same layout (and, so that the cache is hit, the
same address modulo 1024) with its output poisoned first: a plan still pointing at an earlier call's arrays
would leave NaN behind (or write the earlier output)."""
import numpy as np
import pytest

from numbatma.kernels import _launch, axpy, clear_plan_cache, plan_cache_info, softmax, stream_copy

RNG = np.random.default_rng()
KEEP = []  # (every array of a test stays alive: the next call's arrays get other addresses)


@pytest.fixture(autouse=True)
def two_sms_and_an_empty_cache(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 2)
    clear_plan_cache()
    yield
    clear_plan_cache()
    KEEP.clear()


def aligned(shape, dtype=np.float32, fill=None, cols=None):
    """A new array of ``shape`` starting on a 1024-byte boundary (``cols``: rows padded to that many columns),
    random data or ``fill``."""
    dtype = np.dtype(dtype)
    full = shape[:-1] + (cols or shape[-1],)
    nbytes = int(np.prod(full)) * dtype.itemsize
    buf = np.empty(nbytes + 1024, np.uint8)
    start = (-buf.ctypes.data) % 1024
    a = buf[start:start + nbytes].view(dtype).reshape(full)[..., :shape[-1]]
    a[...] = RNG.standard_normal(a.shape) if fill is None else fill
    KEEP.append(buf)
    return a


def hits_and_misses():
    info = plan_cache_info()
    return info["hits"], info["misses"]


@pytest.mark.parametrize("shape", [(40, 68), (3, 16, 40)])
def test_stream_copy_three_times_then_a_new_layout(shape):
    for i in range(3):
        x = aligned(shape)
        y = aligned(shape, fill=np.nan)
        assert stream_copy(x, y, stages=2, tile_bytes=1024) is y
        np.testing.assert_array_equal(y, x)
    assert hits_and_misses() == (2, 1)
    other = shape[:-1] + (shape[-1] + 4,)
    x, y = aligned(other), aligned(other, fill=np.nan)
    assert stream_copy(x, y, stages=2, tile_bytes=1024) is y
    np.testing.assert_array_equal(y, x)
    assert hits_and_misses() == (2, 2)


def test_axpy_three_times_then_a_new_layout():
    for i in range(3):
        x, y = aligned((24, 64)), aligned((24, 64))
        out = aligned((24, 64), fill=np.nan)
        assert axpy(1.5, x, y, out, stages=2, tile_bytes=2048) is out
        np.testing.assert_allclose(out, np.float32(1.5) * x + y, rtol=1e-6, atol=1e-6)
    assert hits_and_misses() == (2, 1)
    x, y = aligned((16, 64)), aligned((16, 64))
    out = aligned((16, 64), fill=np.nan)
    axpy(1.5, x, y, out, stages=2, tile_bytes=2048)
    np.testing.assert_allclose(out, np.float32(1.5) * x + y, rtol=1e-6, atol=1e-6)
    assert hits_and_misses() == (2, 2)


def _softmax_ref(x):
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_softmax_with_a_tail_three_times_then_a_new_layout():
    # rows of 203 float32 padded to 208: the last 3 columns are the ExactStore tail (a view rebind re-makes)
    for i in range(3):
        x = aligned((8, 203), cols=208)
        out = aligned((8, 203), fill=np.nan, cols=208)
        assert softmax(x, out) is out
        np.testing.assert_allclose(out, _softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert hits_and_misses() == (2, 1)
    x, out = aligned((8, 200)), aligned((8, 200), fill=np.nan)
    softmax(x, out)
    np.testing.assert_allclose(out, _softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert hits_and_misses() == (2, 2)
