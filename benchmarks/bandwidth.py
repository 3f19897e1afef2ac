"""Memory-bandwidth benchmark of numbatma's ready-made kernels against torch, CuPy and a CUDA C++ TMA peer,
all in one process on one GPU, reported as TB/s (1e12 bytes/s of bytes read + written) and as ratios.

Run (on the GPU machine; ~2-3 minutes on an H200):
    python benchmarks/bandwidth.py [--quick] [--tune] [--only copy,axpy,transpose,rowsum,softmax,stencil,sweep]

Writes bandwidth.json and bandwidth.md to $OUT when it is set, else next to this file. `benchmarks/plot.py`
turns the JSON into benchmarks/bandwidth.png.

Timing: every implementation launches on the legacy default stream (stream 0, torch's default stream too).
Per case: warm-up launches, then R repetitions of a block of K back-to-back launches between two CUDA events
(K chosen so a block lasts >= --block-ms of GPU time); the figure is the median time per launch. Before each
block a GPU spin kernel (torch.cuda._sleep) keeps the stream busy while the host enqueues the K launches,
so the events time the GPU only, also for kernels shorter than their host launch cost (small sweep sizes).
Main cases use >= 1 GiB arrays (far above the 50-60 MB L2), so no L2 flush is needed; the size sweep starts at
16 MiB, where src+dst partly fit in L2 (flagged in the JSON). Each case gets fresh torch.rand/randn data and
each of our outputs is compared with torch before it is timed (FAIL is printed and the run goes on).

Exit status: 1 if a correctness check failed (or with --strict, if a target was missed), else 0. A kernel
whose import or construction fails is reported as "SKIP <name>: <reason>" and does not fail the run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MiB = 1 << 20
GiB = 1 << 30

SECTIONS = ("copy", "axpy", "transpose", "rowsum", "softmax", "stencil", "sweep")

# Issue targets (ratio name -> minimum). Everything else is reported for information.
TARGETS = {  # issue #3's targets
    "copy: ours / torch": 1.00,
    "copy: ours / datasheet": 0.90,
    "copy: ours / C++ TMA peer": 0.97,
    "copy: stages default / stages 1": 1.15,
    "axpy: ours / torch": 1.00,
    "axpy: ours / cupy": 1.00,
    "axpy: stages default / stages 1": 1.15,
    "transpose: ours / our copy": 0.95,
    "transpose: ours / torch": 1.00,
    "rowsum 65536x4096: ours / torch": 1.00,
    "rowsum 16384x16384: ours / torch": 1.00,
    "softmax 65536x4096: ours / torch": 1.00,
    "softmax 16384x16384: ours / torch": 1.00,
    "stencil: ours / our copy": 0.90,
}

# HBM bandwidth from NVIDIA datasheets, TB/s; the first key contained in the GPU name wins.
DATASHEET_TBPS = (
    ("GH200", 4.0),  # 96 GB HBM3 version
    ("H200", 4.8),
    ("H100 NVL", 3.9),
    ("H100 PCIe", 2.0),
    ("H100", 3.35),  # SXM5
    ("B200", 8.0),
)

MAIN_BYTES = GiB  # copy / axpy / transpose / stencil arrays: 16384 x 16384 float32
ROW_SHAPES = ((65536, 4096), (16384, 16384))  # row sum and softmax (--quick: the first only)
SWEEP_MIB = (16, 32, 64, 128, 256, 512, 1024, 2048)
SWEEP_MIB_QUICK = (16, 128, 1024)

MAX_SMEM = 227 * 1024  # dynamic shared memory per block on sm_90

KERNEL_NAMES = ("StreamCopy", "Axpy", "Transpose", "RowSum", "Softmax", "Laplacian5")


# -- small helpers -------------------------------------------------------------------------------------------
def _short(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def _mib(nbytes):
    return nbytes / MiB


def _square_shape(nbytes, itemsize=4):
    """2-D shape of ``nbytes`` with rows = a power of two <= sqrt(n) (16384x16384 for 1 GiB of float32)."""
    n = nbytes // itemsize
    rows = 1 << ((n.bit_length() - 1) // 2)
    return (rows, n // rows)


def _plan_attr(plan, *names):
    for n in names:
        v = getattr(plan, n, None)
        if v is not None and not callable(v):
            return v
    return None


class Run:
    """Holds the libraries, the results and the timing machinery of one benchmark run."""

    def __init__(self, args):
        import torch

        self.args = args
        self.torch = torch
        self.dev = torch.device("cuda")
        self.reps = args.reps or (3 if args.quick else 7)
        self.block_ms = args.block_ms or (5.0 if args.quick else 10.0)
        self.cases = []
        self.ratios = []
        self.skips = []
        self.fails = []
        self.sweep = {}
        self.tune = None
        self.our_copy = {}  # shape -> TB/s of our default StreamCopy
        self.kernels = {}
        self._import_kernels()
        self._import_peers()
        self._setup_spin()

    # -- imports: each kernel on its own so one broken kernel skips only itself -----------------------------
    def _import_kernels(self):
        try:
            import numbatma.kernels as mod
        except Exception as e:  # noqa: BLE001
            for name in KERNEL_NAMES:
                self.skip(name, f"import numbatma.kernels failed: {_short(e)}")
            return
        for name in KERNEL_NAMES:
            cls = getattr(mod, name, None)
            if cls is None:
                self.skip(name, "not in numbatma.kernels")
            else:
                self.kernels[name] = cls

    def _import_peers(self):
        self.cupy = None
        self.peer_cxx = None
        try:
            import cupy

            self.cupy = cupy
        except Exception as e:  # noqa: BLE001
            self.skip("cupy peers", f"import cupy failed: {_short(e)}")
        if self.cupy is not None:
            try:
                sys.path.insert(0, HERE)
                import peer_cxx

                self.peer_cxx = peer_cxx
            except Exception as e:  # noqa: BLE001
                self.skip("C++ peer", f"import peer_cxx failed: {_short(e)}")

    def skip(self, name, reason):
        print(f"SKIP {name}: {reason}")
        self.skips.append({"name": name, "reason": reason})

    def fail(self, name, reason):
        print(f"FAIL {name}: {reason}")
        self.fails.append({"name": name, "reason": reason})

    # -- timing ------------------------------------------------------------------------------------------
    def _setup_spin(self):
        """Calibrate torch.cuda._sleep (GPU spin for a number of clock cycles) in cycles per ms."""
        torch = self.torch
        self.cycles_per_ms = None
        if not hasattr(torch.cuda, "_sleep"):
            print("note: torch.cuda._sleep missing; blocks are timed without a head-start spin")
            return
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        s.record()
        torch.cuda._sleep(cycles)
        e.record()
        e.synchronize()
        self.cycles_per_ms = cycles / max(s.elapsed_time(e), 1e-3)

    def _spin(self, ms):
        if self.cycles_per_ms and ms > 0:
            self.torch.cuda._sleep(int(min(ms, 500.0) * self.cycles_per_ms))

    def _block(self, fn, k, host_s):
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._spin(1.0 + 1.5 * k * host_s * 1e3)
        start.record()
        for _ in range(k):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / k  # ms per launch

    def measure(self, fn, warmup=3):
        """Median GPU time per launch (ms) of ``fn`` run back to back, and how it was taken."""
        torch = self.torch
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        host_s = (time.perf_counter() - t0) / 3
        torch.cuda.synchronize()
        pilot = self._block(fn, 3, host_s)
        kmax = int(max(2, min(500, 0.2 / max(host_s, 1e-6))))
        k = int(min(kmax, max(2, math.ceil(self.block_ms / max(pilot, 1e-4)))))
        times = [self._block(fn, k, host_s) for _ in range(self.reps)]
        return dict(ms=statistics.median(times), all_ms=times, k=k, host_us=host_s * 1e6)

    # -- recording -----------------------------------------------------------------------------------------
    def record(self, case, impl, kind, fn, nbytes, shape, dtype="float32", check=None, options=None,
               quiet=False):
        """Time ``fn`` and store a case row; returns TB/s or None when it could not be run."""
        try:
            m = self.measure(fn)
        except Exception as e:  # noqa: BLE001
            self.fail(f"{case} / {impl}", f"timing failed: {_short(e)}")
            return None
        tbps = nbytes / (m["ms"] * 1e-3) / 1e12
        row = dict(case=case, impl=impl, kind=kind, shape=list(shape), dtype=dtype, bytes=int(nbytes),
                   time_us=m["ms"] * 1e3, time_us_all=[t * 1e3 for t in m["all_ms"]], tbps=tbps,
                   launches_per_block=m["k"], host_us_per_launch=m["host_us"], check=check,
                   options=options or {})
        self.cases.append(row)
        if not quiet:
            chk = "" if check is None else f"  [{check}]"
            print(f"  {case:<15} {impl:<44} {str(tuple(shape)):<16} {m['ms'] * 1e3:10.1f} us "
                  f"{tbps:7.3f} TB/s{chk}")
        return tbps

    def ratio(self, name, num, den, note=""):
        if num is None or den is None or den == 0:
            return None
        value = num / den
        target = TARGETS.get(name)
        met = None if target is None else bool(value >= target)
        self.ratios.append(dict(name=name, value=value, target=target, met=met, note=note))
        tgt = "" if target is None else f"  (target >= {target:.2f}: {'met' if met else 'NOT MET'})"
        print(f"  ratio {name:<40} {value:6.3f}{tgt}")
        return value

    # -- construction + checking of our kernels ------------------------------------------------------------
    def build(self, label, kernel, *args, **kw):
        cls = self.kernels.get(kernel)
        if cls is None:
            return None
        try:
            return cls(*args, **kw)
        except Exception as e:  # noqa: BLE001
            self.skip(label, f"construction failed: {_short(e)}")
            return None

    def check(self, label, plan, compare):
        """Launch ``plan`` once and run ``compare() -> (ok, note)``; returns a check string or None (broken)."""
        torch = self.torch
        try:
            plan.launch(stream=0)
            torch.cuda.synchronize()
            ok, note = compare()
        except Exception as e:  # noqa: BLE001
            self.fail(label, f"launch/check raised {_short(e)}")
            return None
        if not ok:
            self.fail(label, f"output differs from torch ({note})")
            return "FAIL " + note
        return "ok" + (f" ({note})" if note else "")

    def fill(self, *tensors):
        for t in tensors:
            t.fill_(float("nan"))  # stale results cannot pass a check

    def free(self):
        import gc

        gc.collect()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()
        if self.cupy is not None:
            try:
                self.cupy.get_default_memory_pool().free_all_blocks()
            except Exception:  # noqa: BLE001
                pass


def _close(torch, a, b, rtol, atol):
    if a.shape != b.shape:
        return False, f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    diff = (a.double() - b.double()).abs()
    bad = ~(diff <= atol + rtol * b.double().abs())
    nbad = int(bad.sum())
    return nbad == 0, (f"{nbad} elements off, max abs diff {float(diff.max()):.3g}" if nbad else "")


def _chunked_close(torch, a, b, rtol, atol, rows=2048):
    """allclose in row chunks (no full-size double temporaries)."""
    if a.shape != b.shape:
        return False, f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    a2 = a.reshape(a.shape[0], -1) if a.dim() > 1 else a.reshape(-1, 1)
    b2 = b.reshape(a2.shape)
    nbad, worst = 0, 0.0
    for i in range(0, a2.shape[0], rows):
        x, y = a2[i:i + rows].double(), b2[i:i + rows].double()
        d = (x - y).abs()
        nbad += int((~(d <= atol + rtol * y.abs())).sum())
        worst = max(worst, float(d.max()))
    return nbad == 0, (f"{nbad} elements off, max abs diff {worst:.3g}" if nbad else "")


class _no_tf32:
    """Context manager: cuDNN convolutions in true FP32 (torch allows TF32 for them by default)."""

    def __init__(self, torch):
        self.b = torch.backends.cudnn

    def __enter__(self):
        self.old = self.b.allow_tf32
        self.b.allow_tf32 = False

    def __exit__(self, *exc):
        self.b.allow_tf32 = self.old


# -- cases ---------------------------------------------------------------------------------------------------
def case_copy(run, shape, sweep=False):
    """StreamCopy default + stages=1, torch copy_, cupy.copyto, C++ TMA peer. Returns dict of TB/s."""
    torch = run.torch
    cname = "sweep copy" if sweep else "copy"
    src = torch.rand(shape, device=run.dev)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 4
    res = {}
    eq = lambda: (torch.equal(dst, src), "")  # noqa: E731
    plan = run.build("StreamCopy", "StreamCopy", src, dst)
    if plan is not None:
        run.fill(dst)
        chk = run.check("copy StreamCopy (default)", plan, eq)
        if chk is not None:
            st = _plan_attr(plan, "stages")
            opts = {k: _plan_attr(plan, k) for k in ("stages", "tile", "box", "tile_bytes", "ctas_per_sm", "grid",
                                                     "smem")}
            res["ours"] = run.record(cname, f"numbatma StreamCopy (default, stages={st})", "ours",
                                     lambda: plan.launch(stream=0), nbytes, shape, check=chk, options=opts)
            if not sweep:
                run.our_copy[tuple(shape)] = res["ours"]
    if not sweep:
        plan1 = run.build("StreamCopy stages=1", "StreamCopy", src, dst, stages=1)
        if plan1 is not None:
            run.fill(dst)
            chk = run.check("copy StreamCopy stages=1", plan1, eq)
            if chk is not None:
                res["ours_s1"] = run.record("copy", "numbatma StreamCopy stages=1", "ours",
                                            lambda: plan1.launch(stream=0), nbytes, shape, check=chk)
    res["torch"] = run.record(cname, "torch dst.copy_(src)", "peer", lambda: dst.copy_(src), nbytes, shape)
    if not sweep:
        if run.cupy is not None:
            cs, cd = run.cupy.asarray(src), run.cupy.asarray(dst)
            res["cupy"] = run.record("copy", "cupy.copyto(dst, src)", "peer",
                                     lambda: run.cupy.copyto(cd, cs), nbytes, shape)
        if run.peer_cxx is not None:
            kw = {}
            if plan is not None:  # mirror our plan's configuration where it exposes it
                for k in ("stages", "ctas_per_sm", "tile_bytes"):
                    v = _plan_attr(plan, k)
                    if isinstance(v, int) and not isinstance(v, bool):
                        kw[k] = v
                grid = _plan_attr(plan, "grid")
                if "ctas_per_sm" not in kw and isinstance(grid, int) and grid > run.sm_count:
                    kw["ctas_per_sm"] = -(-grid // run.sm_count)
                box = _plan_attr(plan, "box", "tile")
                if isinstance(box, (tuple, list)) and len(box) == 2:
                    kw["box"] = tuple(int(b) for b in box)
            cxx = None
            for attempt in ([kw, {}] if kw else [{}]):
                try:
                    cxx = run.peer_cxx.CxxStreamCopy(src, dst, **attempt)
                    break
                except Exception as e:  # noqa: BLE001
                    run.skip(f"C++ TMA copy {attempt or '(defaults)'}", f"construction failed: {_short(e)}")
            if cxx is not None:
                run.fill(dst)
                chk = run.check("copy C++ TMA peer", cxx, eq)
                if chk is not None:
                    d = cxx.describe()
                    print(f"  C++ peer descriptor passing: {cxx.desc_passing}")
                    res["cxx"] = run.record(
                        "copy", f"C++ TMA copy (stages={d['stages']}, box={tuple(d['box'])})", "peer",
                        cxx.launch, nbytes, shape, check=chk, options=d)
        ds = run.datasheet
        o = res.get("ours")
        run.ratio("copy: ours / torch", o, res.get("torch"))
        run.ratio("copy: ours / cupy", o, res.get("cupy"))
        run.ratio("copy: ours / C++ TMA peer", o, res.get("cxx"))
        run.ratio("copy: ours / datasheet", o, ds, note=f"datasheet {ds} TB/s" if ds else "")
        run.ratio("copy: stages default / stages 1", o, res.get("ours_s1"))
        run.ratio("copy: torch / datasheet", res.get("torch"), ds)
        run.ratio("copy: C++ TMA peer / torch", res.get("cxx"), res.get("torch"))
    return res


def case_axpy(run, shape):
    torch = run.torch
    a = 1.5
    x = torch.rand(shape, device=run.dev)
    y = torch.rand(shape, device=run.dev)
    out = torch.empty_like(x)
    nbytes = 3 * x.numel() * 4
    ref = torch.add(y, x, alpha=a)
    cmp = lambda: _chunked_close(torch, out, ref, 1e-5, 1e-6)  # noqa: E731
    res = {}
    for label, kw, key in (("default", {}, "ours"), ("stages=1", {"stages": 1}, "ours_s1")):
        plan = run.build(f"Axpy {label}", "Axpy", a, x, y, out, **kw)
        if plan is None:
            continue
        run.fill(out)
        chk = run.check(f"axpy Axpy {label}", plan, cmp)
        if chk is not None:
            st = _plan_attr(plan, "stages")
            name = f"numbatma Axpy (default, stages={st})" if not kw else f"numbatma Axpy ({label})"
            res[key] = run.record("axpy", name, "ours",
                                  lambda p=plan: p.launch(stream=0), nbytes, shape, check=chk)
    res["torch"] = run.record("axpy", "torch.add(y, x, alpha=a, out=out)", "peer",
                              lambda: torch.add(y, x, alpha=a, out=out), nbytes, shape)
    if run.cupy is not None:
        cp = run.cupy
        try:
            k = cp.ElementwiseKernel("T a, T x, T y", "T z", "z = a * x + y", "numbatma_peer_axpy")
            cx, cy, co = cp.asarray(x), cp.asarray(y), cp.asarray(out)
            af = cp.float32(a)
            res["cupy"] = run.record("axpy", "cupy ElementwiseKernel z = a*x + y", "peer",
                                     lambda: k(af, cx, cy, co), nbytes, shape)
        except Exception as e:  # noqa: BLE001
            run.skip("cupy axpy", _short(e))
    o = res.get("ours")
    run.ratio("axpy: ours / torch", o, res.get("torch"))
    run.ratio("axpy: ours / cupy", o, res.get("cupy"))
    run.ratio("axpy: ours / datasheet", o, run.datasheet)
    run.ratio("axpy: stages default / stages 1", o, res.get("ours_s1"))
    return res


def ensure_our_copy(run, shape):
    """Our default StreamCopy on ``shape`` (measured now if the copy case did not run on it)."""
    key = tuple(shape)
    if key not in run.our_copy and "StreamCopy" in run.kernels:
        _measure_our_copy(run, shape, key)
        run.free()
    return run.our_copy.get(key)


def _measure_our_copy(run, shape, key):
    torch = run.torch
    src = torch.rand(shape, device=run.dev)
    dst = torch.empty_like(src)
    plan = run.build("StreamCopy", "StreamCopy", src, dst)
    if plan is not None:
        chk = run.check("copy StreamCopy (default)", plan, lambda: (torch.equal(dst, src), ""))
        if chk is not None:
            run.our_copy[key] = run.record("copy", "numbatma StreamCopy (default, reference)", "ours",
                                           lambda: plan.launch(stream=0), 2 * src.numel() * 4, shape,
                                           check=chk)


def case_transpose(run, shape, sweep=False):
    torch = run.torch
    cname = "sweep transpose" if sweep else "transpose"
    src = torch.rand(shape, device=run.dev)
    dst = torch.empty((shape[1], shape[0]), device=run.dev)
    nbytes = 2 * src.numel() * 4
    res = {}
    plan = run.build("Transpose", "Transpose", src, dst)
    if plan is not None:
        run.fill(dst)
        chk = run.check("transpose Transpose", plan, lambda: (torch.equal(dst, src.t()), ""))
        if chk is not None:
            res["ours"] = run.record(cname, "numbatma Transpose", "ours", lambda: plan.launch(stream=0),
                                     nbytes, shape, check=chk)
    res["torch"] = run.record(cname, "torch dst.copy_(src.t())", "peer", lambda: dst.copy_(src.t()),
                              nbytes, shape)
    if not sweep:
        run.ratio("transpose: ours / our copy", res.get("ours"), ensure_our_copy(run, shape))
        run.ratio("transpose: ours / torch", res.get("ours"), res.get("torch"))
    return res


def case_rowsum(run, shape):
    torch = run.torch
    x = torch.rand(shape, device=run.dev)
    out = torch.empty(shape[0], device=run.dev)
    nbytes = (x.numel() + shape[0]) * 4
    tag = f"{shape[0]}x{shape[1]}"
    res = {}
    ref = x.sum(dim=-1)
    plan = run.build(f"RowSum {tag}", "RowSum", x, out)
    if plan is not None:
        run.fill(out)
        chk = run.check(f"rowsum RowSum {tag}", plan, lambda: _close(torch, out, ref, 1e-4, 1e-3))
        if chk is not None:
            res["ours"] = run.record("rowsum", "numbatma RowSum", "ours", lambda: plan.launch(stream=0), nbytes,
                                     shape, check=chk)
    res["torch"] = run.record("rowsum", "torch.sum(x, dim=-1, out=out)", "peer",
                              lambda: torch.sum(x, dim=-1, out=out), nbytes, shape)
    run.ratio(f"rowsum {tag}: ours / torch", res.get("ours"), res.get("torch"))
    return res


def case_softmax(run, shape):
    torch = run.torch
    x = torch.randn(shape, device=run.dev)
    out = torch.empty_like(x)
    nbytes = 2 * x.numel() * 4
    tag = f"{shape[0]}x{shape[1]}"
    res = {}
    ref = torch.softmax(x, dim=-1)
    plan = run.build(f"Softmax {tag}", "Softmax", x, out)
    if plan is not None:
        run.fill(out)
        chk = run.check(f"softmax Softmax {tag}", plan, lambda: _chunked_close(torch, out, ref, 1e-4, 1e-7))
        if chk is not None:
            res["ours"] = run.record("softmax", "numbatma Softmax", "ours", lambda: plan.launch(stream=0),
                                     nbytes, shape, check=chk)
    try:
        torch.softmax(x, -1, out=out)
        fn, label = (lambda: torch.softmax(x, -1, out=out)), "torch.softmax(x, -1, out=out)"
    except Exception:  # noqa: BLE001 - no out= overload: allocates (cheap with the caching allocator)
        fn, label = (lambda: torch.softmax(x, -1)), "torch.softmax(x, -1)"
    res["torch"] = run.record("softmax", label, "peer", fn, nbytes, shape)
    run.ratio(f"softmax {tag}: ours / torch", res.get("ours"), res.get("torch"))
    return res


def case_stencil(run, shape):
    torch = run.torch
    import torch.nn.functional as F

    src = torch.rand(shape, device=run.dev)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 4
    w = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]], device=run.dev).view(1, 1, 3, 3)
    conv = lambda: F.conv2d(src.view(1, 1, *shape), w, padding=1)  # noqa: E731
    res = {}
    plan = run.build("Laplacian5", "Laplacian5", src, dst)
    if plan is not None:
        with _no_tf32(torch):
            ref = conv()[0, 0]

        def cmp():
            ok, note = _chunked_close(torch, dst, ref, 1e-5, 1e-5)
            if ok:
                return True, ""
            ok_in, note_in = _chunked_close(torch, dst[1:-1, 1:-1], ref[1:-1, 1:-1], 1e-5, 1e-5)
            if ok_in:  # "zero boundary" may mean boundary outputs are 0 rather than zero padding
                edge = torch.cat([dst[0], dst[-1], dst[:, 0], dst[:, -1]])
                return True, ("interior matches conv2d; boundary outputs are zero" if not edge.abs().any()
                              else "interior matches conv2d; boundary differs from zero padding")
            return False, note_in

        run.fill(dst)
        chk = run.check("stencil Laplacian5", plan, cmp)
        if chk is not None:
            res["ours"] = run.record("stencil", "numbatma Laplacian5", "ours", lambda: plan.launch(stream=0),
                                     nbytes, shape, check=chk)
    with _no_tf32(torch):  # an FP32 reference, like ours
        res["torch"] = run.record("stencil", "torch conv2d 3x3 Laplacian (padding=1, fp32, no TF32)", "peer",
                                  conv, nbytes, shape)
    run.ratio("stencil: ours / our copy", res.get("ours"), ensure_our_copy(run, shape))
    run.ratio("stencil: ours / torch conv2d", res.get("ours"), res.get("torch"))
    return res


def case_sweep(run, sizes_mib):
    l2 = run.l2_bytes
    out = {"copy": {"ours": [], "torch": []}, "transpose": {"ours": [], "torch": []}}
    for mib in sizes_mib:
        nbytes = mib * MiB
        shape = _square_shape(nbytes)
        for name, fn in (("copy", case_copy), ("transpose", case_transpose)):
            r = fn(run, shape, sweep=True)
            for impl in ("ours", "torch"):
                if r.get(impl) is not None:
                    out[name][impl].append(dict(size_mib=mib, array_bytes=nbytes, shape=list(shape),
                                                tbps=r[impl], l2_resident=bool(l2 and 2 * nbytes <= l2)))
            run.free()
    run.sweep = out
    return out


def _tune_copy(run, shape, combos, rows):
    torch = run.torch
    src = torch.rand(shape, device=run.dev)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 4
    eq = lambda: (torch.equal(dst, src), "")  # noqa: E731
    print("tune: StreamCopy / C++ peer (stages, tile_bytes, ctas_per_sm, l2_promotion)")
    for s, t, c, l2 in combos:
        opts = dict(stages=s, tile_bytes=t, ctas_per_sm=c)
        if l2:
            opts["l2_promotion"] = l2
        plan = run.build(f"tune StreamCopy {opts}", "StreamCopy", src, dst, **opts)
        if plan is not None:
            run.fill(dst)
            chk = run.check(f"tune StreamCopy {opts}", plan, eq)
            if chk is not None:
                v = run.record("tune", f"StreamCopy s={s} t={t // 1024}K c={c} l2={l2}", "ours",
                               lambda p=plan: p.launch(stream=0), nbytes, shape, check=chk, options=opts)
                rows.append(dict(kernel="StreamCopy", options=opts, tbps=v))
        if run.peer_cxx is not None and not l2:
            try:
                cxx = run.peer_cxx.CxxStreamCopy(src, dst, stages=s, ctas_per_sm=c, tile_bytes=t)
            except Exception as e:  # noqa: BLE001
                print(f"  (C++ peer {opts}: {_short(e)})")
                cxx = None
            if cxx is not None:
                run.fill(dst)
                chk = run.check(f"tune C++ peer {opts}", cxx, eq)
                if chk is not None:
                    v = run.record("tune", f"C++ TMA copy s={s} t={t // 1024}K c={c}", "peer", cxx.launch,
                                   nbytes, shape, check=chk, options=cxx.describe())
                    rows.append(dict(kernel="C++ TMA copy", options=opts, tbps=v))


def _tune_axpy(run, shape, combos, rows):
    torch = run.torch
    x = torch.rand(shape, device=run.dev)
    y = torch.rand(shape, device=run.dev)
    out = torch.empty_like(x)
    ref = torch.add(y, x, alpha=1.5)
    cmp = lambda: _chunked_close(torch, out, ref, 1e-5, 1e-6)  # noqa: E731
    print("tune: Axpy")
    tried = set()
    for s, t, c, l2 in combos:
        opts = dict(stages=s, tile_bytes=t, ctas_per_sm=c)
        if l2:
            opts["l2_promotion"] = l2
        cls = run.kernels.get("Axpy")
        if cls is None:
            break
        try:
            plan = cls(1.5, x, y, out, **opts)
        except TypeError:  # Axpy may take only stages
            opts = dict(stages=s)
            if s in tried:
                continue
            plan = run.build(f"tune Axpy {opts}", "Axpy", 1.5, x, y, out, **opts)
        except Exception as e:  # noqa: BLE001
            run.skip(f"tune Axpy {opts}", f"construction failed: {_short(e)}")
            plan = None
        tried.add(s)
        if plan is None:
            continue
        run.fill(out)
        chk = run.check(f"tune Axpy {opts}", plan, cmp)
        if chk is not None:
            v = run.record("tune", "Axpy " + " ".join(f"{k}={v}" for k, v in opts.items()), "ours",
                           lambda p=plan: p.launch(stream=0), 3 * x.numel() * 4, shape, check=chk, options=opts)
            rows.append(dict(kernel="Axpy", options=opts, tbps=v))


def case_tune(run, shape):
    """Try StreamCopy / Axpy / C++ peer options; print the best of each."""
    k = 1024
    # (stages, tile_bytes, ctas_per_sm, l2_promotion): configurations that fit 227 KiB per SM
    copy_combos = [(4, 32 * k, 1, 0), (4, 32 * k, 1, 256), (2, 64 * k, 1, 0), (2, 64 * k, 1, 256),
                   (3, 64 * k, 1, 0), (4, 16 * k, 1, 0), (4, 16 * k, 1, 256), (3, 32 * k, 2, 0),
                   (3, 32 * k, 2, 256), (6, 16 * k, 2, 0), (6, 32 * k, 1, 256)]
    axpy_combos = [(3, 32 * k, 1, 0), (3, 16 * k, 2, 0), (3, 16 * k, 2, 256), (4, 16 * k, 1, 0),
                   (4, 16 * k, 1, 256), (2, 16 * k, 2, 0), (3, 32 * k, 1, 256), (6, 8 * k, 2, 0)]
    rows = []
    _tune_copy(run, shape, copy_combos, rows)
    run.free()
    _tune_axpy(run, shape, axpy_combos, rows)
    run.free()
    best = {}
    for r in rows:
        if r["tbps"] is not None and (r["kernel"] not in best or r["tbps"] > best[r["kernel"]]["tbps"]):
            best[r["kernel"]] = r
    for k, r in best.items():
        print(f"tune best {k}: {r['options']} -> {r['tbps']:.3f} TB/s")
    run.tune = dict(shape=list(shape), results=rows, best=best)
    return run.tune


# -- environment, JSON, markdown -------------------------------------------------------------------------------
def _versions():
    import importlib

    v = {"python": platform.python_version()}
    for mod, attr in (("torch", "__version__"), ("cupy", "__version__"), ("numba", "__version__"),
                      ("numba_cuda", "__version__"), ("cuda.core", "__version__"), ("cuda.bindings", "__version__"),
                      ("numpy", "__version__"), ("numbatma", "__version__")):
        try:
            v[mod] = str(getattr(importlib.import_module(mod), attr))
        except Exception:  # noqa: BLE001
            v[mod] = None
    try:
        import torch

        v["torch_cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        pass
    try:
        import cupy

        v["cupy_nvrtc"] = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
    except Exception:  # noqa: BLE001
        pass
    return v


def _nvidia_smi():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        outp = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total,clocks.max.memory",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout
        name, driver, mem, mclk = [s.strip() for s in outp.splitlines()[0].split(",")]
        return dict(name=name, driver=driver, memory=mem, max_memory_clock=mclk)
    except Exception:  # noqa: BLE001
        return {}


def _git_commit():
    if os.environ.get("NUMBATMA_COMMIT"):  # the device machine's copy may carry no (or a stale) .git
        return os.environ["NUMBATMA_COMMIT"]
    try:
        r = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=10)
        if r.returncode == 0:
            dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return r.stdout.strip() + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        pass
    return None


def _meta(run, args):
    torch = run.torch
    props = torch.cuda.get_device_properties(0)
    smi = _nvidia_smi()
    name = torch.cuda.get_device_name(0)
    return dict(
        gpu=name, driver=smi.get("driver"), gpu_memory=smi.get("memory"), max_memory_clock=smi.get("max_memory_clock"),
        sm_count=props.multi_processor_count, compute_capability=f"{props.major}.{props.minor}",
        l2_bytes=run.l2_bytes, datasheet_tbps=run.datasheet, versions=_versions(), numbatma_commit=_git_commit(),
        command=" ".join(["python", os.path.relpath(os.path.abspath(sys.argv[0]), REPO)
                          if os.path.abspath(sys.argv[0]).startswith(REPO) else sys.argv[0]] + sys.argv[1:]),
        argv=[sys.executable] + sys.argv, cwd=os.getcwd(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        quick=bool(args.quick), reps=run.reps, block_ms=run.block_ms, spin_cycles_per_ms=run.cycles_per_ms,
        timing=("CUDA events on the legacy default stream; median over reps of (block of K back-to-back launches "
                "/ K); a GPU spin precedes each block so the host enqueues ahead of the GPU"),
        bandwidth="(bytes read + bytes written) / time, TB/s = 1e12 B/s",
        targets=TARGETS,
    )


def _fmt(v, nd=3):
    return "-" if v is None else f"{v:.{nd}f}"


def write_markdown(path, doc):
    m = doc["meta"]
    v = m["versions"]
    lines = [
        "# numbatma bandwidth benchmark",
        "",
        f"- GPU: **{m['gpu']}** (CC {m['compute_capability']}, {m['sm_count']} SMs, L2 {m['l2_bytes'] or '?'} B, "
        f"memory {m.get('gpu_memory') or '?'}), driver {m.get('driver') or '?'}; datasheet HBM bandwidth "
        f"{m['datasheet_tbps'] or '?'} TB/s",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
        f"- numbatma commit: {m.get('numbatma_commit') or '?'}; date {m['date']}",
        f"- Command: `{m['command']}`",
        f"- Timing: {m['timing']}; {m['reps']} reps, blocks of >= {m['block_ms']} ms. Bandwidth: {m['bandwidth']}.",
        "",
        "## Cases",
        "",
        "| case | implementation | shape | time per launch (us) | TB/s | K | check |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for c in doc["cases"]:
        if c["case"] == "tune":  # listed in the tuning section
            continue
        lines.append(f"| {c['case']} | {c['impl']} | {'x'.join(map(str, c['shape']))} | {c['time_us']:.1f} | "
                     f"{c['tbps']:.3f} | {c['launches_per_block']} | {c['check'] or '-'} |")
    lines += ["", "## Ratios", "", "| ratio | value | target | met |", "|---|---:|---:|---|"]
    for r in doc["ratios"]:
        met = "-" if r["met"] is None else ("**yes**" if r["met"] else "**NO**")
        lines.append(f"| {r['name']} | {r['value']:.3f} | {_fmt(r['target'], 2)} | {met} |")
    missing = [t for t in TARGETS if t not in {r["name"] for r in doc["ratios"]}]
    for t in missing:
        lines.append(f"| {t} | - | {TARGETS[t]:.2f} | not measured |")
    if doc.get("sweep"):
        lines += ["", "## Size sweep (TB/s; * = src+dst fit in L2)", "",
                  "| array MiB | shape | copy ours | copy torch | transpose ours | transpose torch |",
                  "|---:|---|---:|---:|---:|---:|"]
        sizes = sorted({p["size_mib"] for k in doc["sweep"].values() for lst in k.values() for p in lst})
        for s in sizes:
            def get(kind, impl):
                for p in doc["sweep"].get(kind, {}).get(impl, []):
                    if p["size_mib"] == s:
                        return p
                return None
            any_p = next((p for p in (get("copy", "ours"), get("copy", "torch"), get("transpose", "torch")) if p),
                         None)
            shape = "x".join(map(str, any_p["shape"])) if any_p else "?"
            star = "*" if any_p and any_p["l2_resident"] else ""
            cells = [_fmt((get(k, i) or {}).get("tbps")) for k in ("copy", "transpose") for i in ("ours", "torch")]
            lines.append(f"| {s}{star} | {shape} | " + " | ".join(cells) + " |")
    if doc.get("tune"):
        lines += ["", "## Tuning (`--tune`)", "", "| kernel | options | TB/s |", "|---|---|---:|"]
        for r in doc["tune"]["results"]:
            lines.append(f"| {r['kernel']} | {r['options']} | {_fmt(r['tbps'])} |")
        for k, r in doc["tune"]["best"].items():
            lines.append(f"| **best {k}** | {r['options']} | **{r['tbps']:.3f}** |")
    if doc["skips"] or doc["fails"]:
        lines += ["", "## Skipped / failed", ""]
        lines += [f"- SKIP {s['name']}: {s['reason']}" for s in doc["skips"]]
        lines += [f"- FAIL {f['name']}: {f['reason']}" for f in doc["fails"]]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# -- main --------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Bandwidth of numbatma kernels vs torch / CuPy / a CUDA C++ TMA peer (one GPU, one run).")
    ap.add_argument("--quick", action="store_true", help="fewer reps, shorter blocks, smaller sweep")
    ap.add_argument("--tune", action="store_true",
                    help="also try StreamCopy/Axpy options (stages, tile_bytes, ctas_per_sm, l2_promotion)")
    ap.add_argument("--only", default="",
                    help=f"comma-separated subset of {','.join(SECTIONS)} (and/or 'tune'); default: all")
    ap.add_argument("--reps", type=int, default=0, help="timed blocks per case (default 7, --quick 3)")
    ap.add_argument("--block-ms", type=float, default=0.0, help="minimum GPU time of a timed block (default 10)")
    ap.add_argument("--out", default="", help="output directory (default: $OUT, else benchmarks/)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when an issue target is missed")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS + ("tune",)]
    if bad:
        ap.error(f"--only: unknown section(s) {bad}; choose from {', '.join(SECTIONS + ('tune',))}")
    args.sections = [s for s in SECTIONS if not only or s in only]
    args.tune = args.tune or "tune" in only
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"SKIP bandwidth: torch not importable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("SKIP bandwidth: no CUDA device")
        return 0
    t_start = time.perf_counter()
    run = Run(args)
    props = torch.cuda.get_device_properties(0)
    name = torch.cuda.get_device_name(0)
    run.l2_bytes = getattr(props, "L2_cache_size", None)
    run.sm_count = props.multi_processor_count
    run.datasheet = next((bw for key, bw in DATASHEET_TBPS if key in name), None)
    print(f"GPU: {name}, {props.multi_processor_count} SMs, L2 {run.l2_bytes} B, datasheet {run.datasheet} TB/s; "
          f"reps={run.reps}, block >= {run.block_ms} ms")
    main_shape = _square_shape(MAIN_BYTES)
    row_shapes = ROW_SHAPES[: 1 if args.quick else len(ROW_SHAPES)]
    sections = {
        "copy": lambda: case_copy(run, main_shape),
        "axpy": lambda: case_axpy(run, main_shape),
        "transpose": lambda: case_transpose(run, main_shape),
        "rowsum": lambda: [case_rowsum(run, s) for s in row_shapes],
        "softmax": lambda: [case_softmax(run, s) for s in row_shapes],
        "stencil": lambda: case_stencil(run, main_shape),
        "sweep": lambda: case_sweep(run, SWEEP_MIB_QUICK if args.quick else SWEEP_MIB),
    }
    if args.tune:
        sections["tune"] = lambda: case_tune(run, main_shape)
    section_s = {}
    for name_ in list(args.sections) + (["tune"] if args.tune else []):
        print(f"== {name_}")
        t0 = time.perf_counter()
        try:
            sections[name_]()
        except Exception as e:  # noqa: BLE001 - one broken section must not end the run
            run.fail(name_, f"section raised {_short(e)}")
        run.free()
        section_s[name_] = round(time.perf_counter() - t0, 1)
        print(f"   ({section_s[name_]} s)")

    doc = dict(schema=1, meta=_meta(run, args), cases=run.cases, ratios=run.ratios, sweep=run.sweep,
               tune=run.tune, skips=run.skips, fails=run.fails)
    doc["meta"]["wall_s"] = time.perf_counter() - t_start
    doc["meta"]["section_s"] = section_s
    out_dir = args.out or os.environ.get("OUT") or HERE
    os.makedirs(out_dir, exist_ok=True)
    jpath, mpath = os.path.join(out_dir, "bandwidth.json"), os.path.join(out_dir, "bandwidth.md")
    with open(jpath, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    write_markdown(mpath, doc)
    print("== targets")
    for t, tv in TARGETS.items():
        r = next((r for r in run.ratios if r["name"] == t), None)
        print(f"  {t:<32} target >= {tv:.2f}: " + ("not measured" if r is None else
                                                     f"{r['value']:.3f} {'met' if r['met'] else 'NOT MET'}"))
    print(f"wrote {jpath} and {mpath} ({doc['meta']['wall_s']:.0f} s; {len(run.fails)} FAIL, "
          f"{len(run.skips)} SKIP)")
    missed = any(r["met"] is False for r in run.ratios)
    return 1 if run.fails or (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
