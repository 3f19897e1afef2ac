"""Probe (GPU): which tile-reduce coordinates the hardware accepts. Each case runs in its own process
(an illegal-instruction fault poisons the context)."""
import subprocess
import sys

import numpy as np

CASES = [((0, 0), "add", "float32"), ((3, 8), "add", "float32"), ((-4, 0), "add", "float32"),
         ((0, -8), "add", "float32"), ((16, 32), "add", "float32"), ((0, 0), "add", "uint32"),
         ((0, 0), "min", "int32"), ((0, 0), "inc", "uint32"), ((0, 0), "and", "uint64")]


def one(coords, kind, dtype):
    sys.path.insert(0, "tests")
    from numba import cuda

    import numbatma
    import tma_ops_kernels as K

    shape, box = K.SHAPES[2], K.BOXES[2]
    src = np.ones((box[0], box[1]), dtype)
    dst = np.zeros(shape, dtype)
    d_dst = cuda.to_device(dst)
    s = numbatma.TensorMap(cuda.to_device(src), box)
    d = numbatma.TensorMap(d_dst, box)
    kern = K.reduce_kernel(kind, s.shared_shape, dtype, 2, False)
    kern[1, 32](s, d, cuda.to_device(np.zeros((1, 2), np.int32)), cuda.to_device(np.array([coords], np.int32)))
    cuda.synchronize()
    out = d_dst.copy_to_host()
    print("ok, changed elements:", int((out != 0).sum()))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        c = tuple(int(x) for x in sys.argv[1].split(","))
        one(c, sys.argv[2], sys.argv[3])
    else:
        for c, k, d in CASES:
            r = subprocess.run([sys.executable, __file__, ",".join(map(str, c)), k, d], capture_output=True, text=True)
            last = (r.stdout.strip().splitlines() or [""])[-1]
            err = [ln for ln in r.stderr.splitlines() if "CUDA_ERROR" in ln or "Error" in ln][-1:] 
            print(c, k, d, "->", last if r.returncode == 0 else f"FAIL {err}")
