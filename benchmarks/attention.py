"""Attention forward benchmark: numbatma's Attention against torch's scaled_dot_product_attention with the cuDNN
backend and with the flash backend (FA2), bf16, all in one process on one GPU; TFLOP/s = 4 B H S² D / time
(halved for causal), and ratios.

Run on the GPU machine:
    python benchmarks/attention.py [--quick] [--only check,seq,variants,tiles,backward] [--reps 20] [--dims 64,128,256]
        [--prewarm 14] [--backward [ARGS...]]

The backward section (``backward``, not in the default sections; ``--backward`` alone selects it) is
benchmarks/attention_backward.py - AttentionBackward against the backward of SDPA's cuDNN and flash backends, and
with its ``--step`` the forward + backward of a training step - run from here through that script's own ``main``
(one benchmark, not a copy): everything after ``--backward`` is its command line (e.g. ``--backward --step --dims
128``; ``--backward --help`` lists its options), and its JSON goes to $OUT/attention_backward.json (or next to this
file) unless those arguments name a ``--json``. With forward sections too (``--only seq,backward``) the backward runs
after them.

Shapes: batch x heads chosen so that B·H·S = 64k tokens (16 heads; batch = 65536 / (16 S), at least 1), sequence
512..16384, head dims 64/128/256, causal and not, layout (B, H, S, D). Timing with benchmarks/gemm.py's Timer
(``median_ms_interleaved``): warm-up, then ``--reps`` rounds in which every implementation of the case runs once,
each after a 256 MiB L2-evicting memset, between CUDA events; the median per implementation. (Interleaved: on long
cases the GPU's clocks drift down as it heats, which would penalise whichever implementation ran last.) Every
implementation's output is compared with torch's float32 SDPA before it is timed (FAIL printed, the run goes on).
Writes attention.json / attention.md / attention.png (TFLOP/s vs sequence length) to $OUT (or next to this file).
``tiles`` (not in the default sections): the options in TILE_VARIANTS (the last experiment's: D = 256's producer registers with the
query-first causal sweep; earlier runs: the lazy rescale, the causal sweep at short lengths, FA3's D = 128 register split and tile, CTA pairs multicasting K and V, the pipeline carried across items, the key-length thresholds of the defaults, o_buffer, q_stages, FA3's wider key blocks, the 240-register consumers, the sweep, pingpong) against the default
and cuDNN on TILE_CASES, each checked first;
``--prewarm N`` compiles every kernel of the run in N processes first (into the on-disk cache).

Targets (the issue's): head dim 128, S >= 4096: >= 0.90x cuDNN, >= 1.5x flash; head dims 64 and 256 >= 0.80x cuDNN.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gemm import Timer, _git_commit, log, rel_error  # noqa: E402  (one timing method for every benchmark)

SECTIONS = ("check", "seq", "variants")
# FlashAttention-4 (CuTe DSL, SM90 path) over cuDNN, measured on an H100 80GB HBM3 in the same process as cuDNN
# (../shared/FACTS.md; flash-attn-4 4.0.0b36): (d, seq, causal) -> FA4 / cuDNN. Not run here: the plot and the
# summary show "FA4 ref" = this ratio x this run's cuDNN, a reference line, not a measurement of this run.
FA4_OVER_CUDNN = {(128, 8192, False): 1.084, (128, 8192, True): 1.195, (128, 16384, False): 1.100,
                  (128, 16384, True): 1.130, (64, 8192, False): 1.067, (256, 8192, False): 1.090,
                  (256, 8192, True): 1.211, (128, 1024, False): 0.963, (64, 2048, False): 1.01}
# tiles: (d, causal, seq, batch) -> the options tried beside the default (edit for the next experiment; the
# results of each are in docs/attention.md and benchmarks/RESULTS.md)
TILE_CASES = [(64, False, 8192, 1), (64, False, 16384, 1), (64, False, 2048, 2), (64, False, 1024, 4),
              (64, True, 8192, 1), (128, False, 8192, 1), (128, True, 8192, 1), (256, False, 8192, 1)]
TILE_VARIANTS = {  # (part of the weights' exp2 on the FMA units: poly_exp2)
    64: [dict(poly_exp2=0.125), dict(poly_exp2=0.25), dict(poly_exp2=0.375), dict(poly_exp2=0.5)],
    128: [dict(poly_exp2=0.125), dict(poly_exp2=0.25)],
    256: [dict(poly_exp2=0.125)],
}


def _prewarm_one(job):
    """(In a worker process:) build and launch once a small plan of ``job = (d, causal, options)``: its kernel
    compiles into the on-disk cache, where the timing process finds it."""
    d, causal, options = job
    import torch

    from numbatma.kernels import Attention

    q = torch.randn((1, 2, 256, d), device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    Attention(q, q, q, torch.empty_like(q), causal=causal, **options).launch()
    torch.cuda.synchronize()
    return f"{d} {'causal' if causal else 'full'} {options}: {time.time() - t0:.1f} s"


def prewarm(jobs, processes):
    import multiprocessing

    t0 = time.time()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        for line in pool.imap_unordered(_prewarm_one, jobs):
            log(f"  prewarm {line}")
    log(f"prewarm: {len(jobs)} kernels in {time.time() - t0:.0f} s")
TOKENS = 65536
HEADS = 16


class Case:
    def __init__(self, torch, batch, heads, seq, d, causal, kv_heads=None, seq_k=None):
        self.batch, self.heads, self.seq, self.d, self.causal = batch, heads, seq, d, causal
        self.kv_heads, self.seq_k = kv_heads or heads, seq_k or seq
        gen = torch.Generator(device="cuda").manual_seed(seq * 7 + d)
        mk = lambda h, s: torch.randn((batch, h, s, d), device="cuda", dtype=torch.bfloat16, generator=gen)  # noqa: E731
        self.q, self.k, self.v = mk(heads, seq), mk(self.kv_heads, self.seq_k), mk(self.kv_heads, self.seq_k)
        self.flops = 4.0 * batch * heads * seq * self.seq_k * d * (0.5 if causal else 1.0)
        self._ref = None

    def ref(self, torch):
        if self._ref is None:
            g = self.heads // self.kv_heads
            k, v = self.k.repeat_interleave(g, 1), self.v.repeat_interleave(g, 1)
            chunks = []
            for b in range(self.batch):  # (float32 scores of one batch at a time: bounded memory)
                chunks.append(torch.nn.functional.scaled_dot_product_attention(
                    self.q[b:b + 1].float(), k[b:b + 1].float(), v[b:b + 1].float(), is_causal=self.causal))
            self._ref = torch.cat(chunks)
        return self._ref

    def label(self):
        return (f"B{self.batch} H{self.heads}/{self.kv_heads} S{self.seq}x{self.seq_k} D{self.d} "
                f"{'causal' if self.causal else 'full'}")


def torch_impl(backend_name):
    def make(torch, case, out):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)

        result = []

        def run():  # (torch allocates its output: no copy inside the timed region)
            with sdpa_kernel(backend):
                result[:] = [torch.nn.functional.scaled_dot_product_attention(
                    case.q, case.k, case.v, is_causal=case.causal, enable_gqa=case.heads != case.kv_heads)]
        return run, lambda: result[0]

    return make


def fa4_impl():
    """FlashAttention-4's forward (``flash_attn.cute``, CuTe DSL, its SM90 path; optional, ``--fa4``: its wheels
    carried as docs/gpu.md says) on (B, S, H, D) copies of the case's tensors made outside the timed region. Equal
    lengths only: its causal mask is bottom-right aligned, ours and SDPA's top-left."""
    def make(torch, case, out):
        from flash_attn.cute import flash_attn_func

        if case.seq != case.seq_k:
            raise ValueError("FA4's causal mask is bottom-right aligned: compared at equal lengths only")
        q, k, v = (x.transpose(1, 2).contiguous() for x in (case.q, case.k, case.v))
        result = []

        def run():
            result[:] = [flash_attn_func(q, k, v, causal=case.causal)[0]]
        return run, lambda: result[0].transpose(1, 2)

    return make


