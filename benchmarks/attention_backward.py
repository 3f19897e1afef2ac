"""Attention backward: numbatma.kernels.AttentionBackward against torch SDPA's backward with its cuDNN and flash
backends, in the same process, bf16, 16 heads, 16k tokens (B = 16384 / S), head dims 64, 128 and 256, causal and not.

Each implementation's gradients are checked against float32 autograd first (relative max error < 2e-2), then
timed interleaved with the others (benchmarks/gemm.py's Timer: CUDA events, warm-up, median of repeats, L2
flushed). Only the backward is timed: torch's through ``torch.autograd.grad`` of a retained forward graph,
numbatma's through the plan's launch (its three kernels: the row statistics, the main kernel, dq's conversion).
TFLOP/s = 10 B H S^2 D (the backward's five products; half for causal) / time.

    python benchmarks/attention_backward.py [--dims 64,128,256] [--seqs 1024,4096,8192] [--reps 15] [--atomic]
        [--variant NAME:OPTION=VALUE[,OPTION=VALUE]]... [--step] [--json F]

``--step`` also times a training step's attention, forward + backward, against cuDNN's and flash's (the issue's
"forward + backward >= 1.05x cuDNN" target; not yet run on a GPU as of 2026-11-28).

``--fa4`` also times FlashAttention-4's backward (``flash_attn.cute.flash_attn_func``, CuTe DSL; its SM90 path
``FlashAttentionBackwardSm90`` and its pre/postprocess kernels) where the package imports - carried to the GPU machine
as ../shared/FACTS.md says; optional, never a dependency. It takes (B, S, H, D) tensors: contiguous copies of the same
data. Its host time per call is logged too (if it exceeded the GPU time, the median would include idle gaps).

``--variant`` times another AttentionBackward configuration beside the default one (e.g.
``--variant keys:dq_split=keys --variant s3:stages=3``; a configuration a head dim refuses is skipped there).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm import Timer, _git_commit, log, rel_error  # noqa: E402  (one timing method for every benchmark)

TOKENS = 16384
HEADS = 16


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--seqs", default="1024,4096,8192")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--atomic", action="store_true",
                        help="also time dq_reduce='atomic' (one red.global.add.f32 per dQ element)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:OPTION=VALUE[,OPTION=VALUE]: also time AttentionBackward with these options")
    parser.add_argument("--step", action="store_true",
                        help="also time a training step's attention: forward + backward (cuDNN's, flash's, ours; "
                             "TFLOP/s = 14 B H S^2 D, half for causal)")
    parser.add_argument("--fa4", action="store_true",
                        help="also time FlashAttention-4's backward (flash_attn.cute, where it imports)")
    args = parser.parse_args()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numbatma.kernels import Attention, AttentionBackward

    timer = Timer(torch, args.reps, args.warmup)
    log(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {_git_commit()}")
    results = []
    for d in map(int, args.dims.split(",")):
        for s in map(int, args.seqs.split(",")):
            for causal in (False, True):
                b = max(1, TOKENS // s)
                flops = 10.0 * b * HEADS * s * s * d * (0.5 if causal else 1.0)
                mk = lambda: torch.randn((b, HEADS, s, d), device="cuda", dtype=torch.bfloat16)  # noqa: E731
                q, k, v, do = mk(), mk(), mk(), mk()
                qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
                torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal).backward(do.float())
                ref = (qf.grad, kf.grad, vf.grad)
                del qf, kf, vf
                label = f"B{b} H{HEADS} S{s} D{d} {'causal' if causal else 'full'}"
                log(f"== {label}")
                row = {"case": label, "batch": b, "seq": s, "d": d, "causal": causal}
                fns = []
                for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                    try:
                        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
                        with sdpa_kernel(backend):
                            o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

                        def fn(o=o, qg=qg, kg=kg, vg=vg, do=do):
                            return torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
                        got = fn()
                        err = max(rel_error(torch, g, r) for g, r in zip(got, ref))
                        row[name] = {"rel_err": err}
                        fns.append((name, fn))
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        row[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                        log(f"  {name:10s} SKIP {type(exc).__name__}: {str(exc)[:150]}")
                if args.fa4:
                    fa4_step = _fa4_backward(torch, row, fns, q, k, v, do, ref, causal, timer)
                o = torch.empty_like(q)
                lse = torch.empty((b, HEADS, s), device="cuda", dtype=torch.float32)
                Attention(q, k, v, o, lse, causal=causal).launch()
                grads = [torch.full_like(x, float("nan")) for x in (q, k, v)]
                plan = AttentionBackward(q, k, v, o, do, lse, *grads, causal=causal)
                plan.launch()
                torch.cuda.synchronize()
                row["numbatma"] = {"rel_err": max(rel_error(torch, g, r) for g, r in zip(grads, ref))}
                fns.append(("numbatma", plan.launch))
                variants = [("atomic", {"dq_reduce": "atomic"})] if args.atomic else []
                for spec in args.variant:
                    vname, _, opts = spec.partition(":")
                    options = {}
                    for kv in filter(None, opts.split(",")):
                        key, _, value = kv.partition("=")
                        options[key] = (int(value) if value.isdigit() else
                                        {"true": True, "false": False}.get(value.lower(), value))
                    variants.append((vname, options))
                for vname, options in variants:
                    grads2 = [torch.full_like(x, float("nan")) for x in (q, k, v)]
                    try:
                        plan2 = AttentionBackward(q, k, v, o, do, lse, *grads2, causal=causal, **options)
                    except Exception as exc:  # noqa: BLE001 - a configuration this head dim refuses
                        log(f"  {vname:10s} SKIP {type(exc).__name__}: {str(exc)[:150]}")
                        continue
                    plan2.launch()
                    torch.cuda.synchronize()
                    row[vname] = {"rel_err": max(rel_error(torch, g, r) for g, r in zip(grads2, ref)),
                                  "options": options}
                    fns.append((vname, plan2.launch))
                step_flops = flops * 14.0 / 10.0
                if args.step:
                    fwd = Attention(q, k, v, o, lse, causal=causal)

                    def our_step(fwd=fwd, plan=plan):
                        fwd.launch()
                        plan.launch()
                    steps = [("numbatma+fwd", our_step)]
                    if args.fa4 and fa4_step is not None:
                        steps.append(("fa4+fwd", fa4_step))
                    for name, backend in (("cudnn+fwd", SDPBackend.CUDNN_ATTENTION),
                                          ("flash+fwd", SDPBackend.FLASH_ATTENTION)):
                        if "rel_err" not in row.get(name.split("+")[0], {}):
                            continue
                        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

                        def torch_step(qg=qg, kg=kg, vg=vg, backend=backend, do=do, causal=causal):
                            with sdpa_kernel(backend):
                                out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                            return torch.autograd.grad(out, (qg, kg, vg), do)
                        steps.append((name, torch_step))
                    for name, fn in steps:
                        row[name] = {"rel_err": row[name.split("+")[0]]["rel_err"], "flops": step_flops}
                        fns.append((name, fn))
                for (name, _), (ms, spread) in zip(fns, timer.median_ms_interleaved([f for _, f in fns])):
                    r = row[name]
                    r.update(ms=ms, tflops=r.get("flops", flops) / (ms * 1e-3) / 1e12, spread=spread)
                    log(f"  {name:10s} {r['tflops']:7.1f} TFLOP/s  {ms:8.3f} ms  err {r['rel_err']:.1e}  "
                        f"spread {spread:.2f}" + ("" if r["rel_err"] < 2e-2 else "  FAIL"))
                for peer in ("cudnn", "flash", "fa4"):
                    if "tflops" in row.get(peer, {}) and "tflops" in row["numbatma"]:
                        row["numbatma"][f"vs_{peer}"] = row["numbatma"]["tflops"] / row[peer]["tflops"]
                log("  numbatma / cuDNN %.2f, / flash %.2f" % (row["numbatma"].get("vs_cudnn", float("nan")),
                                                               row["numbatma"].get("vs_flash", float("nan")))
                    + (", / FA4 %.2f" % row["numbatma"]["vs_fa4"] if "vs_fa4" in row["numbatma"] else "")
                    + (" (FA4 / cuDNN %.2f)" % (row["fa4"]["tflops"] / row["cudnn"]["tflops"])
                       if "tflops" in row.get("fa4", {}) and "tflops" in row.get("cudnn", {}) else ""))
                if "tflops" in row.get("numbatma+fwd", {}) and "tflops" in row.get("cudnn+fwd", {}):
                    ratio = row["numbatma+fwd"]["tflops"] / row["cudnn+fwd"]["tflops"]
                    row["numbatma+fwd"]["vs_cudnn"] = ratio
                    log(f"  forward + backward: numbatma / cuDNN {ratio:.2f}"
                        + (f", FA4 / cuDNN {row['fa4+fwd']['tflops'] / row['cudnn+fwd']['tflops']:.2f}"
                           if "tflops" in row.get("fa4+fwd", {}) else ""))
                results.append(row)
                del q, k, v, do, ref, grads, fns
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)


def _fa4_backward(torch, row, fns, q, k, v, do, ref, causal, timer):
    """Add FlashAttention-4's backward to ``fns`` (checked against ``ref`` first); return its forward + backward step
    for ``--step``, or None where FA4 does not import or run (logged, the case goes on without it)."""
    try:
        from flash_attn.cute import flash_attn_func

        q4, k4, v4 = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        do4 = do.transpose(1, 2).contiguous()
        o4 = flash_attn_func(q4, k4, v4, causal=causal)[0]

        def fn():
            return torch.autograd.grad(o4, (q4, k4, v4), do4, retain_graph=True)
        got = [g.transpose(1, 2) for g in fn()]
        row["fa4"] = {"rel_err": max(rel_error(torch, g, r) for g, r in zip(got, ref)),
                      "host_us": timer.host_us(fn, count=5)}
        fns.append(("fa4", fn))
        log(f"  fa4        host {row['fa4']['host_us']:.0f} us a call")

        def step():
            out = flash_attn_func(q4, k4, v4, causal=causal)[0]
            return torch.autograd.grad(out, (q4, k4, v4), do4)
        return step
    except Exception as exc:  # noqa: BLE001 - optional peer: report and go on
        row["fa4"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        log(f"  fa4        SKIP {type(exc).__name__}: {str(exc)[:150]}")
        return None


if __name__ == "__main__":
    main()
