"""CPU: the simulator suite (tests/sim) runs under NUMBA_ENABLE_CUDASIM=1 in a subprocess, since the
variable must be set before Numba is imported."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
if importlib.util.find_spec("pytest_timeout"):  # (a whole suite in a subprocess, given up to 900 s below: over the
    pytestmark = [pytest.mark.timeout(1000)]  # GPU suite's per-test limit, which ended it on a busy machine once)


def test_simulator_suite_passes():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    try:  # the simulator is GIL-bound: two processes halve the suite's wall time on a 2-core CI machine
        import xdist  # noqa: F401

        workers = ["-n", "2"]
    except ImportError:
        workers = []
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, str(HERE / "sim")],
        capture_output=True, text=True, env=env, timeout=900, cwd=HERE,  # (not the checkout root: import the installed numbatma)
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "skipped" not in out.stdout.splitlines()[-1]
