"""Probe (GPU): what the tile reduce (cp.reduce.async.bulk.tensor) and the bulk reduce (cp.reduce.async.bulk)
do with NaN operands of min/max on float16 (and bfloat16 for the tile reduce). PTX min/max without ``.NaN``
return the other operand when one is NaN (IEEE minNum: ``np.fmin``); ``np.minimum`` would propagate the NaN.
The simulator follows ``np.fmin``/``np.fmax`` for both reduces; this probe says which one the hardware does.
Prints one line per case: 'fmin' / 'minimum' / 'neither' and the element counts."""
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tests")

from numba import cuda  # noqa: E402

import numbatma  # noqa: E402
import bulk_kernels as B  # noqa: E402
import tma_ops_kernels as K  # noqa: E402
from test_gpu_reduce_nan import operands as nan_operands  # noqa: E402
from test_gpu_tma_ops import to_device  # noqa: E402  (bfloat16 travels as uint16 bits)


def operands(dtype, n):
    """old, new with NaN in old only, new only, both, neither (a quarter each): the GPU test's operands."""
    return nan_operands(dtype, n, np.random.default_rng(7))


def verdict(what, got, old, new, kind):
    got = got.astype(np.float32).ravel()
    o, n = old.astype(np.float32).ravel(), new.astype(np.float32).ravel()
    ieee = (np.fmin if kind == "min" else np.fmax)(o, n)
    prop = (np.minimum if kind == "min" else np.maximum)(o, n)
    same = lambda a: np.array_equal(got, a, equal_nan=True)  # noqa: E731
    name = "fmin/fmax (NaN dropped)" if same(ieee) else "minimum/maximum (NaN propagated)" if same(prop) else "neither"
    print(f"{what} {kind}: {name}; NaN results {int(np.isnan(got).sum())} of {got.size}")


def tile(kind, dtype):
    shape, box = K.SHAPES[2], K.BOXES[2]
    npd = K.np_dtype(dtype)
    old_full, _ = operands(npd, int(np.prod(shape)))
    old_full = old_full.reshape(shape)
    _, new = operands(npd, int(np.prod(box)))
    new = new.reshape(box)
    old_box, _ = operands(npd, int(np.prod(box)))  # the box's old values: NaN in the same quarters as new's
    old_full[:box[0], :box[1]] = old_box.reshape(box)
    d_dst, dst_src = to_device(old_full, dtype)
    s = numbatma.TensorMap(to_device(new, dtype)[1], box)
    d = numbatma.TensorMap(dst_src, box)
    zero = cuda.to_device(np.zeros((1, 2), np.int32))
    K.reduce_kernel(kind, s.shared_shape, dtype, 2)[1, 32](s, d, zero, zero)
    got = d_dst.copy_to_host().view(npd)[:box[0], :box[1]]
    verdict(f"tile reduce {dtype}", got, old_box.reshape(box), new, kind)


def bulk(kind):
    old, new = operands(np.float16, B.N_RED)
    dst = cuda.to_device(old)
    B.reduce_kernel(kind, "float16", False)[1, B.RED_THREADS](cuda.to_device(new.reshape(1, -1)), dst)
    verdict("bulk reduce float16", dst.copy_to_host(), old, new, kind)


if __name__ == "__main__":
    for kind in ("min", "max"):
        for dtype in ("float16", "bfloat16"):
            tile(kind, dtype)
        bulk(kind)
