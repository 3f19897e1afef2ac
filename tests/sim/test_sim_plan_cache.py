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


def test_the_same_arrays_new_arrays_then_the_first_arrays_again():
    """The fast path (the same objects: launched as they are), a re-point (new arrays), and back: every call right,
    with the output poisoned before each."""
    first = aligned((8, 203), cols=208), aligned((8, 203), fill=np.nan, cols=208)
    second = aligned((8, 203), cols=208), aligned((8, 203), fill=np.nan, cols=208)
    for x, out in (first, first, second, first, second):
        out[...] = np.nan
        assert softmax(x, out) is out
        np.testing.assert_allclose(out, _softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert hits_and_misses() == (4, 1)


def test_attention_without_lse_is_cached_and_returns_a_new_lse_each_call():
    from attention_reference import attention_reference

    from numbatma.kernels import attention

    rng = np.random.default_rng()
    results = []  # (no lse given: the plan allocates one per call, Plan.owned_output)
    for i in range(2):  # (new arrays each call, the same alignment: a cache hit)
        q, k, v = (aligned((1, 1, 64, 64), np.float16, fill=rng.standard_normal((1, 1, 64, 64))) for _ in range(3))
        o = aligned(q.shape, np.float16, fill=np.nan)
        got_o, got_lse = attention(q, k, v, o, bn=64, stages=2)
        assert got_o is o
        ref, ref_lse = attention_reference(q, k, v, False, 1 / 8)
        np.testing.assert_allclose(o.astype(np.float64), ref, atol=2e-3 + 2.0 ** -10 * np.abs(ref).max())
        np.testing.assert_allclose(got_lse.copy_to_host(), ref_lse, rtol=1e-4, atol=1e-4)
        results.append(got_lse)
    assert results[0] is not results[1] and hits_and_misses() == (1, 1)


def test_attention_backward_is_cached_and_each_call_gets_fresh_work_arrays():
    """attention_backward's plan cached (its row kernels' plans re-pointed with it) and its work arrays (the rows'
    statistics, dq's float32 accumulator, the turn counters: Plan.owned_output) made again each call, so that two
    calls never share them: new arrays of the same layout each call, dq, dk, dv poisoned - a row kernel still
    pointing at the first call's o or dq would leave NaN or wrong gradients behind."""
    from attention_reference import attention_backward_reference, attention_reference

    from numbatma.kernels import attention_backward

    rng = np.random.default_rng()
    shape, scale = (1, 1, 40, 64), 1 / 8
    work = []
    for i in range(2):
        q, k, v, do = (aligned(shape, np.float16, fill=rng.standard_normal(shape)) for _ in range(4))
        o_ref, lse_ref = attention_reference(q, k, v, True, scale)
        o = aligned(shape, np.float16, fill=o_ref)
        lse = aligned(shape[:3], np.float32, fill=lse_ref)
        dq, dk, dv = (aligned(shape, np.float16, fill=np.nan) for _ in range(3))
        got = attention_backward(q, k, v, o, do, lse, dq, dk, dv, causal=True)
        assert got[0] is dq and got[1] is dk and got[2] is dv
        for name, x, want in zip(("dq", "dk", "dv"), got, attention_backward_reference(q, k, v, do, True, scale)):
            err = np.abs(x.astype(np.float64) - want).max()
            assert err <= 4e-3 * np.abs(want).max(), f"call {i}, {name}: max error {err:.3g}"
        work.append(_last_backward_plan().owned_outputs)
    assert hits_and_misses() == (1, 1)
    assert not any(a is b for a in work[0] for b in work[1]), "two calls shared a work array"


def _last_backward_plan():
    from numbatma.kernels import AttentionBackward, _plan_cache

    return _plan_cache._hot[AttentionBackward].plan
