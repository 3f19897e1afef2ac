"""GPU: the simulator's swizzle byte placement is the hardware's. The same kernel (tests/swizzle_image.py)
loads a tile with each swizzle mode on the GPU and, in a subprocess, under NUMBA_ENABLE_CUDASIM=1; the
shared-memory images must be byte-identical."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda

import swizzle_image

pytestmark = pytest.mark.gpu
HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "images.npz"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run([sys.executable, str(HERE / "swizzle_image.py"), str(out)], env=env, cwd=HERE,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(np.load(out))


@pytest.mark.parametrize("case", range(len(swizzle_image.CASES)), ids=[
    f"sw{c[0]}-{c[1]}-{'x'.join(map(str, c[2]))}" for c in swizzle_image.CASES])
def test_simulator_image_matches_hardware(simulated, case):
    span, dtype, box, coords = swizzle_image.CASES[case]
    hardware = swizzle_image.image(span, dtype, box, coords, to_device=cuda.to_device)
    expect = simulated[f"case{case}"]
    assert hardware.size == expect.size
    if not np.array_equal(hardware, expect):
        bad = np.nonzero(hardware != expect)[0]
        pytest.fail(f"swizzle {span}B {dtype} box {box}: {bad.size} bytes differ, first at byte offsets "
                    f"{bad[:8].tolist()} (hardware {hardware[bad[:8]].tolist()}, simulator {expect[bad[:8]].tolist()})")
    # and the image really is swizzled: not the dense box
    dense = np.ascontiguousarray(swizzle_image.source(dtype, box)[tuple(slice(c, c + b) for c, b in zip(coords, box))])
    if dense.shape == box:
        assert not np.array_equal(hardware, dense.view(np.uint8).reshape(-1))
