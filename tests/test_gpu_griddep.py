"""GPU (compute capability 9.0+): programmatic dependent launch. Kernels on one stream, each after the first
launched dependent (``numbatma.prepare_launch(..., dependent=True)``, or a plain numba launch inside
``numbatma.dependent_launch()``): the producer calls ``griddepcontrol_launch_dependents`` first thing and then
takes its time (``nanosleep``) before writing, so a dependent kernel that read before its ``griddepcontrol_wait``
returned would see the poison; each dependent waits before reading what the kernel before it wrote. The results
are compared with NumPy on random data, every output poisoned first.

The kernels are plain functions (compiled offline by tests/test_griddep_cpu.py)."""
import numpy as np
import pytest
from numba import cuda, types

import numbatma
from numbatma.intrinsics import griddepcontrol_launch_dependents, griddepcontrol_wait

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng()
THREADS = 128
N = 300_000  # (a ragged last block)
DELAY_NS = 20_000  # the producer's wait before it writes: the dependent has long started by then


def k_produce(x, y, delay):
    griddepcontrol_launch_dependents()  # early: the dependent kernel's prologue overlaps this whole kernel
    i = cuda.grid(1)
    cuda.nanosleep(delay)
    if i < x.size:
        y[i] = 2.0 * x[i] + 1.0


def k_consume(y, w, z):
    i = cuda.grid(1)
    own = w[i] if i < w.size else 0.0  # prologue: its own input, written before the chain started
    griddepcontrol_launch_dependents()
    griddepcontrol_wait()  # before the first read of y
    if i < y.size:
        z[i] = y[i] * own - 3.0


def k_finish(z, out):
    i = cuda.grid(1)
    griddepcontrol_wait()
    if i < z.size:
        out[i] = z[i] + z[z.size - 1 - i]


SIGNATURES = {
    "k_produce": (types.float32[::1], types.float32[::1], types.uint32),
    "k_consume": (types.float32[::1], types.float32[::1], types.float32[::1]),
    "k_finish": (types.float32[::1], types.float32[::1]),
}

produce, consume, finish = cuda.jit(k_produce), cuda.jit(k_consume), cuda.jit(k_finish)


def _data(n=N):
    x = RNG.standard_normal(n).astype(np.float32)
    w = RNG.standard_normal(n).astype(np.float32)
    y = 2.0 * x + 1.0
    z = y * w - 3.0
    return x, w, z, z + z[::-1]


def _poisoned(n, stream):
    return cuda.to_device(np.full(n, np.nan, np.float32), stream=stream)


def _grid(n=N):
    return (n + THREADS - 1) // THREADS


