"""A chain of two numbatma plans with and without programmatic dependent launch (PDL).

Every kernel of ``numbatma.kernels`` calls ``griddepcontrol_wait`` before it touches global memory and then
``griddepcontrol_launch_dependents``; launched inside ``with numbatma.dependent_launch():`` the second kernel of a
pair may be launched and set up (barriers, descriptor prefetch) while the first one finishes. This script measures
what that saves, on the GPU, for two chains:

* ``copy -> copy``: ``StreamCopy(a, b)`` then ``StreamCopy(b, c)`` (float32, square);
* ``gemm -> softmax``: ``Gemm(A, B, C)`` (float16, M = N = K) then ``Softmax(C, S)`` over C's rows.

Each chain is repeated ``--chains`` times back to back and captured in one CUDA graph (torch.cuda.graph): the
replay's GPU time is kernel time plus the gaps between kernels, without the host in the way. The graphs with
and without PDL are replayed interleaved (``--reps`` times each, events around every replay, after a warm-up);
the median per chain is reported, with the ratio PDL / plain. The results are checked against torch after the
runs (the graphs read and write the same buffers).

    python benchmarks/pdl_chain.py [--reps 30] [--chains 50] [--out DIR]

Writes pdl_chain.json / pdl_chain.md to ``--out`` (or $OUT, or prints only).
"""
import argparse
import json
import os
import sys

import numbatma
from numbatma.kernels import Gemm, Softmax, StreamCopy

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gemm import Timer, _git_commit  # noqa: E402  (one timing method for every benchmark)


def commit():
    return os.environ.get("NUMBATMA_COMMIT") or _git_commit()


def copy_chain(torch, n):
    a = torch.randn(n, n, device="cuda")
    b = torch.full_like(a, float("nan"))
    c = torch.full_like(a, float("nan"))
    plans = [StreamCopy(a, b), StreamCopy(b, c)]

    def check():
        assert torch.equal(c, a), "copy -> copy: c != a"

    return plans, check, 2 * 2 * a.numel() * a.element_size()


def gemm_softmax_chain(torch, n):
    x = torch.randn(n, n, device="cuda", dtype=torch.float16) / 8
    w = torch.randn(n, n, device="cuda", dtype=torch.float16) / 8
    y = torch.full((n, n), float("nan"), device="cuda", dtype=torch.float16)
    s = torch.full_like(y, float("nan"))
    plans = [Gemm(x, w, y), Softmax(y, s)]

    def check():
        want = torch.softmax((x.float() @ w.float()), dim=-1)
        err = (s.float() - want).abs().max().item()
        assert err < 2e-3, f"gemm -> softmax: max error {err}"

    return plans, check, None


def capture(torch, plans, chains, dependent):
    """A CUDA graph of ``chains`` repetitions of the plans' launches, every launch after the first of the graph
    made inside numbatma.dependent_launch() when ``dependent``."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for p in plans:  # (prepare and warm outside the capture)
            p.launch(stream)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(chains):
                for j, p in enumerate(plans):
                    with numbatma.dependent_launch(dependent and (i, j) != (0, 0)):
                        p.launch(stream)
    return graph


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--chains", type=int, default=50)
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args()
    import torch

    cases = [("copy -> copy", copy_chain, n) for n in (256, 1024, 2048, 4096)]
    cases += [("gemm -> softmax", gemm_softmax_chain, n) for n in (512, 1024, 2048)]
    rows = []
    for name, make, n in cases:
        plans, check, nbytes = make(torch, n)
        graphs = [capture(torch, plans, args.chains, dep) for dep in (False, True)]
        (plain, sp_plain), (pdl, sp_pdl) = Timer(torch, args.reps, 3, flush=False).median_ms_interleaved(
            [g.replay for g in graphs])
        check()
        row = {"chain": name, "n": n, "plain_us": plain * 1e3 / args.chains, "pdl_us": pdl * 1e3 / args.chains,
               "ratio": pdl / plain, "spread_plain": sp_plain, "spread_pdl": sp_pdl}
        rows.append(row)
        print(f"{name:16s} n={n:5d}  plain {row['plain_us']:8.2f} us/chain  pdl {row['pdl_us']:8.2f} us/chain  "
              f"ratio {row['ratio']:.3f}  (spreads {sp_plain:.2f} / {sp_pdl:.2f})", flush=True)
        del graphs, plans
    gpu = torch.cuda.get_device_name()
    md = [f"GPU: {gpu}; numbatma {commit()}; {args.chains} chains per graph, median of {args.reps} interleaved "
          f"replays", "", "| chain | n | plain µs/chain | PDL µs/chain | PDL / plain |", "|---|---|---|---|---|"]
    md += [f"| {r['chain']} | {r['n']} | {r['plain_us']:.2f} | {r['pdl_us']:.2f} | **{r['ratio']:.3f}** |"
           for r in rows]
    print("\n".join(md))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "pdl_chain.json"), "w") as f:
            json.dump({"gpu": gpu, "commit": commit(), "chains": args.chains, "reps": args.reps, "rows": rows}, f,
                      indent=1)
        with open(os.path.join(args.out, "pdl_chain.md"), "w") as f:
            f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
