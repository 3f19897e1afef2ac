"""Every kernel of numbatma.kernels once, on small shapes with partial tiles, checked against NumPy: the workload
the GPU suite runs under compute-sanitizer (memcheck, racecheck, synccheck; `PARTS=sanitize`). Small shapes keep
the instrumented run short; each kernel still walks several tiles per CTA (a persistent grid of 2 CTAs), its
pipeline wraps around, and the exact-store tail path runs (widths that are not a multiple of 16 bytes).

    python scripts/sanitize_kernels.py [NAME ...]   # one line per kernel (or those whose name contains a NAME);
                                                    # exits 1 on a wrong result
"""
from __future__ import annotations

import sys

import numpy as np
from numba import cuda

import numbatma

from numbatma.kernels import (Attention, Axpy, Gemm, Laplacian5, RowSum, Softmax, StreamCopy, Transpose, _launch,
                              tma_copy)

RNG = np.random.default_rng(0)


def data(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def padded(rows_host, dtype=None):
    """A device view of ``rows_host`` inside a parent whose rows are padded to 16 bytes (NaN padding), as TMA
    needs; returns (view, parent)."""
    x = np.asarray(rows_host, dtype=dtype)
    per16 = 16 // x.dtype.itemsize
    width = -(-x.shape[-1] // per16) * per16
    parent = np.full(x.shape[:-1] + (width,), np.nan, x.dtype)
    parent[..., :x.shape[-1]] = x
    d = cuda.to_device(parent)
    view = (slice(None),) * (x.ndim - 1) + (slice(0, x.shape[-1]),)  # (device arrays take no Ellipsis)
    return d[view], d


def poisoned(shape, dtype=np.float32):
    """A NaN-filled device view of ``shape`` inside a padded parent: (view, parent)."""
    return padded(np.full(shape, np.nan, dtype))


def check_parent(name, parent, width):
    """The padding of an output parent past ``width`` is still NaN: nothing was written outside the view."""
    tail = parent.copy_to_host()[..., width:]
    if tail.size and not np.isnan(tail.astype(np.float32)).all():
        raise AssertionError(f"{name}: {int((~np.isnan(tail)).sum())} elements written outside the view")


def check(name, got, want, **tol):
    np.testing.assert_allclose(got, want, **tol)
    print(f"ok   {name}", flush=True)


def main():
    _launch.sm_count = lambda *a: 2  # a persistent grid of 2 CTAs: several tiles each, pipelines wrap around
    failed = []

    only = [a for a in sys.argv[1:] if not a.startswith("-")]  # names (substrings) to run; default all

    def case(name, fn):
        if only and not any(o in name for o in only):
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failed.append(name)
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)

    def copy():
        x = data((3, 10, 27))
        y, yp = poisoned(x.shape)
        tma_copy(padded(x)[0], y, box=(2, 8, 8))
        cuda.synchronize()
        check_parent("tma_copy", yp, 27)
        check("tma_copy rank 3, partial boxes", y.copy_to_host(), x, rtol=0, atol=0)

    def stream(two_roles):
        def run():
            x = data((40, 67))
            y, yp = poisoned(x.shape)
            StreamCopy(padded(x)[0], y, stages=3, tile_bytes=1024, two_roles=two_roles).launch()
            cuda.synchronize()
            check_parent("StreamCopy", yp, 67)
            check(f"StreamCopy two_roles={two_roles}", y.copy_to_host(), x, rtol=0, atol=0)
        return run

    def axpy():
        x, y = data((24, 61)), data((24, 61))
        out, op = poisoned(x.shape)
        Axpy(1.5, padded(x)[0], padded(y)[0], out, stages=2, tile_bytes=2048).launch()
        cuda.synchronize()
        check_parent("Axpy", op, 61)
        check("Axpy", out.copy_to_host(), np.float32(1.5) * x + y, rtol=1e-6, atol=1e-6)

    def transpose():
        x = data((42, 75))
        y, yp = poisoned((75, 42))
        Transpose(padded(x)[0], y).launch()
        cuda.synchronize()
        check_parent("Transpose", yp, 42)
        check("Transpose", y.copy_to_host(), x.T, rtol=0, atol=0)

    def rows():
        x = data((12, 203))
        s = cuda.to_device(np.full(12, np.nan, np.float32))
        RowSum(padded(x)[0], s).launch()
        out, op = poisoned(x.shape)
        Softmax(padded(x)[0], out).launch()
        cuda.synchronize()
        check_parent("Softmax", op, 203)
        check("RowSum", s.copy_to_host(), x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        check("Softmax", out.copy_to_host(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)

    def stencil():
        x = data((20, 37))
        out, op = poisoned(x.shape)
        Laplacian5(padded(x)[0], out, tile=(8, 16)).launch()
        cuda.synchronize()
        check_parent("Laplacian5", op, 37)
        p = np.pad(x, 1)
        check("Laplacian5", out.copy_to_host(), p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * x,
              rtol=1e-5, atol=1e-5)

    def gemm(layout, **options):
        def run():
            m, n, k = 200, 264, 136  # partial tiles in M, N and K
            a = data((m, k), np.float16)
            b = data((k, n) if layout == "kn" else (n, k), np.float16)
            c = cuda.to_device(np.full((m, n), np.nan, np.float16))
            Gemm(cuda.to_device(a), cuda.to_device(b), c, b_layout=layout, **options).launch()
            cuda.synchronize()
            w = b.astype(np.float64) if layout == "kn" else b.astype(np.float64).T
            ref = a.astype(np.float64) @ w
            check(f"Gemm {layout} {options}", c.copy_to_host().astype(np.float64), ref, rtol=2e-2, atol=5e-2)
        return run

    def multistage(layout):
        """benchmarks/gemm_multistage.py (the comparison kernel, Gemm's warp_specialized=False until issue 23)."""
        def run():
            import importlib.util
            import os as _os

            path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "benchmarks",
                                 "gemm_multistage.py")
            spec = importlib.util.spec_from_file_location("gemm_multistage", path)
            bench = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(bench)
            m, n, k = 200, 264, 136  # partial tiles in M, N and K (N a multiple of 8: no exact-store tail there)
            a = data((m, k), np.float16)
            b = data((k, n) if layout == "kn" else (n, k), np.float16)
            c = cuda.to_device(np.full((m, n), np.nan, np.float16))
            bench.MultistageGemm(cuda.to_device(a), cuda.to_device(b), c, b_layout=layout, bn=64, stages=2,
                                 grid=2).launch()
            cuda.synchronize()
            w = b.astype(np.float64) if layout == "kn" else b.astype(np.float64).T
            check(f"MultistageGemm {layout}", c.copy_to_host().astype(np.float64), a.astype(np.float64) @ w,
                  rtol=2e-2, atol=5e-2)
        return run

    def attention(causal, scale=None):
        def run():
            import sys as _sys
            import os as _os

            _sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "tests"))
            from attention_reference import attention_reference

            q, k, v = (data(s, np.float16) for s in ((1, 2, 100, 64), (1, 1, 70, 64), (1, 1, 70, 64)))
            o = cuda.to_device(np.full(q.shape, np.nan, np.float16))
            plan = Attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), o, causal=causal, bn=64,
                             scale=scale)
            _, lse = plan.launch()
            cuda.synchronize()
            ref, ref_lse = attention_reference(q, k, v, causal, plan.scale)
            name = f"Attention causal={causal} scale={plan.scale:.3g}"
            check(name, o.copy_to_host().astype(np.float64), ref, rtol=1e-2, atol=1e-2)
            check(f"{name} lse", lse.copy_to_host().astype(np.float64), ref_lse, rtol=1e-3, atol=1e-3)
        return run

    case("tma_copy", copy)
    case("StreamCopy", stream(False))
    case("StreamCopy two roles", stream(True))
    case("Axpy", axpy)
    case("Transpose", transpose)
    case("RowSum/Softmax", rows)
    case("Laplacian5", stencil)
    case("Gemm nk", gemm("nk"))
    case("Gemm kn", gemm("kn"))
    case("Gemm nk not warp-specialized (benchmarks/gemm_multistage.py)", multistage("nk"))
    case("Attention", attention(False))
    case("Attention causal", attention(True))
    for scale in (-0.3, 0.0, 2.0):  # (the other softmax modes: negative, zero, exact)
        case(f"Attention scale={scale}", attention(True, scale))
    if not numbatma.SIMULATING:  # (the simulator runs one-CTA clusters only)
        case("Gemm nk cluster of 2", gemm("nk", cluster_m=2))
    print(f"{'FAILED: ' + ', '.join(failed) if failed else 'all kernels OK'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
