"""One process's first calls of the ready-made kernels (GPU), for tests/test_gpu_disk_cache.py and
benchmarks/compile_times.py: each kernel's function form once on small random torch tensors (outputs NaN-poisoned),
the result compared with a torch reference, and per kernel the first-call seconds (plan + compile or on-disk cache
load + launch + synchronise) and the on-disk cache hits and misses numba counted for the kernels it ran.

    python tests/disk_cache_worker.py OUT.json [--kernels stream_copy,gemm,...]

Run it with ``NUMBA_CACHE_DIR`` set to a directory of its own: a first process finds it empty (every kernel
compiled and saved: misses), a second one loads every kernel (hits)."""
import argparse
import functools
import json
import sys
import time
import traceback

T_START = time.perf_counter()
import torch  # noqa: E402
from numba import cuda  # noqa: E402

import numbatma  # noqa: E402
from numbatma.kernels import _compile_cache  # noqa: E402

import multi_device_worker as device_cases  # noqa: E402  (this folder: sys.path[0] when run as a script)

IMPORT_S = time.perf_counter() - T_START
DEV = "cuda"


# Each case: () -> (call, check); call() runs the function form once, check() -> (max error, bound). The cases of
# tests/multi_device_worker.py (the same kernels on the same small tensors), on the current device.
CASES = {name: functools.partial(device_cases.CASES[name], DEV) for name in (
    "stream_copy", "axpy", "transpose", "row_sum", "softmax", "laplacian5", "gemm", "attention")}


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
