"""Probe (device): the grid a cluster_m=2 attention plan takes (max_active_clusters) and its time with other
grids, beside the default plan - B1 H16 S8192 D128 full, bf16. Observations, not a test."""
import torch
from numba import cuda

from numbatma import max_active_clusters
from numbatma.kernels import Attention


def ms(plan, reps=20):
    plan.launch()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        plan.launch()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[reps // 2]


b, h, s, d = 1, 16, 8192, 128
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = torch.empty_like(q)
flops = 4.0 * b * h * s * s * d
base = Attention(q, k, v, o)
print("default grid", base.grid, f"{flops / ms(base) / 1e9:.1f} TFLOP/s")
for grid in (None, 132, 128, 64):
    plan = Attention(q, k, v, o, cluster_m=2, grid=grid)
    print("cluster_m=2 grid", grid, "->", plan.grid, f"{flops / ms(plan) / 1e9:.1f} TFLOP/s", flush=True)
for opts in (dict(stages=1), dict(q_stages=1, stages=3)):
    plan = Attention(q, k, v, o, cluster_m=2, **opts)
    print("cluster_m=2", opts, plan.config, f"{flops / ms(plan) / 1e9:.1f} TFLOP/s", flush=True)
