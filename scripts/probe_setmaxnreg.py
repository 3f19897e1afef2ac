"""Probe (GPU machine): does setmaxnreg survive numba-cuda's own build (LTO through nvJitLink, with
``max_registers``)?

Offline, a PTX-only nvJitLink link drops ``setmaxnreg`` ("ignored to maintain compatibility across
compilation units") while an LTO link with a register cap keeps it (USETMAXREG). This writes the cubin
numba-cuda loaded to $OUT (disassemble it offline) and the driver JIT log for the same PTX.
"""
import os
import sys

import numpy as np
from numba import cuda

from numbatma.intrinsics import setmaxnreg_dec, setmaxnreg_inc

out_dir = os.environ.get("OUT", ".")


def body(out):
    if cuda.threadIdx.x // 128 == 0:
        setmaxnreg_dec(40)
        out[cuda.threadIdx.x] = 1
    else:
        setmaxnreg_inc(216)
        out[cuda.threadIdx.x] = 2


kernel = cuda.jit(max_registers=128)(body)
arr = cuda.to_device(np.zeros(256, np.int32))
kernel[1, 256](arr)
cuda.synchronize()
print("numba launch result ok:", arr.copy_to_host().tolist() == [1] * 128 + [2] * 128)
(sig, overload), = kernel.overloads.items()
cubin = overload.library.get_cubin()  # the cubin numba-cuda loaded (sm_90a on an H100/H200)
with open(os.path.join(out_dir, "setmaxnreg_numba.cubin"), "wb") as f:
    f.write(cubin if isinstance(cubin, bytes) else cubin.code)

sys.exit(0)
