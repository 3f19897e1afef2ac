"""GEMM benchmark: numbatma's Gemm against cuBLAS (torch.matmul) and a Triton matmul, bf16 in, bf16 out,
float32 accumulation, all in one process on one GPU; TFLOP/s = 2 M N K / time, and ratios.

Run on the GPU machine:
    python benchmarks/gemm.py [--quick] [--only check,square,llm,variants,sweep] [--reps 20] [--sizes 1024,8192]

Timing: each implementation runs on the legacy default stream (torch's default stream too). Per case: warm-up
launches, then ``--reps`` timed launches, each preceded by a 256 MiB memset that evicts the 50-60 MB L2 (inputs
of the small shapes would otherwise be served from L2) and bracketed by two CUDA events, all enqueued before
the first is waited for (so host-side launch cost overlaps the memsets, as in triton.testing.do_bench); the
figure is the median. Inputs are fresh ``torch.randn`` data per shape (never zeros); every implementation's output is
compared with cuBLAS before it is timed (relative Frobenius error; FAIL is printed and the run goes on).

B layouts: "kn" (B given as (K, N) row-major; torch.matmul(a, b)) and "nk" (B given as (N, K), i.e. Bᵀ;
torch.matmul(a, bt.T)). The peers get the same layouts. Writes gemm.json / gemm.md to $OUT (or next to this
file).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SECTIONS = ("check", "square", "llm", "variants", "sweep")
TARGETS = {"8192^3 vs cuBLAS": 0.90, "16384^3 vs cuBLAS": 0.90, "every shape vs cuBLAS": 0.80}


def log(*args):
    print(*args, flush=True)


# -- Triton peer: a plain tiled matmul written here (autotuned over a few standard Hopper configurations) ------
def triton_matmul():
    import triton
    import triton.language as tl

    configs = [  # (few: every shape autotunes, and compiling costs device time)
        triton.Config({"BM": 128, "BN": 256, "BK": 64, "GROUP": 8}, num_stages=3, num_warps=8),
        triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_stages=4, num_warps=8),
    ]

    @triton.autotune(configs=configs, key=["M", "N", "K"])
    @triton.jit
    def matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        per_group = GROUP * tiles_n
        group = pid // per_group
        first = group * GROUP
        rows = min(tiles_m - first, GROUP)
        pm = first + (pid % per_group) % rows
        pn = (pid % per_group) // rows
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        pa = a + rm[:, None] * sam + rk[None, :] * sak
        pb = b + rk[:, None] * sbk + rn[None, :] * sbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            ta = tl.load(pa, mask=(rm[:, None] < M) & (rk[None, :] + k0 < K), other=0.0)
            tb = tl.load(pb, mask=(rk[:, None] + k0 < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(ta, tb, acc)
            pa += BK * sak
            pb += BK * sbk
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    def run(x, w, out):  # out = x @ w, w a (K, N) view (any strides)
        m, k = x.shape
        n = w.shape[1]
        grid = lambda meta: (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)  # noqa: E731
        matmul_kernel[grid](x, w, out, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                            out.stride(0), out.stride(1))

    return run


# -- timing --------------------------------------------------------------------------------------------------------
class Timer:
    def __init__(self, torch, reps, warmup, flush=True):
        """``flush``: evict L2 (a 256 MiB memset) before each timed run; False for runs meant to start from whatever
        the previous one left (a replayed CUDA graph timed back to back)."""
        self.torch, self.reps, self.warmup = torch, reps, warmup
        self.flush_buffer = torch.empty(256 << 20, dtype=torch.uint8, device="cuda") if flush else None

    def median_ms(self, fn):
        """Median over ``reps`` launches of ``fn``, each after an L2-evicting memset and between two events, and the
        spread (max - min) / median. All reps are enqueued before the first is waited for, so a launch's host-side
        cost (Python argument handling) overlaps the previous memset instead of showing up as GPU idle time
        between the events. (:meth:`median_ms_interleaved` of one implementation.)"""
        return self.median_ms_interleaved([fn])[0]

    def median_ms_interleaved(self, fns):
        """:meth:`median_ms` of several implementations with their runs interleaved: rep ``r`` times each ``fn`` once
        (after its L2-evicting memset) before rep ``r + 1`` starts, so that clock or temperature drift over a long
        case (a GPU slowing down after hundreds of milliseconds of tensor-core work) hits each alike instead of the
        one timed last. Returns a list of (median ms, spread)."""
        torch = self.torch
        for fn in fns:
            for _ in range(self.warmup):
                fn()
        torch.cuda.synchronize()
        events = [[] for _ in fns]
        for _ in range(self.reps):
            for fn, ev in zip(fns, events):
                if self.flush_buffer is not None:
                    self.flush_buffer.zero_()
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                ev.append((start, stop))
        torch.cuda.synchronize()
        out = []
        for ev in events:
            times = [start.elapsed_time(stop) for start, stop in ev]
            med = statistics.median(times)
            out.append((med, (max(times) - min(times)) / med))
        return out

    def host_us(self, fn, count=20):
        """Host time of one launch (microseconds; a burst of ``count`` launches after a sync: the GPU queue
        never fills, so this is the Python + driver cost a launch adds)."""
        self.torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(count):
            fn()
        elapsed = time.perf_counter() - t0
        self.torch.cuda.synchronize()
        return elapsed / count * 1e6


def rel_error(torch, got, want):
    return (torch.linalg.norm(got.float() - want.float()) / torch.linalg.norm(want.float())).item()


class Case:
    """One shape: inputs, the cuBLAS reference, and the implementations to time."""

    def __init__(self, torch, m, n, k, layout):
        self.m, self.n, self.k, self.layout = m, n, k, layout
        gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
        self.a = torch.randn((m, k), device="cuda", dtype=torch.bfloat16, generator=gen)
        if layout == "kn":
            self.b = torch.randn((k, n), device="cuda", dtype=torch.bfloat16, generator=gen)
            self.w = self.b
        else:
            self.b = torch.randn((n, k), device="cuda", dtype=torch.bfloat16, generator=gen)
            self.w = self.b.t()
        self.ref = torch.matmul(self.a, self.w)
        self.flops = 2.0 * m * n * k


def run_case(torch, timer, case, impls, results, tag):
    row = {"m": case.m, "n": case.n, "k": case.k, "layout": case.layout, "tag": tag}
    for name, make in impls:
        try:
            out = torch.full((case.m, case.n), float("nan"), device="cuda", dtype=torch.bfloat16)
            fn = make(case, out)
            fn()
            torch.cuda.synchronize()
            err = rel_error(torch, out, case.ref)
            ok = err < 1e-2
            ms, spread = timer.median_ms(fn)
            host_us = timer.host_us(fn)
            tflops = case.flops / (ms * 1e-3) / 1e12
            row[name] = {"ms": ms, "tflops": tflops, "rel_err": err, "ok": ok, "spread": spread, "host_us": host_us}
            log(f"  {name:28s} {tflops:7.1f} TFLOP/s  {ms:8.3f} ms  err {err:.1e}  spread {spread:.2f}"
                f"  host {host_us:5.1f} us/launch" + ("" if ok else "  FAIL"))
        except Exception as exc:  # noqa: BLE001 - report and go on
            row[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            log(f"  {name:28s} SKIP {type(exc).__name__}: {str(exc)[:200]}")
    if "cublas" in row and "tflops" in row["cublas"]:
        for name, _ in impls:
            if name != "cublas" and "tflops" in row.get(name, {}):
                row[name]["vs_cublas"] = row[name]["tflops"] / row["cublas"]["tflops"]
    results.append(row)
    return row


def numbatma_impl(**options):
    from numbatma.kernels import Gemm

    def make(case, out):
        plan = Gemm(case.a, case.b, out, b_layout=case.layout, **options)
        return plan.launch

    return make


def multistage_impl(**options):
    """The multistage (not warp-specialized) comparison kernel, benchmarks/gemm_multistage.py (``Gemm``'s
    ``warp_specialized=False`` until issue 23), with ``options`` (bn, stages, group_m, grid)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gemm_multistage", os.path.join(HERE, "gemm_multistage.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def make(case, out):
        plan = module.MultistageGemm(case.a, case.b, out, b_layout=case.layout, **options)
        return plan.launch

    return make


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layout", default="nk,kn")
    parser.add_argument("--sizes", default=None, help="square sizes, e.g. 1024,8192 (default 1024..16384)")
    args = parser.parse_args()
    import torch

    sections = args.only.split(",")
    timer = Timer(torch, args.reps, args.warmup)
    gpu = torch.cuda.get_device_name()
    log(f"GPU: {gpu}; torch {torch.__version__}")
    try:
        tri = triton_matmul()
    except Exception as exc:  # noqa: BLE001
        tri = None
        log(f"Triton unavailable: {exc}")
    cublas = ("cublas", lambda case, out: (lambda: torch.matmul(case.a, case.w, out=out)))
    triton_impl = [("triton", lambda case, out: (lambda: tri(case.a, case.w, out)))] if tri else []
    ours = ("numbatma", numbatma_impl())
    results = []
    layouts = args.layout.split(",")

    if "check" in sections:
        log("== check: awkward shapes against cuBLAS")
        for m, n, k in [(1, 8, 16), (127, 136, 72), (257, 4096, 1000), (4097, 4088, 1000)]:  # (contiguous rows)
            for layout in layouts:
                log(f"{m}x{n}x{k} {layout}")
                run_case(torch, timer, Case(torch, m, n, k, layout), [cublas, ours], results, "check")

    if "square" in sections:
        sizes = [2048, 4096, 8192] if args.quick else [1024, 2048, 4096, 8192, 16384]
        if args.sizes:
            sizes = [int(x) for x in args.sizes.split(",")]
        for s in sizes:
            for layout in layouts:
                log(f"== square {s}^3 {layout}")
                run_case(torch, timer, Case(torch, s, s, s, layout), [cublas] + triton_impl + [ours], results,
                         "square")

    if "llm" in sections:
        ms = [4096] if args.quick else [4096, 16384]
        for m in ms:
            for n, k in [(4096, 4096), (14336, 4096), (4096, 14336)]:
                for layout in layouts[:1]:
                    log(f"== llm M={m} N={n} K={k} {layout}")
                    run_case(torch, timer, Case(torch, m, n, k, layout), [cublas] + triton_impl + [ours], results,
                             "llm")

    if "variants" in sections:
        log("== variants 8192^3: what each technique buys")
        variants = [("numbatma", numbatma_impl()),
                    ("numbatma cluster of 2", numbatma_impl(cluster_m=2)),
                    ("numbatma stages=1", numbatma_impl(stages=1)),
                    ("numbatma not warp-specialized", multistage_impl()),  # (benchmarks/gemm_multistage.py)
                    ("numbatma not ws, stages=1", multistage_impl(stages=1)),
                    ("numbatma bn=128", numbatma_impl(bn=128))]
        run_case(torch, timer, Case(torch, 8192, 8192, 8192, layouts[0]), [cublas] + variants, results, "variants")

    if "sweep" in sections:
        log("== sweep 8192^3")
        options = []
        for name, opts in [("bn=256 s=3", dict(stages=3)), ("bn=256 s=4 g=16", dict(group_m=16)),
                           ("bn=256 s=4 g=4", dict(group_m=4)), ("bn=128 s=6", dict(bn=128, stages=6)),
                           ("bn=192 s=4", dict(bn=192, stages=4))]:
            options.append((name, numbatma_impl(**opts)))
        for layout in layouts:
            run_case(torch, timer, Case(torch, 8192, 8192, 8192, layout), [cublas] + options, results, "sweep")

    summary = {}
    for r in results:
        ours_r = r.get("numbatma", {})
        if "vs_cublas" in ours_r and r["tag"] in ("square", "llm"):
            summary[f"{r['tag']} {r['m']}x{r['n']}x{r['k']} {r['layout']}"] = {
                "numbatma": round(ours_r["tflops"], 1), "cublas": round(r["cublas"]["tflops"], 1),
                "triton": round(r.get("triton", {}).get("tflops", float("nan")), 1),
                "vs_cublas": round(ours_r["vs_cublas"], 3)}
    log("\n== summary (TFLOP/s)")
    log(f"{'shape':34s} {'numbatma':>9s} {'cuBLAS':>9s} {'Triton':>9s} {'vs cuBLAS':>10s}")
    for key, v in summary.items():
        log(f"{key:34s} {v['numbatma']:9.1f} {v['cublas']:9.1f} {v['triton']:9.1f} {v['vs_cublas']:10.3f}")
    out_dir = os.environ.get("OUT") or HERE
    commit = os.environ.get("NUMBATMA_COMMIT") or _git_commit()
    payload = {"gpu": gpu, "date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit,
               "command": " ".join(sys.argv), "results": results, "summary": summary}
    with open(os.path.join(out_dir, "gemm.json"), "w") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.join(out_dir, "gemm.md"), "w") as f:
        f.write(markdown(payload))
    plot(payload, os.path.join(out_dir, "gemm.png"))
    failed = any(not v.get("ok", True) for r in results for v in r.values() if isinstance(v, dict))
    return 1 if failed else 0


