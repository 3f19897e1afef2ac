"""GPU test (marker ``gpu``): the ready-made kernels are cached on disk across processes.

With a fresh, empty ``NUMBA_CACHE_DIR``, a first process (tests/disk_cache_worker.py) runs stream_copy, axpy,
transpose, row_sum, softmax, laplacian5, gemm and attention once each on small random inputs, checked against torch:
every kernel is compiled (numba counts cache misses, no hits) and saved. A second process does the same and must
load every kernel from the cache (hits, no misses), give the same results, and take much less time to its first
results."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu]
if importlib.util.find_spec("pytest_timeout"):  # (two processes, the first compiling every kernel: over the suite's
    pytestmark.append(pytest.mark.timeout(1000))  # default per-test limit)
pytest.importorskip("torch")

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "disk_cache_worker.py"


def run_worker(cache_dir, out, timeout):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), NUMBATMA_DISK_CACHE="1")
    env.pop("NUMBATMA_DEBUG", None)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    run = subprocess.run([sys.executable, str(WORKER), str(out)], cwd=HERE, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.read_text())


def table(cold, warm):
    rows = [f"{name}: cold {cold['kernels'][name].get('seconds', float('nan')):.3f} s "
            f"({cold['kernels'][name].get('misses')} misses), warm {warm['kernels'][name].get('seconds', float('nan')):.3f}"
            f" s ({warm['kernels'][name].get('hits')} hits, {warm['kernels'][name].get('misses')} misses)"
            for name in cold["kernels"]]
    return "\n".join(rows)


def test_second_process_loads_every_kernel_from_the_cache(tmp_path):
    cache_dir = tmp_path / "numba-cache"
    cache_dir.mkdir()
    cold = run_worker(cache_dir, tmp_path / "cold.json", 600)
    warm = run_worker(cache_dir, tmp_path / "warm.json", 300)
    assert cold["disk_cache"] and warm["disk_cache"]
    assert set(cold["kernels"]) == set(warm["kernels"]) == {
        "stream_copy", "axpy", "transpose", "row_sum", "softmax", "laplacian5", "gemm", "attention"}
    for run, report in (("cold", cold), ("warm", warm)):
        for name, result in report["kernels"].items():
            assert "error" not in result, f"{run} {name}:\n{result['error']}"
            assert result["ok"], f"{run} {name}: max error {result['max_err']} > {result['bound']}"
            assert result["kernels"] >= 1, f"{run} {name}: no kernel of numbatma.kernels with a disk cache ran"
    summary = table(cold, warm)
    for name in cold["kernels"]:
        c, w = cold["kernels"][name], warm["kernels"][name]
        assert c["misses"] >= 1 and c["hits"] == 0, f"{name}: the first process should compile\n{summary}"
        assert w["hits"] >= 1 and w["misses"] == 0, f"{name}: the second process compiled\n{summary}"
        assert w["hits"] == c["misses"], f"{name}: every kernel compiled first is loaded second\n{summary}"
    # the files went to NUMBA_CACHE_DIR, one index file per factory kernel at least
    assert all(pathlib.Path(p).is_relative_to(cache_dir) for p in cold["cache_paths"]), cold["cache_paths"]
    assert len(list(cache_dir.rglob("*.nbi"))) >= 8 and list(cache_dir.rglob("*.nbc"))
    cold_s = sum(r["seconds"] for r in cold["kernels"].values())
    warm_s = sum(r["seconds"] for r in warm["kernels"].values())
    assert warm_s < cold_s / 3, f"warm first calls {warm_s:.2f} s vs cold {cold_s:.2f} s\n{summary}"
