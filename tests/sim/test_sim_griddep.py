"""Under NUMBA_ENABLE_CUDASIM=1: programmatic dependent launch. The simulator runs launches one after another, so
``griddepcontrol_launch_dependents`` is a no-op and ``griddepcontrol_wait`` returns at once; a chain of kernels
using them (each after the first launched dependent: ``prepare_launch(..., dependent=True)`` or inside
``numbatma.dependent_launch()``, both accepted without effect) gives NumPy's result."""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.intrinsics import griddepcontrol_launch_dependents, griddepcontrol_wait

RNG = np.random.default_rng()
THREADS = 32


@cuda.jit
def produce(x, y):
    griddepcontrol_launch_dependents()
    i = cuda.grid(1)
    if i < x.size:
        y[i] = 2.0 * x[i] + 1.0


@cuda.jit
def consume(y, w, z):
    i = cuda.grid(1)
    own = w[i] if i < w.size else 0.0
    griddepcontrol_launch_dependents()
    griddepcontrol_wait()
    if i < y.size:
        z[i] = y[i] * own - 3.0


@cuda.jit
def finish(z, out):
    i = cuda.grid(1)
    griddepcontrol_wait()
    if i < z.size:
        out[i] = z[i] + z[z.size - 1 - i]


def _case(n):
    x = RNG.standard_normal(n).astype(np.float32)
    w = RNG.standard_normal(n).astype(np.float32)
    z = (2.0 * x + 1.0) * w - 3.0
    return x, w, z, z + z[::-1]


@pytest.mark.parametrize("how", ["prepared", "scope", "plain"])
def test_dependent_chain(how):
    n = 77  # (a ragged last block)
    grid = (n + THREADS - 1) // THREADS
    x, w, want_z, want_out = _case(n)
    y, z, out = (np.full(n, np.nan, np.float32) for _ in range(3))
    if how == "prepared":
        numbatma.prepare_launch(produce, (x, y), grid, THREADS)()
        numbatma.prepare_launch(consume, (y, w, z), grid, THREADS, dependent=True)()
        numbatma.prepare_launch(finish, (z, out), grid, THREADS, dependent=True)()
    elif how == "scope":
        produce[grid, THREADS](x, y)
        with numbatma.dependent_launch():
            consume[grid, THREADS](y, w, z)
            finish[grid, THREADS](z, out)
    else:
        produce[grid, THREADS](x, y)
        consume[grid, THREADS](y, w, z)
        finish[grid, THREADS](z, out)
    np.testing.assert_allclose(z, want_z, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)


def test_intrinsics_return_at_once_every_time():
    """Both return None at once, from any thread, any number of times."""
    @cuda.jit
    def k(out):
        for _ in range(3):
            griddepcontrol_launch_dependents()
            griddepcontrol_wait()
        out[cuda.grid(1)] = 1

    out = np.zeros(64, np.int32)
    k[2, 32](out)
    assert (out == 1).all()
    assert griddepcontrol_wait.__name__ == "griddepcontrol_wait"
    assert "Simulator" in griddepcontrol_wait.__doc__
