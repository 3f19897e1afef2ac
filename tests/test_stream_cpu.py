"""CPU: the streaming kernels (StreamCopy, Axpy) build plans, compile and link for each target, carry the
TMA instructions in SASS, and reject bad input with clear errors."""
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
def test_stream_copy_compiles_and_links(arch, two_roles):
    plan = StreamCopy(arr((2048, 2048)), arr((2048, 2048), ptr=1 << 30), stages=3, two_roles=two_roles)
    ptx = nbc.compile_ptx(plan.kernel.py_func, (plan.src_map, plan.dst_map, types.int64, types.int64), arch)
    sass = nbc.sass(nbc.link_cubin(ptx, arch))
    assert "UTMALDG.2D" in sass and "UTMASTG.2D" in sass
    assert "cp.async.bulk.wait_group.read 1" in ptx and ".local" not in ptx


@pytest.mark.parametrize("arch", nbc.ARCHS[:2])
def test_axpy_compiles_and_links(arch):
    x, y, o = arr((512, 512)), arr((512, 512), ptr=1 << 28), arr((512, 512), ptr=1 << 30)
    plan = Axpy(2.0, x, y, o)
    sig = (types.float32, plan.x_map, plan.y_map, plan.out_map, types.int64, types.int64)
    ptx = nbc.compile_ptx(plan.kernel.py_func, sig, arch)
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
    # one row of 1001 float32 (4004 bytes): a TMA store would complete it to 4016 bytes, past the end
    with pytest.raises(TensorMapError, match="12 bytes past the end"):
        StreamCopy(arr((1001,)), arr((1001,), ptr=1 << 30))
