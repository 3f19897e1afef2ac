"""CPU: the simulator suite (tests/sim) runs under NUMBA_ENABLE_CUDASIM=1 in subprocesses, since the variable must be
set before Numba is imported: one test per file of tests/sim, so that xdist spreads the files over its workers with
the other tests, progress shows per file, and a failure names the file and shows the end of its output."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SIM_FILES = sorted(p.name for p in (HERE / "sim").glob("test_*.py"))
# Seconds each file took on its own (2 cores, a busy machine, 2026-11-27): only to start the long ones first.
SECONDS = {"test_sim_attention.py": 80, "test_sim_planted_bugs.py": 48, "test_sim_wgmma_hazards.py": 38,
           "test_sim_attention_backward.py": 85, "test_sim_gemm.py": 21,
           "test_sim_wgmma.py": 30, "test_sim_plan_cache.py": 30, "test_sim_swizzle.py": 22,
           "test_sim_parity.py": 16, "test_sim_mma.py": 15, "test_sim_kernels.py": 13, "test_sim_exact_store.py": 13,
           "test_sim_bulk.py": 13, "test_sim_im2col.py": 12}
# Long files run as several subprocesses, each with every n-th test (NUMBATMA_SIM_SHARD, tests/sim/conftest.py), so
# that no one file holds a worker for minutes.
SHARDS = {"test_sim_attention.py": 4, "test_sim_attention_backward.py": 3}
# The subprocess tests, longest first (tests/conftest.py spreads them through the session in this order, so that
# xdist starts the long ones early, on different workers, and no worker is left with one at the end).
RUNS = sorted(((name, k, SHARDS.get(name, 1)) for name in SIM_FILES for k in range(SHARDS.get(name, 1))),
              key=lambda run: -SECONDS.get(run[0], 0) / run[2])
# (one file in a subprocess, given up to 600 s below: over the GPU suite's per-test limit, which once ended the
# worker of the whole simulator suite on a busy machine)
if importlib.util.find_spec("pytest_timeout"):
    pytestmark = [pytest.mark.timeout(700)]


def run_simulator_file(name, k=0, n=1):
    """Runs tests/sim/<name> (its k-th of n shards) under the simulator in a new interpreter (from tests/, not the
    checkout root, so that the installed numbatma is imported); returns the CompletedProcess."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", NUMBATMA_SIM_SHARD=f"{k}/{n}")
    env.pop("PYTEST_XDIST_WORKER", None)  # (the subprocess is a plain pytest run, not an xdist worker)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(HERE / "sim" / name)],
        capture_output=True, text=True, env=env, timeout=600, cwd=HERE,
    )


def test_simulator_folder_is_not_empty():
    assert len(SIM_FILES) > 10, SIM_FILES
    assert set(SHARDS) | set(SECONDS) <= set(SIM_FILES), sorted((set(SHARDS) | set(SECONDS)) - set(SIM_FILES))


@pytest.mark.parametrize("name, k, n", RUNS, ids=[name[:-3] + (f"-{k + 1}of{n}" if n > 1 else "") for name, k, n in RUNS])
def test_simulator_file_passes(name, k, n):
    out = run_simulator_file(name, k, n)
    tail = (f"tests/sim/{name} (shard {k}/{n}) under NUMBA_ENABLE_CUDASIM=1, exit {out.returncode}:\n"
            + out.stdout[-4000:] + out.stderr[-2000:])
    assert out.returncode == 0, tail
    summary = out.stdout.strip().splitlines()[-1]  # e.g. "58 passed in 12.3s": every test ran, none was skipped
    assert " passed" in summary and "skipped" not in summary, tail
