"""CPU: the streaming kernels (StreamCopy, Axpy) build plans, compile and link for each target, carry the
TMA instructions in SASS, and reject bad input with clear errors."""
import re

import numpy as np
import pytest
from numba import types

from numbatma import TensorMapError
from numbatma import compile as nbc
from numbatma.kernels import Axpy, StreamCopy, _launch

from fakes import FakeCudaArray


@pytest.fixture(autouse=True)
def fixed_sm_count(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 132)


def arr(shape, dtype=np.float32, strides=None, ptr=1 << 20):
    return FakeCudaArray(shape, dtype, strides=strides, ptr=ptr)


def test_other_ranks_fold_into_rows():
    plan = StreamCopy(arr((8, 512, 100)), arr((8, 512, 100), ptr=1 << 30))
    assert plan.src_map.shape == (4096, 100)
    flat = StreamCopy(arr((1 << 20,)), arr((1 << 20,), ptr=1 << 30))
    assert flat.src_map.shape == (256, 4096) and flat.tile == (16, 256) and flat.smem == 4 * 16384


def test_strided_views_keep_their_shape():
    view = arr((100, 1000), strides=(4096 * 4, 4))
    plan = StreamCopy(view, arr((100, 1000), ptr=1 << 30))
    assert plan.src_map.shape == (100, 1000) and plan.src_map.strides == (16384, 4)


@pytest.mark.parametrize("arch", nbc.ARCHS[:2])
@pytest.mark.parametrize("two_roles", [False, True])
@pytest.mark.parametrize("width", [2048, 2047])  # 2047: a tail of ordinary stores after each row's TMA part
def test_stream_copy_compiles_and_links(arch, two_roles, width):
    strides = (2048 * 4, 4)
    plan = StreamCopy(arr((2048, width), strides=strides), arr((2048, width), strides=strides, ptr=1 << 30),
                      stages=3, two_roles=two_roles)
    ptx = nbc.compile_ptx(plan.kernel.py_func, plan.args, arch)
    sass = nbc.sass(nbc.link_cubin(ptx, arch))
    assert "UTMALDG.2D" in sass and "UTMASTG.2D" in sass
    assert "cp.async.bulk.wait_group.read 1" in ptx and ".local" not in ptx
    # ordinary stores (generic or global) only for the tail
    assert bool(re.search(r"\bSTG?\.E", sass)) == (width == 2047)


@pytest.mark.parametrize("arch", nbc.ARCHS[:2])
def test_axpy_compiles_and_links(arch):
    x, y, o = arr((512, 512)), arr((512, 512), ptr=1 << 28), arr((512, 512), ptr=1 << 30)
    plan = Axpy(2.0, x, y, o)
    ptx = nbc.compile_ptx(plan.kernel.py_func, plan.args, arch)
    sass = nbc.sass(nbc.link_cubin(ptx, arch))
    assert sass.count("UTMALDG.2D") >= 2 and "UTMASTG.2D" in sass and "ELECT" in sass
    assert "bar.sync" in ptx and "fence.proxy.async.shared::cta" in ptx and ".local" not in ptx


def test_errors():
    with pytest.raises(TensorMapError, match="must match"):
        StreamCopy(arr((64, 64)), arr((64, 64), np.float64))
    with pytest.raises(TensorMapError, match="stages"):
        StreamCopy(arr((64, 64)), arr((64, 64)), stages=0)
    with pytest.raises(TensorMapError, match="float32 and float64"):
        Axpy(1.0, arr((64, 64), np.int32), arr((64, 64), np.int32), arr((64, 64), np.int32))
    with pytest.raises(TensorMapError, match="C-contiguous"):
        StreamCopy(arr((4, 4, 8), strides=(512, 128, 4)), arr((4, 4, 8)))



def test_destinations_whose_rows_end_mid_16_bytes_are_split():
    """One row of 1001 float32 (4004 bytes): TMA stores cover the first 1000 elements exactly, the last one
    gets an ordinary store (a TMA store would write 12 bytes past the array)."""
    plan = StreamCopy(arr((1001,)), arr((1001,), ptr=1 << 30))
    assert plan.out.aligned == 1000 and plan.out.tail_cols == 1 and plan.out.tma
    assert plan.dst_map.shape == (1, 1000) and plan.dst_map.store_overhang == 0
    narrow = StreamCopy(arr((64, 3), strides=(16, 4)), arr((64, 3), strides=(16, 4), ptr=1 << 30))
    assert narrow.out.aligned == 0 and not narrow.out.tma and narrow.out.tail_cols == 3
