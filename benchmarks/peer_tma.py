"""TMA over NVLink: numbatma's StreamCopy of 1 GiB executed on device 1 with its source in device 0's memory (peer
access: ``numbatma.enable_peer_access(1, 0)``; TMA loads cross the link), with its destination there (TMA stores
cross it), and the same copy with both arrays on device 1 (local); torch's ``copy_`` from device 0 to device 1 for
reference (its peer copy). Prints a markdown table; writes peer_tma.json / peer_tma.md to $OUT (or next to this file).

    python benchmarks/peer_tma.py [--mib 1024] [--reps 20] [--warmup 3]

Method: float32 tensors of ``--mib`` MiB (a (N, 4096) matrix); each case is checked once (destination NaN-poisoned,
compared with the source), then timed ``--reps`` times between two CUDA events on device 1's current stream (the
copy plans are built once and launched with device 0 current: they run on device 1, their arrays' device), cases
interleaved rep by rep; the figure is the median. ``GB/s moved``: bytes copied / time (what crosses the link in the
peer cases); ``GB/s read + written``: twice that (how benchmarks/bandwidth.py counts a copy). Needs two GPUs with a
peer path between them (``torch.cuda.can_device_access_peer(1, 0)``); otherwise says why and exits 0.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*args):
    print(*args, flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        log(f"SKIP peer_tma: torch not importable ({exc})")
        return 0
    if torch.cuda.device_count() < 2:
        log(f"SKIP peer_tma: needs two GPUs, this process sees {torch.cuda.device_count()}")
        return 0
    if not (torch.cuda.can_device_access_peer(1, 0) and torch.cuda.can_device_access_peer(0, 1)):
        log("SKIP peer_tma: devices 0 and 1 cannot access each other's memory (no peer path)")
        return 0
    import numbatma
    from numbatma.kernels import StreamCopy

    numbatma.enable_peer_access(1, 0)  # (kernels on device 1 may read and write device 0's memory)
    cols = 4096
    rows = args.mib * (1 << 20) // (4 * cols)
    nbytes = rows * cols * 4
    torch.cuda.set_device(0)
    src0, dst0 = torch.randn(rows, cols, device="cuda:0"), torch.empty(rows, cols, device="cuda:0")
    src1, dst1 = torch.randn(rows, cols, device="cuda:1"), torch.empty(rows, cols, device="cuda:1")
    with torch.cuda.device(1):  # (arrays of two devices: the plan is the current device's, which has peer access)
        plans = {
            "local: device 1 -> device 1": (StreamCopy(src1, dst1), src1, dst1),
            "peer read: device 0 -> device 1 (TMA loads over the link)": (StreamCopy(src0, dst1), src0, dst1),
            "peer write: device 1 -> device 0 (TMA stores over the link)": (StreamCopy(src1, dst0), src1, dst0),
        }
    cases = {name: (plan.launch, src, dst) for name, (plan, src, dst) in plans.items()}
    cases["torch copy_: device 0 -> device 1"] = (lambda: dst1.copy_(src0), src0, dst1)
    for name, (plan, _, _) in plans.items():
        assert plan.device == 1, (name, plan.device)
    for name, (fn, src, dst) in cases.items():  # (checked once, each from a poisoned destination)
        dst.fill_(float("nan"))
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        fn()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        if not torch.equal(dst, src.to(dst.device)):
            log(f"FAIL peer_tma: {name} copied wrong data")
            return 1
    times = {name: [] for name in cases}
    stream = torch.cuda.current_stream(1)
    for rep in range(args.warmup + args.reps):
        for name, (fn, _, _) in cases.items():
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn()
            stop.record(stream)
            stop.synchronize()
            if rep >= args.warmup:
                times[name].append(start.elapsed_time(stop))
    rows_out = []
    for name, ms in times.items():
        med = statistics.median(ms)
        rows_out.append(dict(case=name, ms=med, spread=(max(ms) - min(ms)) / med, moved_gbs=nbytes / med / 1e6,
                             rw_gbs=2 * nbytes / med / 1e6))
    gpus = [torch.cuda.get_device_name(i) for i in (0, 1)]
    lines = [f"StreamCopy of {nbytes / (1 << 30):.2f} GiB float32 executed on device 1 ({gpus[1]}; device 0: "
             f"{gpus[0]}), median of {args.reps} runs between CUDA events:", "",
             "| copy | ms | GB/s moved | GB/s read + written | spread |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in rows_out:
        lines.append(f"| {r['case']} | {r['ms']:.3f} | {r['moved_gbs']:.0f} | {r['rw_gbs']:.0f} | "
                     f"{100 * r['spread']:.0f}% |")
    table = "\n".join(lines)
    log(table)
    out_dir = os.environ.get("OUT") or HERE
    report = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), gpus=gpus, nbytes=nbytes,
                  reps=args.reps, warmup=args.warmup, results=rows_out)
    with open(os.path.join(out_dir, "peer_tma.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out_dir, "peer_tma.md"), "w") as f:
        f.write(table + "\n")
    return 0


if __name__ == "__main__":
    t0 = time.time()
    status = main()
    log(f"(peer_tma: {time.time() - t0:.0f} s)")
    sys.exit(status)
