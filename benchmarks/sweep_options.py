"""Option sweep for the ready-made kernels (GPU machine): each plan is checked against torch, then timed
like benchmarks/bandwidth.py (CUDA events around blocks of back-to-back launches, median). Prints one line
per configuration; used to choose the kernels' defaults (benchmarks/RESULTS.md).

    python benchmarks/sweep_options.py [--only softmax,transpose,stencil,rowsum]
"""
import argparse
import statistics
import sys


def timed(torch, launch, reps=5, block_ms=8.0):
    launch()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    launch()
    e.record()
    torch.cuda.synchronize()
    k = max(1, min(200, int(block_ms / max(s.elapsed_time(e), 1e-3))))
    times = []
    for _ in range(reps):
        torch.cuda._sleep(2_000_000)  # keep the GPU busy while the launches are queued
        s.record()
        for _ in range(k):
            launch()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / k)
    return statistics.median(times) * 1e-3  # seconds


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="copy,softmax,transpose,stencil,rowsum")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("SKIP sweep_options: torch not importable")
        return 0
    from numbatma.kernels import Laplacian5, RowSum, Softmax, StreamCopy, Transpose

    only = set(args.only.split(","))
    dev = "cuda"
    torch.manual_seed(0)

    def report(name, opts, plan, nbytes, ok):
        try:
            t = timed(torch, plan.launch)
            extra = ""
            try:
                extra = f"  regs/thread {plan.kernel.get_regs_per_thread()}"
                if getattr(plan, "fallback", None):
                    extra += f"  fallback: {plan.fallback}"
            except Exception:  # noqa: BLE001 - several overloads or no kernel: no register figure
                pass
            print(f"{name:10s} {str(opts):70s} {nbytes / t / 1e12:6.3f} TB/s  {'ok' if ok else 'WRONG'}{extra}",
                  flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{name:10s} {str(opts):70s} failed: {type(exc).__name__}: {exc}", flush=True)

    def run(name, make, check, nbytes, options):
        for opts in options:
            try:
                plan = make(opts)
                plan.launch()
                torch.cuda.synchronize()
                ok = check()
            except Exception as exc:  # noqa: BLE001
                print(f"{name:10s} {str(opts):70s} failed: {type(exc).__name__}: {str(exc)[:150]}", flush=True)
                continue
            report(name, opts, plan, nbytes, ok)

    n = 16384
    x = torch.rand(n, n, device=dev)
    y = torch.empty_like(x)
    if "copy" in only:
        run("copy", lambda o: StreamCopy(x, y, **o), lambda: torch.equal(x, y), 2 * x.numel() * 4, [
            {}, dict(two_roles=True), dict(two_roles=True, stages=6), dict(two_roles=True, tile_bytes=32768),
            dict(two_roles=True, ctas_per_sm=2), dict(two_roles=True, stages=8, tile_bytes=8192),
            dict(stages=8, tile_bytes=8192),
        ])
        t = timed(torch, lambda: y.copy_(x))
        print(f"copy       torch y.copy_(x){'':52s} {2 * x.numel() * 4 / t / 1e12:6.3f} TB/s", flush=True)
    if "transpose" in only:
        ref = x.t().contiguous()
        run("transpose", lambda o: Transpose(x, y, **o), lambda: torch.equal(y, ref), 2 * x.numel() * 4, [
            {}, dict(order="dst"), dict(order="dst", ctas_per_sm=2), dict(order="dst", tile=(128, 64)),
            dict(order="dst", out_stages=3), dict(order="dst", ctas_per_sm=2, stages=3),
            dict(order="dst", tile=(128, 64), ctas_per_sm=2, stages=2),
            dict(order="dst", consumer_warps=8, ctas_per_sm=2), dict(order="dst", l2_promotion=256),
        ])
        del ref
    if "stencil" in only:
        w = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]], device=dev).reshape(1, 1, 3, 3)
        torch.backends.cudnn.allow_tf32 = False
        ref = torch.nn.functional.conv2d(x[None, None], w, padding=1)[0, 0]
        run("stencil", lambda o: Laplacian5(x, y, **o), lambda: bool(torch.allclose(y, ref, atol=1e-4)),
            2 * x.numel() * 4, [
                {}, dict(walk="rows"), dict(tile=(32, 248)), dict(tile=(32, 128)), dict(l2_promotion=128),
                dict(tile=(64, 128), stages=3), dict(ctas_per_sm=1),
            ])
        del ref
    for shape in ((65536, 4096), (16384, 16384)):
        xs = torch.randn(*shape, device=dev)
        if "softmax" in only:
            out = torch.empty_like(xs)
            ref = torch.softmax(xs, -1)
            run(f"softmax{shape[1]}", lambda o: Softmax(xs, out, **o),
                lambda: bool(torch.allclose(out, ref, rtol=1e-4, atol=1e-6)), 2 * xs.numel() * 4, [
                    {}, dict(warps=4), dict(warps=16), dict(fastmath=True), dict(stages=3), dict(store_lag=1),
                    dict(mode="chunked"),
                ])
            del ref, out
        if "rowsum" in only:
            out = torch.empty(shape[0], device=dev)
            ref = xs.sum(-1)
            run(f"rowsum{shape[1]}", lambda o: RowSum(xs, out, **o),
                lambda: bool(torch.allclose(out, ref, rtol=1e-4, atol=1e-2)), xs.numel() * 4, [
                    {}, dict(stages=6), dict(warps=4), dict(stage_bytes=65536, stages=3),
                ])
            del ref, out
        del xs
    return 0


if __name__ == "__main__":
    sys.exit(main())
