"""Under NUMBA_ENABLE_CUDASIM=1: numbatma.kernels.Gemm runs in the simulator (TMA into swizzled stages, wgmma
decoded from its descriptors, the warp-specialized pipeline, the epilogue through shared memory and TMA stores
with an exact tail) and matches NumPy on small shapes; C is a view inside a sentinel-filled parent. The multistage
comparison kernel of benchmarks/gemm_multistage.py (not warp-specialized) is checked the same way.

Float16 inputs (NumPy has them; bfloat16 takes the same path with another element type)."""
import importlib.util
import pathlib

import numpy as np
import pytest
from numba import cuda

from numbatma.kernels import Gemm, _launch


@pytest.fixture(autouse=True)
def two_sms(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 2)  # a persistent grid of 2: several tiles per CTA


CASES = [  # (m, n, k, layout, out dtype, options) - kept small: the simulator runs every thread in Python
    (130, 72, 136, "nk", np.float32, dict(bn=64, stages=2)),  # partial tiles on every axis, several k-steps
    (64, 128, 64, "kn", np.float16, dict(bn=128, stages=1)),  # (K, N) B in 64-column boxes; one stage
    (72, 61, 64, "nk", np.float32, dict(bn=64, stages=2, alpha=0.5, beta=2.0)),  # beta * C; a 12-byte row tail
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{np.dtype(c[4]).name}-"
                         + ",".join(f"{k}={v}" for k, v in c[5].items()))
def test_gemm_matches_numpy(case):
    m, n, k, layout, out, options = case
    check_against_numpy(Gemm, m, n, k, layout, out, options)


def load_benchmark(name):
    """A module of benchmarks/ (not a package) by path."""
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MULTISTAGE_CASES = [  # benchmarks/gemm_multistage.py: grid 2 with 4+ tiles, so each CTA walks several
    (130, 128, 72, "nk", np.float32, dict(bn=64, stages=2, alpha=0.5, grid=2)),  # partial M and K tiles; alpha
    # ((K, N) B and one stage: tests/test_gpu_gemm.py on the GPU; the CPU suite keeps one simulator case)
]


@pytest.mark.parametrize("case", MULTISTAGE_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-"
                         f"{np.dtype(c[4]).name}-" + ",".join(f"{k}={v}" for k, v in c[5].items()))
def test_multistage_benchmark_kernel_matches_numpy(case):
    m, n, k, layout, out, options = case
    bench = load_benchmark("gemm_multistage")
    check_against_numpy(bench.MultistageGemm, m, n, k, layout, out, options)


def check_against_numpy(plan_class, m, n, k, layout, out, options):
    """``plan_class(a, b, c, b_layout=layout, **options)`` on random float16 data against a float64 NumPy product:
    within the output's rounding plus the float32 accumulation bound, every output written, nothing outside C."""
    rng = np.random.default_rng()
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k) if layout == "nk" else (k, n)).astype(np.float16)
    b_kn = b.T if layout == "nk" else b
    sentinel = 7.0
    width = -(-(n + 11) // 8) * 8  # (rows 16-byte aligned)
    parent = np.full((m + 2, width), sentinel, out)  # C: rows 1..m, columns 8..n+7 of it
    c0 = rng.standard_normal((m, n)).astype(out)
    beta = options.get("beta", 0.0)
    parent[1:m + 1, 8:n + 8] = c0 if beta else np.nan
    d_parent = cuda.to_device(parent)
    d_c = d_parent[1:m + 1, 8:n + 8]
    plan = plan_class(cuda.to_device(a), cuda.to_device(b), d_c, b_layout=layout, **options)
    plan.launch()
    got_parent = d_parent.copy_to_host()
    got = got_parent[1:m + 1, 8:n + 8].astype(np.float64)
    ref = options.get("alpha", 1.0) * (a.astype(np.float64) @ b_kn.astype(np.float64))
    if beta:
        ref += beta * c0.astype(np.float64)
    assert not np.isnan(got).any(), "outputs never written"
    eps = 2.0 ** -11 if out == np.float16 else 2.0 ** -22
    bound = eps * np.abs(ref) + k * 2.0 ** -22 * (np.abs(a.astype(np.float64)) @ np.abs(b_kn.astype(np.float64)))
    assert (np.abs(got - ref) <= bound + 1e-6).all(), f"max error {np.abs(got - ref).max()}"
    outside = got_parent.copy()
    outside[1:m + 1, 8:n + 8] = sentinel
    assert (outside == sentinel).all(), f"{plan_class.__name__} wrote outside C"
