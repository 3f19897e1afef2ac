"""GPU (marker ``gpu``): NaN operands of min/max reductions - the tile reduce (cp.reduce.async.bulk.tensor, float16
and bfloat16) and the bulk reduce (cp.reduce.async.bulk, float16) - return the other operand (IEEE minNum:
``np.fmin``/``np.fmax``), as the simulator's reduce does (intrinsics/_sim.py ``reduce_elements``). Operands: NaN in
the old value only, the new only, both, neither (a quarter each)."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from numba import cuda  # noqa: E402

import numbatma  # noqa: E402
import bulk_kernels as B  # noqa: E402
import tma_ops_kernels as K  # noqa: E402
from test_gpu_tma_ops import to_device  # noqa: E402


def operands(dtype, n, rng):
    old = rng.integers(-50, 50, n).astype(np.float32)
    new = rng.integers(-50, 50, n).astype(np.float32)
    q = n // 4
    old[:q] = np.nan
    new[q:2 * q] = np.nan
    old[2 * q:3 * q] = np.nan
    new[2 * q:3 * q] = np.nan
    return old.astype(dtype), new.astype(dtype)


def expect(kind, old, new):
    o, n = old.astype(np.float32), new.astype(np.float32)
    return (np.fmin if kind == "min" else np.fmax)(o, n)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["min", "max"])
def test_tile_reduce_drops_nan(kind, dtype):
    rng = np.random.default_rng()
    shape, box = K.SHAPES[2], K.BOXES[2]
    npd = K.np_dtype(dtype)
    full = rng.integers(-50, 50, shape).astype(np.float32).astype(npd)
    old, new = operands(npd, int(np.prod(box)), rng)
    full[:box[0], :box[1]] = old.reshape(box)
    d_dst, dst_src = to_device(full, dtype)
    s = numbatma.TensorMap(to_device(new.reshape(box), dtype)[1], box)
    d = numbatma.TensorMap(dst_src, box)
    zero = cuda.to_device(np.zeros((1, 2), np.int32))
    K.reduce_kernel(kind, s.shared_shape, dtype, 2)[1, 32](s, d, zero, zero)
    got = d_dst.copy_to_host().view(npd)
    want = full.astype(np.float32)
    want[:box[0], :box[1]] = expect(kind, old, new).reshape(box)
    np.testing.assert_array_equal(got.astype(np.float32), want)  # (NaN where both were NaN: equal as NaN)


@pytest.mark.parametrize("kind", ["min", "max"])
def test_bulk_reduce_drops_nan(kind):
    old, new = operands(np.float16, B.N_RED, np.random.default_rng())
    dst = cuda.to_device(old)
    B.reduce_kernel(kind, "float16", False)[1, B.RED_THREADS](cuda.to_device(new.reshape(1, -1)), dst)
    np.testing.assert_array_equal(dst.copy_to_host().astype(np.float32), expect(kind, old, new))
