"""GPU test (marker ``gpu``): numbatma.intrinsics.fast_exp2 against float64 ``2 ** x`` on fresh random float32 data
over its whole range (and the special values), the output NaN-poisoned first: relative error within the PTX ISA's
bound for ``ex2.approx`` (2^-22.5; 2^-21 asserted), results below 2^-126 exactly +0, subnormal inputs as 0,
infinities and NaN as documented; the simulator's semantics (tests/test_fast_math_cpu.py) agree. ``poly_exp2`` (no
MUFU) the same way: within its 7.5e-5 bound, its ends, and bit for bit the simulator's steps."""
import numpy as np
import pytest
from numba import cuda

from numbatma.intrinsics import fast_exp2, poly_exp2
from numbatma.intrinsics.fast_math import sim_fast_exp2, sim_poly_exp2

pytestmark = pytest.mark.gpu


@cuda.jit
def _exp2_kernel(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = fast_exp2(x[i])


def test_fast_exp2_matches_float64():
    rng = np.random.default_rng()
    special = np.array([0.0, -0.0, 1.0, -1.0, -126.0, -126.5, -149.0, 127.9, 128.0, -np.inf, np.inf, np.nan,
                        2.0 ** -130, -(2.0 ** -130)], np.float32)
    x = np.concatenate([rng.uniform(-160.0, 130.0, 1 << 20).astype(np.float32), special])
    y = cuda.to_device(np.full(x.shape, np.nan, np.float32))
    _exp2_kernel[(x.size + 255) // 256, 256](cuda.to_device(x), y)
    got = y.copy_to_host()
    xs = np.where(np.abs(x) < 2.0 ** -126, 0.0, x.astype(np.float64))
    with np.errstate(over="ignore"):
        exact = np.exp2(xs)
    flushed = exact < 2.0 ** -126
    assert (got[flushed] == 0).all() and not np.signbit(got[flushed]).any()
    big = exact >= 2.0 ** 128
    assert np.isposinf(got[big]).all()
    assert np.isnan(got[np.isnan(x)]).all()
    normal = ~flushed & ~big & ~np.isnan(x)
    rel = np.abs(got[normal] - exact[normal]) / exact[normal]
    assert rel.max() <= 2.0 ** -21, f"max relative error {rel.max():.3g} at x = {x[normal][rel.argmax()]}"
    sim = np.array([sim_fast_exp2(v) for v in x[-len(special):]])  # the simulator on the special values
    np.testing.assert_array_equal(np.isnan(sim), np.isnan(got[-len(special):]))
    ok = ~np.isnan(sim)  # (infinities equal, finite values within the bound: assert_allclose handles both)
    np.testing.assert_allclose(got[-len(special):][ok], sim[ok], rtol=2.0 ** -21, atol=0)


@cuda.jit
def _poly_kernel(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = poly_exp2(x[i])


def test_poly_exp2_matches_float64_and_the_simulator():
    rng = np.random.default_rng()
    special = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, -125.0, -126.0, -126.6, -127.0, -300.0, 127.0, -np.inf,
                        np.nan, 2.0 ** -130], np.float32)
    x = np.concatenate([rng.uniform(-140.0, 127.0, 1 << 20).astype(np.float32),
                        rng.uniform(-8.0, 8.0, 1 << 18).astype(np.float32), special])
    y = cuda.to_device(np.full(x.shape, np.nan, np.float32))
    _poly_kernel[(x.size + 255) // 256, 256](cuda.to_device(x), y)
    got = y.copy_to_host()
    exact = np.exp2(x.astype(np.float64))
    assert np.isnan(got[np.isnan(x)]).all() and not np.isnan(got[~np.isnan(x)]).any()
    tiny = exact < 2.0 ** -125  # (where the polynomial's 2^g < 1 meets ftz: 0 or a normal value)
    assert (got[tiny] <= 2.0 ** -125).all() and not np.signbit(got[tiny]).any()
    assert (got[x <= -126.5] == 0).all()
    normal = ~tiny & ~np.isnan(x)
    rel = np.abs(got[normal] - exact[normal]) / exact[normal]
    assert rel.max() <= 7.6e-5, f"max relative error {rel.max():.3g} at x = {x[normal][rel.argmax()]}"
    pick = np.concatenate([rng.choice(x.size - len(special), 4000, replace=False), np.arange(-len(special), 0)])
    sim = np.array([sim_poly_exp2(v) for v in x[pick]])
    np.testing.assert_array_equal(sim.view(np.uint32)[~np.isnan(sim)], got[pick].view(np.uint32)[~np.isnan(sim)])
