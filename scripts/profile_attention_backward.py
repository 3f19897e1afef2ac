"""Profile attention backward (GPU machine, under ncu): one launch of numbatma's AttentionBackward (its three kernels)
and one of torch SDPA's cuDNN backward on the same bf16 problem, after warm-up, between cudaProfilerStart/Stop.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        python3 scripts/profile_attention_backward.py [--d 128] [--seq 4096] [--batch 4] [--causal]
"""
import argparse

import torch

from numbatma.kernels import Attention, AttentionBackward

ap = argparse.ArgumentParser()
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--seq", type=int, default=4096)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--causal", action="store_true")
args = ap.parse_args()
shape = (args.batch, args.heads, args.seq, args.d)
q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
o = torch.empty_like(q)
lse = torch.empty(shape[:3], device="cuda", dtype=torch.float32)
Attention(q, k, v, o, lse, causal=args.causal).launch()
grads = [torch.empty_like(x) for x in (q, k, v)]
plan = AttentionBackward(q, k, v, o, do, lse, *grads, causal=args.causal)
print(plan, flush=True)
qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal)
for _ in range(3):  # warm-up (compiles, caches)
    plan.launch()
    torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
plan.launch()
torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