def markdown(payload):
    """The results as Markdown tables (what benchmarks/RESULTS.md quotes)."""
    lines = [f"GPU: {payload['gpu']}; commit {payload['commit']}; {payload['date']}; `{payload['command']}`", "",
             "| section | shape (M x N x K) | B | numbatma | cuBLAS | Triton | numbatma / cuBLAS | numbatma / Triton |",
             "|---|---|---|---|---|---|---|---|"]
    for r in payload["results"]:
        if r["tag"] not in ("square", "llm") or "tflops" not in r.get("numbatma", {}):
            continue
        ours, cub, tri = (r.get(k, {}).get("tflops") for k in ("numbatma", "cublas", "triton"))
        fmt = (lambda v: f"{v:.1f}" if v else "-")
        lines.append(f"| {r['tag']} | {r['m']} x {r['n']} x {r['k']} | {r['layout']} | {fmt(ours)} | {fmt(cub)} | "
                     f"{fmt(tri)} | **{ours / cub:.3f}** | {ours / tri:.2f} |" if cub and tri else
                     f"| {r['tag']} | {r['m']} x {r['n']} x {r['k']} | {r['layout']} | {fmt(ours)} | {fmt(cub)} | "
                     f"{fmt(tri)} | - | - |")
    for r in payload["results"]:
        if r["tag"] == "variants":
            lines += ["", f"Variants at {r['m']} x {r['n']} x {r['k']} ({r['layout']}):", "",
                      "| kernel | TFLOP/s | / cuBLAS |", "|---|---|---|"]
            for name, v in r.items():
                if isinstance(v, dict) and "tflops" in v:
                    lines.append(f"| {name} | {v['tflops']:.1f} | {v.get('vs_cublas', 1.0):.3f} |")
    return "\n".join(lines) + "\n"


