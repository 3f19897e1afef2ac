"""Under NUMBA_ENABLE_CUDASIM=1: numba's own simulated streams (``cuda.stream()``, ``cuda.default_stream()``) are
taken by numbatma's stream intake (numbatma.streams), by the plans and function forms of numbatma.kernels and by
numbatma's launch helpers (``prepare_launch``); a simulated launch ignores the stream, as numba's simulator does, and
the results are right. (Before issue 22 the simulator's stream class was not recognised: every call below raised
TypeError "cannot use a numba.cuda.simulator.api.stream as a CUDA stream".)"""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma import streams
from numbatma.kernels import StreamCopy, _launch, axpy, stream_copy

RNG = np.random.default_rng(22)
STREAMS = {"stream": cuda.stream, "default_stream": cuda.default_stream}


@pytest.fixture(autouse=True)
def two_sms(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 2)


@pytest.mark.parametrize("make", STREAMS.values(), ids=STREAMS.keys())
def test_the_intake_returns_numbas_simulated_streams_as_they_are(make):
    s = make()
    assert streams.stream_handle(s) == 0  # (a simulated numba stream: the handle 0, the simulator ignores it)
    assert streams.as_stream(s) is s


@pytest.mark.parametrize("make", STREAMS.values(), ids=STREAMS.keys())
def test_a_plan_launches_on_a_simulated_stream(make):
    x = RNG.standard_normal((24, 72)).astype(np.float32)
    y = np.full_like(x, np.nan)
    assert StreamCopy(cuda.to_device(x), y, stages=2, tile_bytes=1024).launch(make()) is y
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("make", STREAMS.values(), ids=STREAMS.keys())
def test_function_forms_take_a_simulated_stream(make):
    x = RNG.standard_normal((16, 64)).astype(np.float32)
    y = RNG.standard_normal((16, 64)).astype(np.float32)
    out = np.full_like(x, np.nan)
    assert stream_copy(x, out, stream=make()) is out
    np.testing.assert_array_equal(out, x)
    out2 = np.full_like(x, np.nan)
    assert axpy(2.0, x, y, out2, stream=make()) is out2
    np.testing.assert_allclose(out2, np.float32(2.0) * x + y, rtol=1e-6, atol=1e-6)


@cuda.jit
def _scale(src, dst, k):
    i = cuda.grid(1)
    if i < src.shape[0]:
        dst[i] = src[i] * k


@pytest.mark.parametrize("make", STREAMS.values(), ids=STREAMS.keys())
def test_prepare_launch_runs_a_user_kernel_on_a_simulated_stream(make):
    src = cuda.to_device(np.arange(100, dtype=np.float32))
    dst = cuda.to_device(np.zeros(100, np.float32))
    run = numbatma.prepare_launch(_scale, (src, dst, np.float32(3)), 4, 32)
    run(streams.as_stream(make()))  # (what a plan passes: the stream through the intake)
    run(make())  # (and the stream itself)
    np.testing.assert_array_equal(dst.copy_to_host(), np.arange(100, dtype=np.float32) * 3)


@pytest.mark.parametrize("bad, words", [("s", "cannot use 's' (a str)"), (1.5, "cannot use 1.5 (a float)"),
                                        (-3, "non-negative integer (a CUstream), got -3")])
def test_a_plan_refuses_a_stream_of_a_wrong_type(bad, words):
    x = RNG.standard_normal((8, 64)).astype(np.float32)
    y = np.zeros_like(x)
    with pytest.raises(TypeError) as info:
        stream_copy(x, y, stream=bad)
    assert words in str(info.value).splitlines()[0]
