"""First-call time of each ready-made kernel, without and with the on-disk cache (GPU only).

For each kernel (stream_copy, axpy, transpose, row_sum, softmax, laplacian5, gemm, attention): the time of its first
call - plan + compile (or load from numba's on-disk cache) + launch + synchronise - in a fresh process with an empty
cache directory ("cold"), then in a second fresh process with the cache the first one left ("warm"). Both processes
are tests/disk_cache_worker.py (small random inputs, results checked against torch; it reports numba's cache hits
and misses per kernel), run with ``NUMBA_CACHE_DIR`` set to a temporary directory. Prints a markdown table;
``--json PATH`` writes both reports.

    python benchmarks/compile_times.py [--json PATH] [--kernels stream_copy,gemm,...] [--keep DIR]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "tests", "disk_cache_worker.py")


def log(*args):
    print(*args, flush=True)


def run_worker(cache_dir, out, kernels):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, NUMBATMA_DISK_CACHE="1")
    env.pop("NUMBATMA_DEBUG", None)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    cmd = [sys.executable, WORKER, out] + (["--kernels", kernels] if kernels else [])
    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=os.path.dirname(WORKER), env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        log(run.stdout[-2000:])
        log(run.stderr[-4000:])
        raise SystemExit(f"worker failed (exit {run.returncode})")
    with open(out) as f:
        report = json.load(f)
    report["process_s"] = wall
    return report


def cell(result, key):
    return f"{result[key]:.3f}" if key in result else "error"


def table(cold, warm):
    lines = ["| kernel | cold s | warm s | speed-up | warm cache hits / misses | result |",
             "|---|---|---|---|---|---|"]
    for name, c in cold["kernels"].items():
        w = warm["kernels"][name]
        speedup = f"{c['seconds'] / w['seconds']:.0f}x" if "seconds" in c and "seconds" in w else ""
        ok = "ok" if c.get("ok") and w.get("ok") else "WRONG" if "error" not in c and "error" not in w else "error"
        lines.append(f"| {name} | {cell(c, 'seconds')} | {cell(w, 'seconds')} | {speedup} | "
                     f"{w.get('hits', '-')} / {w.get('misses', '-')} | {ok} |")
    cold_s = sum(r.get("seconds", 0.0) for r in cold["kernels"].values())
    warm_s = sum(r.get("seconds", 0.0) for r in warm["kernels"].values())
    speedup = f"{cold_s / warm_s:.0f}x" if warm_s else ""
    lines.append(f"| **all** | {cold_s:.3f} | {warm_s:.3f} | {speedup} | | |")
    lines.append(f"| (import numbatma + torch) | {cold['import_s']:.3f} | {warm['import_s']:.3f} | | | |")
    lines.append(f"| (whole process) | {cold['process_s']:.1f} | {warm['process_s']:.1f} | | | |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write both reports (and the table) here")
    parser.add_argument("--kernels", help="comma-separated subset (default: all)")
    parser.add_argument("--keep", help="use (and keep) this cache directory instead of a temporary one; it must "
                                       "be empty for a cold first process")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="numbatma-compile-times-") as tmp:
        cache_dir = args.keep or os.path.join(tmp, "numba-cache")
        os.makedirs(cache_dir, exist_ok=True)
        if os.listdir(cache_dir):
            raise SystemExit(f"{cache_dir} is not empty: the first process would not be cold")
        log(f"cache directory: {cache_dir}")
        cold = run_worker(cache_dir, os.path.join(tmp, "cold.json"), args.kernels)
        log(f"cold process: {cold['process_s']:.1f} s")
        warm = run_worker(cache_dir, os.path.join(tmp, "warm.json"), args.kernels)
        log(f"warm process: {warm['process_s']:.1f} s")
    text = table(cold, warm)
    log(f"\nFirst call (plan + compile or cache load + launch + sync), {cold['gpu']}, "
        f"{datetime.date.today().isoformat()}:\n")
    log(text)
    for run, report in (("cold", cold), ("warm", warm)):
        for name, result in report["kernels"].items():
            if "error" in result:
                log(f"\n{run} {name} failed:\n{result['error']}")
            elif not result["ok"]:
                log(f"\n{run} {name}: max error {result['max_err']} > {result['bound']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cold": cold, "warm": warm, "table": text}, f, indent=1)
    bad = any("error" in r or not r["ok"] for rep in (cold, warm) for r in rep["kernels"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