def _check(z, out, want_z, want_out, stream):
    stream.synchronize()
    np.testing.assert_allclose(z.copy_to_host(), want_z, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.copy_to_host(), want_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("repeat", range(3))
def test_prepared_dependent_chain(repeat):
    stream = cuda.stream()
    x, w, want_z, want_out = _data()
    dx, dw = cuda.to_device(x, stream=stream), cuda.to_device(w, stream=stream)
    y, z, out = _poisoned(N, stream), _poisoned(N, stream), _poisoned(N, stream)
    stream.synchronize()
    first = numbatma.prepare_launch(produce, (dx, y, np.uint32(DELAY_NS)), _grid(), THREADS)
    second = numbatma.prepare_launch(consume, (y, dw, z), _grid(), THREADS, dependent=True)
    third = numbatma.prepare_launch(finish, (z, out), _grid(), THREADS, dependent=True)
    first(stream)
    second(stream)
    third(stream)
    _check(z, out, want_z, want_out, stream)


@pytest.mark.parametrize("repeat", range(3))
def test_chain_inside_dependent_launch(repeat):
    stream = cuda.stream()
    x, w, want_z, want_out = _data()
    dx, dw = cuda.to_device(x, stream=stream), cuda.to_device(w, stream=stream)
    y, z, out = _poisoned(N, stream), _poisoned(N, stream), _poisoned(N, stream)
    stream.synchronize()
    produce[_grid(), THREADS, stream, 0](dx, y, np.uint32(DELAY_NS))
    with numbatma.dependent_launch():
        consume[_grid(), THREADS, stream, 0](y, dw, z)
        finish[_grid(), THREADS, stream, 0](z, out)
    _check(z, out, want_z, want_out, stream)


def test_many_back_to_back_chains():
    """The same prepared chain launched again and again on one stream, new inputs written in between (stream
    order): every round's result is the last round's inputs'."""
    stream = cuda.stream()
    n = 50_000
    dx, dw = cuda.device_array(n, np.float32, stream=stream), cuda.device_array(n, np.float32, stream=stream)
    y, z, out = _poisoned(n, stream), _poisoned(n, stream), _poisoned(n, stream)
    runs = (numbatma.prepare_launch(produce, (dx, y, np.uint32(2_000)), _grid(n), THREADS),
            numbatma.prepare_launch(consume, (y, dw, z), _grid(n), THREADS, dependent=True),
            numbatma.prepare_launch(finish, (z, out), _grid(n), THREADS, dependent=True))
    for _ in range(5):
        x, w, want_z, want_out = _data(n)
        dx.copy_to_device(x, stream=stream)
        dw.copy_to_device(w, stream=stream)
        for run in runs:
            run(stream)
        _check(z, out, want_z, want_out, stream)


def test_intrinsics_in_a_kernel_launched_normally():
    """Without the launch attribute ``griddepcontrol_wait`` returns at once and ``launch_dependents`` does
    nothing: a plain launch of the chain gives the same result."""
    stream = cuda.stream()
    x, w, want_z, want_out = _data()
    dx, dw = cuda.to_device(x, stream=stream), cuda.to_device(w, stream=stream)
    y, z, out = _poisoned(N, stream), _poisoned(N, stream), _poisoned(N, stream)
    produce[_grid(), THREADS, stream, 0](dx, y, np.uint32(DELAY_NS))
    consume[_grid(), THREADS, stream, 0](y, dw, z)
    finish[_grid(), THREADS, stream, 0](z, out)
    _check(z, out, want_z, want_out, stream)


@pytest.mark.parametrize("repeat", range(2))
def test_dependent_chain_of_plans(repeat):
    """Ready-made kernels launched dependent (plans and function forms inside ``numbatma.dependent_launch()``)
    after the slow producer: each waits for the kernel before it, so every result is right (outputs poisoned
    first). The chain: produce y; StreamCopy y -> a; Softmax a -> s; RowSum s -> r (each row sums to 1);
    transpose s -> t; Axpy 2*t + t -> u; copy u -> v (function forms among them)."""
    from numbatma.kernels import Axpy, RowSum, Softmax, StreamCopy, stream_copy, transpose

    stream = cuda.stream()
    rows, cols = 600, 500  # (N = 300_000 = rows * cols: the producer writes y, viewed as (rows, cols))
    x, _, _, _ = _data()
    dx = cuda.to_device(x, stream=stream)
    y = _poisoned(N, stream)
    a, s = _poisoned(N, stream).reshape(rows, cols), _poisoned(N, stream).reshape(rows, cols)
    r = _poisoned(rows, stream)
    t, u, v = (_poisoned(N, stream).reshape(cols, rows) for _ in range(3))
    stream.synchronize()
    plans = [StreamCopy(y.reshape(rows, cols), a), Softmax(a, s), RowSum(s, r)]
    produce[_grid(), THREADS, stream, 0](dx, y, np.uint32(DELAY_NS))
    with numbatma.dependent_launch():
        for plan in plans:
            plan.launch(stream)
        transpose(s, t, stream=stream)
        Axpy(2.0, t, t, u).launch(stream)
        stream_copy(u, v, stream=stream)
    stream.synchronize()
    want_y = (2.0 * x + 1.0).reshape(rows, cols)
    np.testing.assert_array_equal(a.copy_to_host(), want_y)
    e = np.exp(want_y - want_y.max(axis=1, keepdims=True))
    want_s = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(s.copy_to_host(), want_s, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r.copy_to_host(), np.ones(rows), rtol=1e-5)
    np.testing.assert_allclose(v.copy_to_host(), 3.0 * want_s.T, rtol=1e-5, atol=1e-6)
