"""Side by side (GPU machine): FlashAttention-4's SM90 forward (``flash_attn.cute.flash_attn_func``, CuTe DSL; its
wheels carried to the device as ../shared/FACTS.md says), numbatma's Attention and torch SDPA's cuDNN backend on the
same bf16 (B, S, H, D) problem.

    python3 scripts/profile_fa4.py --mode time [--d 128] [--seq 8192] [--batch 1] [--causal]
    ncu --clock-control none --profile-from-start off --section ... python3 scripts/profile_fa4.py --mode profile

``time``: CUDA events around ``--launches`` back-to-back launches (a single synchronized launch measures FA4's and
SDPA's host time per call at short lengths: 300 us for FA4 at B4 S1024), 3 warm-ups, the three interleaved, the
median of ``--reps`` each; TFLOP/s and ratios.
``profile``: one launch of each between cudaProfilerStart/Stop (after warm-ups), for Nsight Compute.
FA4 is optional for numbatma; this script is an observation tool (docs/attention.md), not a test.
"""
import argparse
import statistics

import torch
from numba import cuda

from numbatma.kernels import Attention

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=("time", "profile"), default="time")
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--seq", type=int, default=8192)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--causal", action="store_true")
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--launches", type=int, default=10, help="launches per timed interval (host time hidden)")
ap.add_argument("--opt", action="append", default=[], help="a numbatma Attention option, name=value (ints parsed)")
args = ap.parse_args()
options = {}
for item in args.opt:
    name, value = item.split("=", 1)
    options[name] = int(value) if value.lstrip("-").isdigit() else value

from flash_attn.cute import flash_attn_func  # noqa: E402  (after argparse: --help works without FA4)

b, s, h, d = args.batch, args.seq, args.heads, args.d
q, k, v = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = torch.empty_like(q)
plan = Attention(q, k, v, o, causal=args.causal, layout="bshd", **options)
print(plan, flush=True)
flops = 4.0 * b * h * s * s * d * (0.5 if args.causal else 1.0)


def fa4():
    return flash_attn_func(q, k, v, causal=args.causal)


def ours():
    return plan.launch()


def cudnn():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                v.transpose(1, 2), is_causal=args.causal)


impls = (("fa4", fa4), ("numbatma", ours), ("cudnn", cudnn))
for _ in range(3):  # compile (FA4's JIT: seconds) and warm up outside anything measured
    for _, fn in impls:
        fn()
torch.cuda.synchronize()
ref = fa4()
ref = ref[0] if isinstance(ref, tuple) else ref
print("max |numbatma - fa4|:", float((o.float() - ref.float()).abs().max()), flush=True)

if args.mode == "profile":
    cuda.profile_start()
    for _, fn in impls:
        fn()
    torch.cuda.synchronize()
    cuda.profile_stop()
else:
    times = {name: [] for name, _ in impls}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.reps):
        for name, fn in impls:  # (launches back to back: FA4's and SDPA's host time per call would show otherwise)
            start.record()
            for _ in range(args.launches):
                fn()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / args.launches)
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in med.items():
        print(f"{name:10s} {flops / t / 1e9:7.1f} TFLOP/s  {t * 1e3:8.1f} us  /cudnn {med['cudnn'] / t:.3f}  "
              f"/fa4 {med['fa4'] / t:.3f}", flush=True)
