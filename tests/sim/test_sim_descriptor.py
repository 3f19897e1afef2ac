"""Under NUMBA_ENABLE_CUDASIM=1: descriptors edited in kernels (copy to shared memory, tensormap.replace,
publish to a TensorMapArray, in-place edits of a slot, prefetch) give the results NumPy predicts; the same
kernel functions and runners as the GPU tests (tests/descriptor_kernels.py)."""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    align_up,
    device_address,
    shared_tensormap,
    tensormap_replace_global_address,
    tensormap_to_shared,
)
from numbatma.intrinsics._sim import SimulatedMisuse

import descriptor_kernels as K

RNG = np.random.default_rng()


def test_grouped_retarget_through_shared_copy_and_publish():
    got, want = K.grouped_case(RNG, K.grouped_publish, publish=True)
    np.testing.assert_array_equal(got, want)


def test_grouped_retarget_in_place_in_global_memory():
    got, want = K.grouped_case(RNG, K.grouped_in_place, publish=False)
    np.testing.assert_array_equal(got, want)


def test_rebuild_every_field():
    got, want = K.rebuild_case(RNG)
    assert np.isnan(want.astype(np.float32)).any() and not np.isnan(want.astype(np.float32)).all()
    np.testing.assert_array_equal(got[1].view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(got[0].view(np.uint16), want.view(np.uint16))


def test_prefetch_then_load():
    got, want = K.prefetch_case(RNG)
    np.testing.assert_array_equal(got, want)


def test_unknown_address_is_reported():
    @cuda.jit
    def k(template, addr):
        buf = cuda.shared.array(16, np.uint64, alignment=128)
        h = tensormap_to_shared(buf, template)
        tensormap_replace_global_address(h, addr)

    template = numbatma.TensorMap(cuda.to_device(np.zeros((16, 32), np.float32)), (8, 32))
    with pytest.raises(SimulatedMisuse, match="knows no array at address"):
        k[1, 1](template, np.uint64(0x10))


def test_shared_tensormap_without_copy_is_reported():
    @cuda.jit
    def k(template):
        buf = cuda.shared.array(16, np.uint64, alignment=128)
        shared_tensormap(buf, template)

    template = numbatma.TensorMap(cuda.to_device(np.zeros((16, 32), np.float32)), (8, 32))
    with pytest.raises(SimulatedMisuse, match="no descriptor was copied"):
        k[1, 1](template)


def test_align_up_in_a_kernel_and_on_the_host():
    @cuda.jit
    def k(out):
        out[0] = align_up(out[0], 1024)
        out[1] = align_up(out[1], 128)

    out = np.array([1, 256], np.int64)
    k[1, 1](out)
    assert list(out) == [1024, 256]
    assert align_up(1025, 1024) == 2048 and align_up(0, 128) == 0


def test_device_address_is_the_array_pointer():
    a = cuda.to_device(np.zeros(8, np.float32))
    assert device_address(a) == numbatma.array_layout(a).ptr
