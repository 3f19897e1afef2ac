"""GPU tests (marker ``gpu``): TMA im2col loads against a NumPy convolution reference on fresh random data.

For each case (NWC, NHWC, NDHWC; padding through negative corners, dilation through the offsets, stride
through the element strides, NaN fill, channel slices) every column of output pixels is loaded for every
filter tap and compared with the input pixels under that tap (zero padding, pixels past the last image and
channels past the last one read as the fill). Outputs are poisoned before every launch.
"""
import numpy as np
import pytest
from numba import cuda

from numbatma import Swizzle
from numbatma.im2col import Im2colTensorMap

from im2col_kernels import CASES, check_case, load_kernel, poison

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()


@pytest.mark.parametrize("name", sorted(CASES))
def test_im2col_columns_match_numpy(name):
    case = CASES[name]
    kernel = cuda.jit(load_kernel((case["pixels"], case["channels"]), case["dtype"]))

    def launch(desc, coords, offsets, poisoned):
        out = cuda.to_device(poisoned)
        kernel[1, 128](desc, coords, offsets, out)
        return out

    checked = check_case(case, rng, cuda.to_device, launch, lambda out: out.copy_to_host())
    assert checked >= 4


def test_box_bytes_is_the_transaction_count():
    """A load that expects desc.box_bytes completes (the kernel would hang on a wrong count)."""
    x = cuda.to_device(rng.standard_normal((1, 4, 4, 16)).astype(np.float32))
    desc = Im2colTensorMap(x, channels_per_pixel=16, pixels_per_column=24)
    assert desc.box_bytes == 24 * 16 * 4
    kernel = cuda.jit(load_kernel((24, 16)))
    out = cuda.to_device(np.full((24, 16), np.nan, np.float32))
    kernel[1, 64](desc, (0, 0, 0, 0), (0, 0), out)
    got = out.copy_to_host()
    host = x.copy_to_host()
    np.testing.assert_array_equal(got[:16], host[0].reshape(16, 16))
    np.testing.assert_array_equal(got[16:], 0)  # past the only image: fill


def test_swizzle_128b():
    """channels_per_pixel * 4 bytes = 128: each 16-byte chunk j of pixel row i lands at chunk j ^ (i % 8)."""
    x_host = (rng.standard_normal((1, 6, 6, 32)) + 3).astype(np.float32)
    x = cuda.to_device(x_host)
    desc = Im2colTensorMap(x, channels_per_pixel=32, pixels_per_column=16, pixel_box_lower_corner=(-1, -1),
                           pixel_box_upper_corner=(-1, -1), swizzle=Swizzle.B128)
    assert desc.shared_alignment == 1024
    kernel = cuda.jit(load_kernel((16, 32), alignment=1024))
    out = cuda.to_device(np.full((16, 32), poison(np.float32)))
    kernel[1, 128](desc, (0, -1, -1, 0), (1, 2), out)
    raw = out.copy_to_host().reshape(16, 8, 4)
    got = np.empty_like(raw)
    for i in range(16):
        for j in range(8):
            got[i, j] = raw[i, j ^ (i % 8)]
    want = np.zeros((16, 32), np.float32)
    pad = np.pad(x_host[0], ((1, 1), (1, 1), (0, 0)))
    for k in range(16):
        oh, ow = divmod(k, 6)
        want[k] = pad[oh + 1, ow + 2]
    np.testing.assert_array_equal(got.reshape(16, 32), want)


def test_to_bytes_encodes():
    """cuTensorMapEncodeIm2col (cuda.bindings) accepts what the Python validation accepted."""
    x = cuda.to_device(np.zeros((2, 5, 6, 16), np.float32))
    desc = Im2colTensorMap(x, channels_per_pixel=16, pixels_per_column=16, pixel_box_lower_corner=(-1, -1),
                           pixel_box_upper_corner=(-1, -1), element_strides=(1, 2, 2, 1))
    raw = desc.to_bytes()
    assert len(raw) == 128 and any(raw)
