import sys, numpy as np
from numba import cuda
import numbatma
from numbatma.intrinsics import *
variant = sys.argv[1]
host = np.arange(20*36, dtype=np.float32).reshape(20, 36)
src = cuda.to_device(host)
desc = numbatma.TensorMap(src, (16, 16))
S = (16, 16)

@cuda.jit
def full(desc, coords, out):
    tile = cuda.shared.array(S, "float32", alignment=128)
    bar = cuda.shared.array(1, "uint64")
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bar, desc.box_bytes)
        tma_load(tile, desc, coords, bar)
    mbarrier_wait_parity(bar, 0)
    for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
        out[i // 16, i % 16] = tile[i // 16, i % 16]

@cuda.jit
def const_coords(desc, coords, out):
    tile = cuda.shared.array(S, "float32", alignment=128)
    bar = cuda.shared.array(1, "uint64")
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bar, desc.box_bytes)
        tma_load(tile, desc, (0, 0), bar)
    mbarrier_wait_parity(bar, 0)
    for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
        out[i // 16, i % 16] = tile[i // 16, i % 16]

@cuda.jit
def one_thread(desc, coords, out):
    tile = cuda.shared.array(S, "float32", alignment=128)
    bar = cuda.shared.array(1, "uint64")
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, desc.box_bytes)
        tma_load(tile, desc, coords, bar)
        mbarrier_wait_parity(bar, 0)
        for i in range(256):
            out[i // 16, i % 16] = tile[i // 16, i % 16]

k = {"full": full, "const": const_coords, "one": one_thread}[variant.split("-")[0]]
threads = 32 if variant.endswith("-32") else 128
out = cuda.to_device(np.full((16, 16), -1.0, np.float32))
c = tuple(int(x) for x in sys.argv[2].split(","))
k[1, threads](desc, c, out)
cuda.synchronize()
print(variant, c, "ran", out.copy_to_host()[0, :4])
