"""Probe (GPU machine): the shared-memory layout of a swizzled TMA tile load whose inner box extent is
narrower than the swizzle span (e.g. 32-byte rows with the 64-byte swizzle).

Each case loads one box of a float32 tensor whose element (r, c) holds r * 1000 + c into a 16 KiB
shared buffer poisoned with -1, waits a bounded time, and reports: whether the transaction count of a box
(rows * inner bytes) completed the barrier, how many bytes of the buffer were written, and, per 16-byte
chunk written, which (row, first column) it holds. The rule is read off from that."""
import numpy as np
from numba import cuda

import numbatma
from numbatma.intrinsics import (fence_mbarrier_init, mbarrier_arrive_expect_tx, mbarrier_init,
                                 mbarrier_try_wait_parity, shared_view, tma_load)

CASES = [(64, (16, 8)), (128, (8, 16)), (128, (8, 8)), (128, (4, 4)), (32, (8, 4)), (64, (8, 16)), (128, (8, 32))]
WORDS = 4096
kernels = {}


def kernel_for(tile_shape):
    box = tile_shape
    if box not in kernels:
        @cuda.jit
        def probe(src, out, status):
            buf = cuda.shared.array(WORDS, np.float32, alignment=1024)
            bar = cuda.shared.array(1, np.uint64)
            for k in range(cuda.threadIdx.x, WORDS, cuda.blockDim.x):
                buf[k] = -1.0
            cuda.syncthreads()
            if cuda.threadIdx.x == 0:
                mbarrier_init(bar, 1)
                fence_mbarrier_init()
                mbarrier_arrive_expect_tx(bar, src.box_bytes)
                tma_load(shared_view(buf, 0, box), src, (0, 0), bar)
                done = False
                for _ in range(20000):
                    if mbarrier_try_wait_parity(bar, 0):
                        done = True
                        break
                status[0] = 1 if done else 0
            cuda.syncthreads()
            for k in range(cuda.threadIdx.x, WORDS, cuda.blockDim.x):
                out[k] = buf[k]

        kernels[box] = probe
    return kernels[box]


def main():
    rows, cols = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    host = (rows * 1000 + cols).astype(np.float32)
    for span, box in CASES:
        out = cuda.to_device(np.zeros(WORDS, np.float32))
        status = cuda.to_device(np.zeros(1, np.int32))
        desc = numbatma.TensorMap(cuda.to_device(host), box, swizzle=span)
        kernel_for(desc.shared_shape)[1, 128](desc, out, status)
        cuda.synchronize()
        img = out.copy_to_host()
        written = np.nonzero(img != -1.0)[0]
        extent = (written.max() + 1) * 4 if written.size else 0
        chunks = []
        for ch in range(extent // 16):
            v = img[ch * 4]
            chunks.append("--" if v == -1.0 else f"{int(v) // 1000}:{int(v) % 1000}")
        print(f"swizzle {span} box {box} ({box[1] * 4} B rows): completed={bool(status.copy_to_host()[0])} "
              f"box_bytes={desc.box_bytes} bytes written span={extent} (non-poison {written.size * 4})")
        per_line = max(1, 128 // 16)
        for i in range(0, len(chunks), per_line):
            print(f"   {i * 16:5d}: " + " ".join(f"{c:>6}" for c in chunks[i:i + per_line]))


if __name__ == "__main__":
    main()