def plot(payload, path):
    """A bar chart of TFLOP/s per shape (numbatma, cuBLAS, Triton); skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("(no matplotlib: no plot)")
        return
    rows = [r for r in payload["results"] if r["tag"] in ("square", "llm") and "tflops" in r.get("numbatma", {})]
    if not rows:
        return
    labels = [f"{r['m']}x{r['n']}x{r['k']}\n{r['layout']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(rows)), 4.5))
    width = 0.27
    for i, (name, color) in enumerate((("numbatma", "tab:blue"), ("cublas", "tab:gray"), ("triton", "tab:orange"))):
        ax.bar([j + (i - 1) * width for j in range(len(rows))], [r.get(name, {}).get("tflops", 0) for r in rows],
               width, label={"cublas": "cuBLAS (torch.matmul)", "triton": "Triton"}.get(name, "numbatma Gemm"),
               color=color)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("TFLOP/s (bf16 in, fp32 accumulate, bf16 out)")
    ax.set_title(f"GEMM on {payload['gpu']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"wrote {path}")


def _git_commit():
    if os.environ.get("NUMBATMA_COMMIT"):  # the device machine's copy may carry no (or a stale) .git
        return os.environ["NUMBATMA_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=HERE).stdout.strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    t0 = time.time()
    status = main()
    log(f"(gemm benchmark: {time.time() - t0:.0f} s)")
    sys.exit(status)