def numbatma_impl(**options):
    def make(torch, case, out):
        from numbatma.kernels import Attention

        plan = Attention(case.q, case.k, case.v, out, causal=case.causal, **options)
        return plan.launch, lambda: out

    return make


def run_case(torch, timer, case, impls, results, tag):
    row = {"case": case.label(), "batch": case.batch, "heads": case.heads, "seq": case.seq, "d": case.d,
           "causal": case.causal, "tag": tag}
    log(f"== {tag}: {case.label()}")
    timed = []  # (name, fn): checked first, then timed together, runs interleaved (Timer.median_ms_interleaved)
    for name, make in impls:
        try:
            out = torch.full_like(case.q, float("nan"))
            fn, output = make(torch, case, out)
            fn()
            torch.cuda.synchronize()
            err = rel_error(torch, output(), case.ref(torch))
            row[name] = {"rel_err": err, "ok": err < 2e-2}
            timed.append((name, fn))
        except Exception as exc:  # noqa: BLE001 - report and go on
            row[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            log(f"  {name:26s} SKIP {type(exc).__name__}: {str(exc)[:200]}")
    for (name, _), (ms, spread) in zip(timed, timer.median_ms_interleaved([fn for _, fn in timed])):
        r = row[name]
        r.update(ms=ms, tflops=case.flops / (ms * 1e-3) / 1e12, spread=spread)
        log(f"  {name:26s} {r['tflops']:7.1f} TFLOP/s  {ms:8.3f} ms  err {r['rel_err']:.1e}  spread {spread:.2f}"
            + ("" if r["ok"] else "  FAIL"))
    for peer in ("cudnn", "flash", "fa4"):
        if "tflops" in row.get(peer, {}):
            for name, _ in impls:
                if name.startswith("numbatma") and "tflops" in row.get(name, {}):
                    row[name][f"vs_{peer}"] = row[name]["tflops"] / row[peer]["tflops"]
    results.append(row)
    case._ref = None  # (free the float32 reference)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated sections: {', '.join(SECTIONS)} (the default), tiles, backward")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--fa4", action="store_true",
                        help="also time FlashAttention-4's forward (flash_attn.cute, where it imports) in this run")
    parser.add_argument("--seqs", default=None, help="sequence lengths (default 512..16384)")
    parser.add_argument("--prewarm", type=int, default=0, help="compile the tiles' kernels in N processes first")
    parser.add_argument("--backward", nargs=argparse.REMAINDER, default=None, metavar="ARGS",
                        help="the backward section (benchmarks/attention_backward.py) with ARGS, everything after "
                             "--backward (its own options: --backward --help lists them); alone, without --only, "
                             "it runs the backward section only")
    args = parser.parse_args()
    default = "backward" if args.backward is not None else ",".join(SECTIONS)
    sections = (args.only or default).split(",")
    unknown = set(sections) - set(SECTIONS) - {"tiles", "backward"}
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}: the sections are "
                     f"{', '.join(SECTIONS)}, tiles, backward")
    status = forward(args, sections) if set(sections) - {"backward"} else 0
    if "backward" in sections:
        backward(args.backward or [])
    return status


