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


@pytest.mark.parametrize("span, box", [(64, (16, 8)), (128, (8, 16)), (128, (8, 4)), (32, (8, 4))])
def test_round_trip_with_rows_narrower_than_the_swizzle(span, box):
    """Load and store through a tile whose rows each take a whole swizzle span (desc.shared_shape):
    the store reads the same padded layout the load wrote."""
    import numbatma
    from numbatma.intrinsics import (bulk_commit_group, bulk_wait_group, fence_proxy_async_shared_cta,
                                     mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait_parity, tma_load,
                                     tma_store)

    host = np.random.default_rng().standard_normal((3 * box[0] + 5, 4 * box[1] + 4)).astype(np.float32)
    src = numbatma.TensorMap(cuda.to_device(host), box, swizzle=span)
    out = cuda.to_device(np.full_like(host, np.nan))
    dst = numbatma.TensorMap(out, box, swizzle=span)
    shape = src.shared_shape

    @cuda.jit
    def round_trip(src, dst):
        tile = cuda.shared.array(shape, np.float32, alignment=1024)
        bar = cuda.shared.array(1, np.uint64)
        if cuda.threadIdx.x == 0:
            r, c = cuda.blockIdx.y * box[0], cuda.blockIdx.x * box[1]
            mbarrier_init(bar, 1)
            mbarrier_arrive_expect_tx(bar, src.box_bytes)
            tma_load(tile, src, (r, c), bar)
            mbarrier_wait_parity(bar, 0)
            fence_proxy_async_shared_cta()
            tma_store(dst, (r, c), tile)
            bulk_commit_group()
            bulk_wait_group(0)

    grid = (-(-host.shape[1] // box[1]), -(-host.shape[0] // box[0]))
    round_trip[grid, 32](src, dst)
    np.testing.assert_array_equal(out.copy_to_host(), host)
