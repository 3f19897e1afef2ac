"""Profile attention backward (GPU machine, under ncu): one launch of numbatma's AttentionBackward (its three kernels)
and one of torch SDPA's cuDNN backward on the same bf16 problem, after warm-up, between cudaProfilerStart/Stop.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        python3 scripts/profile_attention_backward.py [--d 128] [--seq 4096] [--batch 4] [--causal] [--fa4]
            [--opt name=value]...

``--fa4``: FlashAttention-4's backward (``flash_attn.cute``, CuTe DSL, its SM90 path; carried to the device as
../shared/FACTS.md says) launched once too, on (B, S, H, D) copies of the same data. ``--opt``: an AttentionBackward
option (ints and true/false parsed).
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
ap.add_argument("--fa4", action="store_true")
ap.add_argument("--opt", action="append", default=[])
args = ap.parse_args()
options = {}
for item in args.opt:
    name, value = item.split("=", 1)
    options[name] = int(value) if value.isdigit() else {"true": True, "false": False}.get(value.lower(), value)
shape = (args.batch, args.heads, args.seq, args.d)
q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
o = torch.empty_like(q)
lse = torch.empty(shape[:3], device="cuda", dtype=torch.float32)
Attention(q, k, v, o, lse, causal=args.causal).launch()
grads = [torch.empty_like(x) for x in (q, k, v)]
plan = AttentionBackward(q, k, v, o, do, lse, *grads, causal=args.causal, **options)
print(plan, flush=True)
qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal)
fa4 = None
if args.fa4:
    from flash_attn.cute import flash_attn_func

    q4, k4, v4 = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    do4 = do.transpose(1, 2).contiguous()
    o4 = flash_attn_func(q4, k4, v4, causal=args.causal)[0]

    def fa4():
        return torch.autograd.grad(o4, (q4, k4, v4), do4, retain_graph=True)
for _ in range(3):  # warm-up (compiles, caches)
    plan.launch()
    torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
    if fa4:
        fa4()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
plan.launch()
torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
if fa4:
    fa4()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
