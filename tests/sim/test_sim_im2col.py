"""Under NUMBA_ENABLE_CUDASIM=1: tma_load_im2col against a NumPy convolution reference (the same cases as
tests/test_gpu_im2col.py, which passed on an H200), and the simulator's misuse reports."""
import numpy as np
import pytest
from numba import cuda

from numbatma import OOBFill, Swizzle
from numbatma.im2col import Im2colTensorMap, gather
from numbatma.intrinsics import (
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load_im2col,
)
from numbatma.intrinsics._sim import SimulatedMisuse

from im2col_kernels import CASES, case_params, check_case, column_start, expected_column, load_kernel, taps

RNG = np.random.default_rng()


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("device", [False, True], ids=["host-array", "device-array"])
def test_kernel_matches_convolution_reference(name, device):
    case = CASES[name]
    kernel = cuda.jit(load_kernel((case["pixels"], case["channels"]), case["dtype"]))

    def launch(desc, coords, offsets, out):
        kernel[1, 8](desc, coords, offsets, out)
        return out

    make = cuda.to_device if device else (lambda x: x)
    assert check_case(case, RNG, make, launch, np.asarray, tap_limit=3) >= 3


@pytest.mark.parametrize("name", sorted(CASES))
def test_gather_every_tap(name):
    """The NumPy model behind the simulator, for every column, tap and channel slice of each case."""
    case = CASES[name]
    p = case_params(case)
    x = (RNG.standard_normal(case["shape"]) + 3).astype(case["dtype"])
    kw = p["kwargs"]
    for c0 in p["c0s"]:
        for m0 in p["columns"]:
            coords = column_start(x.shape, p["out"], m0, case["pad"], p["stride"], c0)
            for tap in taps(case["filt"]):
                offsets = tuple(t * d for t, d in zip(tap, p["dilation"]))
                got = gather(x, coords, offsets, lower=kw["pixel_box_lower_corner"],
                             upper=kw["pixel_box_upper_corner"], channels=case["channels"], pixels=case["pixels"],
                             element_strides=kw["element_strides"], nan_fill=case.get("oob_fill") == "nan")
                want = expected_column(x, p["out"], m0, case["pixels"], tap, case["pad"], p["dilation"],
                                       p["stride"], c0, case["channels"], p["fill"])
                np.testing.assert_array_equal(got, want)


def test_swizzle_128b_places_chunks():
    x = (RNG.standard_normal((1, 6, 6, 32)) + 3).astype(np.float32)
    desc = Im2colTensorMap(x, channels_per_pixel=32, pixels_per_column=16, pixel_box_lower_corner=(-1, -1),
                           pixel_box_upper_corner=(-1, -1), swizzle=Swizzle.B128)
    out = np.full((16, 32), -1.0, np.float32)
    cuda.jit(load_kernel((16, 32), alignment=1024))[1, 8](desc, (0, -1, -1, 0), (1, 2), out)
    raw = out.reshape(16, 8, 4)
    got = np.stack([raw[i, [j ^ (i % 8) for j in range(8)]] for i in range(16)]).reshape(16, 32)
    pad = np.pad(x[0], ((1, 1), (1, 1), (0, 0)))
    want = np.stack([pad[k // 6 + 1, k % 6 + 2] for k in range(16)])
    np.testing.assert_array_equal(got, want)


def test_swizzle_pads_narrow_rows():
    """16 float32 channels (64 bytes) under a 128-byte swizzle: each pixel row takes a whole span."""
    x = (RNG.standard_normal((1, 4, 4, 16)) + 3).astype(np.float32)
    desc = Im2colTensorMap(x, channels_per_pixel=16, pixels_per_column=8, swizzle="128B")
    assert desc.shared_shape == (8, 32) and desc.box_bytes == 8 * 16 * 4
    out = np.full((8, 32), -1.0, np.float32)
    cuda.jit(load_kernel((8, 32), alignment=1024))[1, 8](desc, (0, 0, 0, 0), (0, 0), out)
    chunks = out.reshape(8, 8, 4)
    for i in range(8):
        row = np.concatenate([chunks[i, j ^ (i % 8)] for j in range(4)])
        np.testing.assert_array_equal(row, x[0].reshape(16, 16)[i])


def test_nan_fill_rank3():
    x = (RNG.standard_normal((1, 8, 8)) + 3).astype(np.float32)
    desc = Im2colTensorMap(x, channels_per_pixel=8, pixels_per_column=8, pixel_box_lower_corner=-2,
                           pixel_box_upper_corner=0, oob_fill=OOBFill.NAN)
    out = np.zeros((8, 8), np.float32)
    cuda.jit(load_kernel((8, 8)))[1, 8](desc, (0, -2, 0), 0, out)  # offsets as a plain integer (rank 3)
    assert np.isnan(out[:2]).all()
    np.testing.assert_array_equal(out[2:], x[0, :6])


def _wrong_tile_kernel(desc, out):
    tile = cuda.shared.array((4, 16), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, desc.box_bytes)
        tma_load_im2col(tile, desc, (0, 0, 0, 0), (0, 0), bar)
        mbarrier_wait_parity(bar, 0)


def test_misuse_wrong_tile_size():
    x = np.zeros((1, 4, 4, 16), np.float32)
    desc = Im2colTensorMap(x, channels_per_pixel=16, pixels_per_column=8)
    with pytest.raises(SimulatedMisuse, match="occupies 512 bytes"):
        cuda.jit(_wrong_tile_kernel)[1, 1](desc, np.zeros(1, np.float32))


def test_misuse_wrong_offset_count_and_range():
    x = np.zeros((1, 4, 4, 16), np.float32)
    desc = Im2colTensorMap(x, channels_per_pixel=16, pixels_per_column=4)
    kernel = cuda.jit(load_kernel((4, 16)))
    with pytest.raises(SimulatedMisuse, match="2 offsets"):
        kernel[1, 1](desc, (0, 0, 0, 0), (0, 0, 0), np.zeros((4, 16), np.float32))
    with pytest.raises(SimulatedMisuse, match="unsigned 16-bit"):
        kernel[1, 1](desc, (0, 0, 0, 0), (0, -1), np.zeros((4, 16), np.float32))
