"""Probe: which innermost start coordinates does a TMA tile load accept on this GPU?

    python scripts/debug_oob.py ROW,COL      # one load of a 16x16 float32 box of a 20x36 array

Run each probe in its own process: a refused coordinate kills the CUDA context
(CUDA_ERROR_ILLEGAL_INSTRUCTION on an H200, driver 580, for a column offset that is not a multiple of 16 bytes).
"""
import sys

import numpy as np
from numba import cuda

import numbatma
from numbatma.intrinsics import fence_mbarrier_init, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait_parity, tma_load


@cuda.jit
def load_one_box(desc, coords, out):
    tile = cuda.shared.array((16, 16), "float32", alignment=128)
    bar = cuda.shared.array(1, "uint64")
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, desc.box_bytes)
        tma_load(tile, desc, coords, bar)
    mbarrier_wait_parity(bar, 0)
    for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
        out[i // 16, i % 16] = tile[i // 16, i % 16]


def main():
    coords = tuple(int(x) for x in sys.argv[1].split(","))
    host = np.arange(20 * 36, dtype=np.float32).reshape(20, 36)
    desc = numbatma.TensorMap(cuda.to_device(host), (16, 16))
    out = cuda.to_device(np.full((16, 16), -1.0, np.float32))
    load_one_box[1, 128](desc, coords, out)
    cuda.synchronize()
    print(coords, "accepted; first row:", out.copy_to_host()[0, :4])


if __name__ == "__main__":
    main()
