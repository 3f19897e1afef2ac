"""Profile (GPU machine, under ncu): one launch each of torch's copy, StreamCopy, Transpose and Laplacian5
on 16384 x 16384 float32, after warm-up, between cudaProfilerStart/Stop. Run as

    ncu --clock-control none --profile-from-start off --metrics <list> python3 scripts/profile_kernels.py
"""
import torch
from numba import cuda

from numbatma.kernels import Laplacian5, StreamCopy, Transpose

n = 16384
x = torch.rand(n, n, device="cuda")
y = torch.empty_like(x)
plans = [StreamCopy(x, y), Transpose(x, y), Laplacian5(x, y)]
for p in plans:  # compile and warm up outside the profiled range
    p.launch()
y.copy_(x)
torch.cuda.synchronize()
cuda.profile_start()
y.copy_(x)
for p in plans:
    p.launch()
torch.cuda.synchronize()
cuda.profile_stop()
