"""One process's first calls of the ready-made kernels (GPU), for tests/test_gpu_disk_cache.py and
benchmarks/compile_times.py: each kernel's function form once on small random torch tensors (outputs NaN-poisoned),
the result compared with a torch reference, and per kernel the first-call seconds (plan + compile or on-disk cache
load + launch + synchronise) and the on-disk cache hits and misses numba counted for the kernels it ran.

    python tests/disk_cache_worker.py OUT.json [--kernels stream_copy,gemm,...]

Run it with ``NUMBA_CACHE_DIR`` set to a directory of its own: a first process finds it empty (every kernel
compiled and saved: misses), a second one loads every kernel (hits)."""
import argparse
import json
import sys
import time
import traceback

T_START = time.perf_counter()
import torch  # noqa: E402
from numba import cuda  # noqa: E402

import numbatma  # noqa: E402
from numbatma import kernels as K  # noqa: E402
from numbatma.kernels import _compile_cache  # noqa: E402

IMPORT_S = time.perf_counter() - T_START
DEV = "cuda"


def randn(*shape, dtype=torch.float32):
    return torch.randn(shape, device=DEV, dtype=torch.float32).to(dtype)


def nan_like(x, shape=None, dtype=None):
    return torch.full(shape or x.shape, float("nan"), device=DEV, dtype=dtype or x.dtype)


def max_err(got, want):
    got, want = got.double(), want.double()
    if torch.isnan(got).any():
        return float("inf")
    return float((got - want).abs().max())


# Each case: () -> (call, check); call() runs the function form once, check() -> (max error, bound).
def case_stream_copy():
    x = randn(300, 1000)
    y = nan_like(x)
    return lambda: K.stream_copy(x, y), lambda: (max_err(y, x), 0.0)


def case_axpy():
    x, y = randn(300, 1000), randn(300, 1000)
    out = nan_like(x)
    return lambda: K.axpy(2.5, x, y, out), lambda: (max_err(out, 2.5 * x.double() + y.double()), 1e-5)


def case_transpose():
    x = randn(300, 520)
    y = nan_like(x, (520, 300))
    return lambda: K.transpose(x, y), lambda: (max_err(y, x.t()), 0.0)


def case_row_sum():
    x = randn(300, 1000)
    out = nan_like(x, (300,))
    return lambda: K.row_sum(x, out), lambda: (max_err(out, x.double().sum(-1)), 1e-3)


def case_softmax():
    x = randn(300, 1000)
    out = nan_like(x)
    return lambda: K.softmax(x, out), lambda: (max_err(out, torch.softmax(x.double(), -1)), 1e-6)


def case_laplacian5():
    x = randn(300, 1000)
    out = nan_like(x)

    def reference():
        p = torch.nn.functional.pad(x.double(), (1, 1, 1, 1))
        return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * p[1:-1, 1:-1]

    return lambda: K.laplacian5(x, out), lambda: (max_err(out, reference()), 1e-4)


def case_gemm():
    m, n, k = 256, 320, 192
    a, b = randn(m, k, dtype=torch.bfloat16), randn(k, n, dtype=torch.bfloat16)  # (b as (K, N): b_layout="kn")
    c = nan_like(a, (m, n))

    def check():
        ref = a.double() @ b.double()
        bound = 2.0 ** -8 * ref.abs() + k * 2.0 ** -23 * (a.double().abs() @ b.double().abs())
        excess = (c.double() - ref).abs() - 2 * bound  # (twice the bf16 rounding of the output: margin)
        return (float("inf") if torch.isnan(c).any() else max(float(excess.max()), 0.0)), 0.0

    return lambda: K.gemm(a, b, c), check


def case_attention():
    b, h, s, d = 1, 2, 200, 64
    q, k, v = (randn(b, h, s, d, dtype=torch.bfloat16) for _ in range(3))
    o = nan_like(q)
    lse = nan_like(q, (b, h, s), torch.float32)

    def check():
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        bound = 2 * 2.0 ** -7 * float(v.float().abs().max())  # (two bfloat16 ulps of max|V|)
        return max_err(o, ref), bound

    return lambda: K.attention(q, k, v, o, lse), check


CASES = {
    "stream_copy": case_stream_copy, "axpy": case_axpy, "transpose": case_transpose, "row_sum": case_row_sum,
    "softmax": case_softmax, "laplacian5": case_laplacian5, "gemm": case_gemm, "attention": case_attention,
}


def counts():
    """{id(kernel): (hits, misses)} over every kernel given the on-disk cache so far."""
    return {id(k): (sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))
            for k in _compile_cache.cached_kernels()}


def run_case(name):
    make = CASES[name]
    call, check = make()
    torch.cuda.synchronize()
    before = counts()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    after = counts()
    hits = sum(h - before.get(i, (0, 0))[0] for i, (h, _) in after.items())
    misses = sum(m - before.get(i, (0, 0))[1] for i, (_, m) in after.items())
    err, bound = check()
    return {"seconds": seconds, "hits": hits, "misses": misses, "kernels": len(after) - len(before),
            "max_err": err, "bound": bound, "ok": err <= bound}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--kernels", default=",".join(CASES))
    args = parser.parse_args()
    names = [n for n in args.kernels.split(",") if n]
    for n in names:
        if n not in CASES:
            parser.error(f"unknown kernel {n!r}; one of {', '.join(CASES)}")
    t0 = time.perf_counter()
    torch.zeros(1, device=DEV)  # (the CUDA context, torch's and numba's, before any timing)
    cuda.current_context()
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    torch.manual_seed(0)
    results = {}
    for name in names:
        try:
            results[name] = run_case(name)
        except Exception:
            results[name] = {"error": traceback.format_exc()}
    report = {
        "kernels": results, "import_s": IMPORT_S, "init_s": init_s, "disk_cache": _compile_cache.ACTIVE,
        "gpu": torch.cuda.get_device_name(), "numbatma": numbatma.__version__,
        "cached_kernels": len(_compile_cache.cached_kernels()),
        "cache_paths": sorted({str(k.stats.cache_path) for k in _compile_cache.cached_kernels()}),
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
