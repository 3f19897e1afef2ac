"""Host time per call of numbatma's kernels against the torch op that does the same, on tiny tensors (where the host
is all that matters), in one process; ratios numbatma / torch. Targets (the host-path issue): every function form
<= 2x its torch op, ``Plan.launch`` <= 1.5x torch ``copy_``.

    python benchmarks/host_path.py [--rounds 7] [--calls 300]

Method: each case is a pair (numbatma call, torch call) on the same tensors; ``--rounds`` rounds alternate the two
(so drift in clocks or the driver hits both), each round times ``--calls`` back-to-back calls with
``time.perf_counter`` after a synchronise (the GPU queue never fills: tiny kernels finish faster than the host
issues them) and the figure is the median per-call time over the rounds, with the spread (max - min) / median.
The cyclic garbage collector is off during a round (collected before it), as ``timeit`` does: a full collection of
the process's objects (torch's included) landing in one round's calls would be charged to whichever case it hit.
The first call of each numbatma case is timed separately: compile (or load from numba's cache) + plan + launch.
Writes host_path.json / host_path.md to $OUT (or next to this file).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gemm import Timer, _git_commit, log  # noqa: E402  (Timer.host_us: the per-call host time)


def cases(torch):
    """(name, numbatma call, torch call, first-call setup) on tiny tensors."""
    from numbatma import kernels as K

    dev = "cuda"
    x = torch.randn((64, 64), device=dev)
    y = torch.empty_like(x)
    a = torch.randn((64, 64), device=dev)
    bf = torch.randn((128, 128), device=dev).bfloat16()
    cf = torch.empty_like(bf)
    q, k, v = (torch.randn((1, 1, 128, 64), device=dev).bfloat16() for _ in range(3))
    o = torch.empty_like(q)
    rows = torch.empty(64, device=dev)
    plan = K.StreamCopy(x, y)
    pool = torch.randn(4 * 8192, device=dev)  # (views 32 KiB apart: the same alignment class, so one cached plan)
    pairs = [(pool[i:i + 4096].view(64, 64), pool[i + 8192:i + 12288].view(64, 64)) for i in (0, 16384)]
    turn = [0]

    def alternating():  # (other tensors every call: the cached plan is re-pointed each time)
        turn[0] ^= 1
        return K.stream_copy(*pairs[turn[0]])

    return [
        ("StreamCopy plan.launch vs copy_", lambda: plan.launch(), lambda: y.copy_(x)),
        ("stream_copy vs copy_", lambda: K.stream_copy(x, y), lambda: y.copy_(x)),
        ("stream_copy new tensors vs copy_", alternating, lambda: y.copy_(x)),
        ("axpy vs add(alpha)", lambda: K.axpy(2.0, x, a, y), lambda: torch.add(a, x, alpha=2.0, out=y)),
        ("transpose vs t().copy_", lambda: K.transpose(x, y), lambda: y.copy_(x.t())),
        ("row_sum vs sum", lambda: K.row_sum(x, rows), lambda: torch.sum(x, -1, out=rows)),
        ("softmax vs softmax", lambda: K.softmax(x, y), lambda: torch.softmax(x, -1, out=y)),
        ("laplacian5 vs conv2d", lambda: K.laplacian5(x, y), None),
        ("gemm vs matmul", lambda: K.gemm(bf, bf, cf), lambda: torch.matmul(bf, bf, out=cf)),
        ("attention vs SDPA", lambda: K.attention(q, k, v, o),
         lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.get_device_name()
    log(f"GPU: {gpu}; torch {torch.__version__}")
    timer = Timer(torch, 1, 0)
    rows = []
    stencil = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]], device="cuda").view(1, 1, 3, 3)
    for name, ours, peer in cases(torch):
        if peer is None:  # the 5-point stencil as a torch conv2d on the same 64 x 64 tensor
            x = torch.randn((1, 1, 64, 64), device="cuda")
            peer = (lambda x=x: torch.nn.functional.conv2d(x, stencil, padding=1))
        row = {"case": name}
        try:
            t0 = time.perf_counter()
            ours()
            torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - t0
            peer()
            ours_t, peer_t = [], []
            for _ in range(args.rounds):  # interleaved rounds, without the cyclic garbage collector (as timeit)
                for fn, ts in ((ours, ours_t), (peer, peer_t)):
                    gc.collect()
                    gc.disable()
                    try:
                        ts.append(timer.host_us(fn, args.calls))
                    finally:
                        gc.enable()
            for key, ts in (("numbatma_us", ours_t), ("torch_us", peer_t)):
                med = statistics.median(ts)
                row[key] = med
                row[key.replace("_us", "_spread")] = (max(ts) - min(ts)) / med
            row["ratio"] = row["numbatma_us"] / row["torch_us"]
            log(f"{name:34s} numbatma {row['numbatma_us']:7.1f} us  torch {row['torch_us']:7.1f} us  "
                f"ratio {row['ratio']:5.2f}  (spreads {row['numbatma_spread']:.2f} / {row['torch_spread']:.2f}; "
                f"first call {row['first_call_s']:.2f} s)")
        except Exception as exc:  # noqa: BLE001 - report and go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            log(f"{name:34s} ERROR {row['error']}")
        rows.append(row)
    from numbatma.kernels import plan_cache_info

    log(f"plan cache: {plan_cache_info()}")
    payload = {"gpu": gpu, "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "commit": os.environ.get("NUMBATMA_COMMIT") or _git_commit(), "command": " ".join(sys.argv),
               "rows": rows, "plan_cache": plan_cache_info()}
    out_dir = os.environ.get("OUT") or HERE
    with open(os.path.join(out_dir, "host_path.json"), "w") as f:
        json.dump(payload, f, indent=1)
    lines = [f"GPU: {gpu}; commit {payload['commit']}; {payload['date']}; `{payload['command']}`", "",
             "| case | numbatma (us/call) | torch (us/call) | ratio | first call (s) |", "|---|---|---|---|---|"]
    for r in rows:
        if "ratio" in r:
            lines.append(f"| {r['case']} | {r['numbatma_us']:.1f} | {r['torch_us']:.1f} | **{r['ratio']:.2f}** | "
                         f"{r['first_call_s']:.2f} |")
    with open(os.path.join(out_dir, "host_path.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
