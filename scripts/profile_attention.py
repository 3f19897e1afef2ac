"""Profile attention (GPU machine, under ncu): one launch each of numbatma's Attention (default options, or those
given) and of torch SDPA's cuDNN backend on the same bf16 problem, after warm-up, between cudaProfilerStart/Stop.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        --section ComputeWorkloadAnalysis --section InstructionStats python3 scripts/profile_attention.py \\
        [--d 128] [--seq 8192] [--batch 1] [--causal] [--opt bn=176 --opt schedule=pingpong]

(docs/attention.md, "Where the time goes", has what this showed.)
"""
import argparse

import torch
from numba import cuda

from numbatma.kernels import Attention

ap = argparse.ArgumentParser()
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--seq", type=int, default=8192)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--causal", action="store_true")
ap.add_argument("--opt", action="append", default=[], help="an Attention option, name=value (ints parsed)")
ap.add_argument("--no-cudnn", action="store_true")
args = ap.parse_args()
options = {}
for item in args.opt:
    name, value = item.split("=", 1)
    options[name] = int(value) if value.lstrip("-").isdigit() else value
q, k, v = (torch.randn((args.batch, args.heads, args.seq, args.d), device="cuda", dtype=torch.bfloat16)
           for _ in range(3))
o = torch.empty_like(q)
plan = Attention(q, k, v, o, causal=args.causal, **options)
print(plan, flush=True)


def cudnn():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal)


for _ in range(3):  # compile and warm up outside the profiled range
    plan.launch()
    if not args.no_cudnn:
        cudnn()
torch.cuda.synchronize()
cuda.profile_start()
plan.launch()
if not args.no_cudnn:
    cudnn()
torch.cuda.synchronize()
cuda.profile_stop()