def backward(argv):
    """The backward section: benchmarks/attention_backward.py's ``main`` on ``argv`` (its command line; its parser
    reads ``sys.argv``, set here for the call), its JSON into $OUT (or next to this file) unless ``argv`` names one."""
    import attention_backward

    if not any(a == "--json" or a.startswith("--json=") for a in argv):
        argv = argv + ["--json", os.path.join(os.environ.get("OUT") or HERE, "attention_backward.json")]
    saved = sys.argv
    sys.argv = ["attention.py --backward"] + argv  # (argv[0]: the program name its usage line shows)
    try:
        attention_backward.main()
    finally:
        sys.argv = saved


def forward(args, sections):
    """The forward sections (all but ``backward``): run, summarised, written to $OUT; 1 if a check failed."""
    import torch

    timer = Timer(torch, args.reps, args.warmup)
    gpu = torch.cuda.get_device_name()
    log(f"GPU: {gpu}; torch {torch.__version__}")
    peers = [("cudnn", torch_impl("CUDNN_ATTENTION")), ("flash", torch_impl("FLASH_ATTENTION"))]
    if args.fa4:  # (measured in this run, beside the FACTS.md ratio the summary's "FA4 ref" column uses)
        peers.append(("fa4", fa4_impl()))
    ours = ("numbatma", numbatma_impl())
    dims = [int(x) for x in args.dims.split(",")]
    results = []

    if "tiles" in sections:  # FA3's tile shapes and register split against the default, per head dim and mask
        cases = [c for c in TILE_CASES if c[0] in dims]
        if args.prewarm:
            jobs = {(d, causal, tuple(sorted(o.items()))) for d, causal, _, _ in cases for o in [{}] + TILE_VARIANTS[d]}
            prewarm([(d, causal, dict(o)) for d, causal, o in sorted(jobs, key=str)], args.prewarm)
        for d, causal, seq, batch in cases:
            impls = [("numbatma", numbatma_impl())] + [
                ("numbatma " + " ".join(f"{k}={v}" for k, v in o.items()), numbatma_impl(**o)) for o in TILE_VARIANTS[d]]
            run_case(torch, timer, Case(torch, batch, HEADS, seq, d, causal), peers[:1] + impls, results, "tiles")

    if "check" in sections:  # ragged, GQA, different lengths: correctness against float32 SDPA, timed too
        for d in dims:
            for case in (Case(torch, 1, 8, 1000, d, True, kv_heads=2), Case(torch, 2, 4, 777, d, False, seq_k=4097)):
                run_case(torch, timer, case, [ours], results, "check")

    if "seq" in sections:
        seqs = [1024, 4096, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
        if args.seqs:
            seqs = [int(x) for x in args.seqs.split(",")]
        for d in dims:
            for causal in (False, True):
                for s in seqs:
                    batch = max(1, TOKENS // (HEADS * s))
                    run_case(torch, timer, Case(torch, batch, HEADS, s, d, causal), peers + [ours], results, "seq")

    if "variants" in sections:  # what each technique buys: D = 128 and 64, S = 8192 (and 16384 non-causal)
        variants = [("numbatma", numbatma_impl()),
                    ("numbatma serial", numbatma_impl(schedule="serial")),
                    ("numbatma overlap", numbatma_impl(schedule="overlap")),
                    ("numbatma pingpong", numbatma_impl(schedule="pingpong")),
                    ("numbatma stages=1", numbatma_impl(stages=1)),
                    ("numbatma stages=2", numbatma_impl(stages=2)),
                    ("numbatma q_stages=1", numbatma_impl(q_stages=1)),
                    ("numbatma bn=64", numbatma_impl(bn=64)),
                    ("numbatma cyclic order", numbatma_impl(order="cyclic")),
                    ("numbatma sweep=queries", numbatma_impl(sweep="queries")),
                    ("numbatma sweep=heads", numbatma_impl(sweep="heads")),
                    ("numbatma not persistent", None)]
        for seq, causal, d in ((8192, False, 128), (8192, True, 128), (16384, False, 128), (8192, False, 64),
                               (8192, True, 64)):
            case = Case(torch, 1, 16, seq, d, causal)
            items = 16 * math.ceil(seq / 128)
            variants[-1] = ("numbatma not persistent", numbatma_impl(grid=items))
            run_case(torch, timer, case, peers[:1] + variants, results, "variants")

    summary = {}
    for r in results:
        o = r.get("numbatma", {})
        if r["tag"] == "seq" and "tflops" in o:
            fa4 = FA4_OVER_CUDNN.get((r["d"], r["seq"], r["causal"]))
            summary[r["case"]] = {"numbatma": round(o["tflops"], 1),
                                  "vs_fa4_ref": round(o.get("vs_cudnn", float("nan")) / fa4, 3) if fa4 else None,
                                  "cudnn": round(r.get("cudnn", {}).get("tflops", float("nan")), 1),
                                  "flash": round(r.get("flash", {}).get("tflops", float("nan")), 1),
                                  "vs_cudnn": round(o.get("vs_cudnn", float("nan")), 3),
                                  "vs_flash": round(o.get("vs_flash", float("nan")), 3)}
    log("\n== summary (TFLOP/s)")
    log(f"{'case':40s} {'numbatma':>9s} {'cuDNN':>8s} {'flash':>8s} {'/cuDNN':>8s} {'/flash':>8s}")
    for key, v in summary.items():
        log(f"{key:40s} {v['numbatma']:9.1f} {v['cudnn']:8.1f} {v['flash']:8.1f} {v['vs_cudnn']:8.3f} "
            f"{v['vs_flash']:8.3f}")
    out_dir = os.environ.get("OUT") or HERE
    payload = {"gpu": gpu, "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "commit": os.environ.get("NUMBATMA_COMMIT") or _git_commit(), "command": " ".join(sys.argv),
               "results": results, "summary": summary}
    with open(os.path.join(out_dir, "attention.json"), "w") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.join(out_dir, "attention.md"), "w") as f:
        f.write(markdown(payload))
    plot(payload, os.path.join(out_dir, "attention.png"))
    failed = any(not v.get("ok", True) for r in results for v in r.values() if isinstance(v, dict))
    return 1 if failed else 0


def markdown(payload):
    lines = [f"GPU: {payload['gpu']}; commit {payload['commit']}; {payload['date']}; `{payload['command']}`", "",
             "| case | numbatma | cuDNN | flash | numbatma / cuDNN | numbatma / flash | numbatma / FA4 ref |",
             "|---|---|---|---|---|---|---|"]
    for key, v in payload["summary"].items():
        ref = v.get("vs_fa4_ref")
        lines.append(f"| {key} | {v['numbatma']} | {v['cudnn']} | {v['flash']} | **{v['vs_cudnn']}** | {v['vs_flash']} | "
                     f"{'' if ref is None else ref} |")
    lines += ["", "FA4 ref: FlashAttention-4's ratio to cuDNN from ../shared/FACTS.md (H100, same process as cuDNN there) "
              "times this run's cuDNN - a reference, not a measurement of this run."]
    for r in payload["results"]:
        if r["tag"] in ("variants", "check", "tiles"):
            lines += ["", f"{r['tag']}: {r['case']}", "", "| kernel | TFLOP/s | rel. error |", "|---|---|---|"]
            for name, v in r.items():
                if isinstance(v, dict) and "tflops" in v:
                    lines.append(f"| {name} | {v['tflops']:.1f} | {v['rel_err']:.1e} |")
    return "\n".join(lines) + "\n"


def plot(payload, path):
    """TFLOP/s vs sequence length, one panel per head dim and mask; skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("(no matplotlib: no plot)")
        return
    rows = [r for r in payload["results"] if r["tag"] == "seq"]
    panels = sorted({(r["d"], r["causal"]) for r in rows})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels):
        sel = sorted((r for r in rows if r["d"] == d and r["causal"] == causal), key=lambda r: r["seq"])
        for name, label in (("numbatma", "numbatma Attention"), ("cudnn", "torch SDPA cuDNN"), ("flash", "torch SDPA flash")):
            pts = [(r["seq"], r[name]["tflops"]) for r in sel if "tflops" in r.get(name, {})]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        ref = [(r["seq"], FA4_OVER_CUDNN[d, r["seq"], causal] * r["cudnn"]["tflops"]) for r in sel
               if (d, r["seq"], causal) in FA4_OVER_CUDNN and "tflops" in r.get("cudnn", {})]
        if ref:  # (FACTS.md's FA4 / cuDNN ratio x this run's cuDNN: a reference, not measured here)
            ax.plot(*zip(*ref), linestyle="none", marker="*", markersize=9, color="black",
                    label="FA4 ref (FACTS ratio x cuDNN)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"D={d} {'causal' if causal else 'full'}", fontsize=9)
        ax.set_xlabel("sequence length")
    axes[0][0].set_ylabel("TFLOP/s (bf16)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Attention forward on {payload['gpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"wrote {path}")


if __name__ == "__main__":
    t0 = time.time()
    status = main()
    log(f"(attention benchmark: {time.time() - t0:.0f} s)")
    sys.exit(status)
