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
# Long files run as several subprocesses, each with every n-th test (NUMBATMA_SIM_SHARD, tests/sim/conftest.py), so
# that no one file holds a worker for minutes; measured on 2 cores (seconds for the whole file, a busy machine).
SHARDS = {"test_sim_attention.py": 4}
# (shards first, the longest first: tests/conftest.py moves these tests to the front of the session, so that xdist
# starts the long subprocesses before the many short tests)
RUNS = ([(name, k, n) for name, n in sorted(SHARDS.items(), key=lambda kv: -kv[1]) for k in range(n)]
        + [(name, 0, 1) for name in SIM_FILES if name not in SHARDS])
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
    assert set(SHARDS) <= set(SIM_FILES), sorted(set(SHARDS) - set(SIM_FILES))


@pytest.mark.parametrize("name, k, n", RUNS, ids=[name[:-3] + (f"-{k + 1}of{n}" if n > 1 else "") for name, k, n in RUNS])
def test_simulator_file_passes(name, k, n):
    out = run_simulator_file(name, k, n)
    tail = (f"tests/sim/{name} (shard {k}/{n}) under NUMBA_ENABLE_CUDASIM=1, exit {out.returncode}:\n"
            + out.stdout[-4000:] + out.stderr[-2000:])
    assert out.returncode == 0, tail
    summary = out.stdout.strip().splitlines()[-1]  # e.g. "58 passed in 12.3s": every test ran, none was skipped
    assert " passed" in summary and "skipped" not in summary, tail
