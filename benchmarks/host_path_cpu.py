"""The Python part of the host path (benchmarks/host_path.py measures it with the GPU launch), on a CPU: plans built
from stand-in arrays (``--kind``: tests/fakes.py's torch-like tensor in a stand-in ``torch`` module, numba's own
``DeviceNDArray`` over memory it does not own, or a bare CUDA-array-interface object), launched through numbatma's
real prepared launch (numba-cuda's argument marshalling once, the parameter block, ``update``) with only the driver
replaced: the launch (``cuLaunchKernel``) and ``cuTensorMapReplaceAddress`` are no-ops, descriptors are not encoded
(an empty ``CUtensorMap``), the compiled kernel is a stand-in typed from the arguments. µs per call of everything
numbatma does around the driver.

    python benchmarks/host_path_cpu.py [--calls 2000] [--rounds 5] [--kind torch|numba|cai] [--profile CASE]

Cases: ``Plan.launch()`` of a StreamCopy plan, and each function form on a cache hit with the same arrays ("same")
and alternating between two sets of arrays of the same layout ("new": every call re-points the plan). The figure is
the best of ``--rounds`` rounds of ``--calls`` calls. ``prep/call``: launches prepared from scratch per call (on a
GPU each costs tens of µs: argument typing, overload lookup, conversion), ``upd/call``: prepared launches patched in
place (``PreparedLaunch.update``). What is not here: cuda.bindings' and the driver's share of the launch and of each
descriptor's re-pointing, allocating ``lse`` for attention (numba's ``device_array``) and attention_backward's
three work arrays (``torch.empty``: both taken from pools here), torch's own cost per tensor method call. ``--profile CASE`` prints a cProfile of the "new" calls of CASE (e.g. ``gemm``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


import fakes  # noqa: E402
import numpy as np  # noqa: E402

sys.modules["torch"] = TORCH = fakes.fake_torch()  # (before numbatma: it must see "torch" loaded, as on a GPU host)

from numbatma import kernels as K  # noqa: E402

COUNTS = {"prepare": 0, "update": 0}


def offline():
    """Replace what needs a GPU (see the module docstring: tests/fakes.py's ``offline_gpu``, the launch a no-op) and
    count preparations and updates."""
    from numba import cuda

    from numbatma import _prepared_launch as prepared

    fakes.offline_gpu(setattr, record=False)
    prepare, update = prepared.prepare_launch, prepared.PreparedLaunch.update

    def counted_prepare(*a, **k):
        COUNTS["prepare"] += 1
        return prepare(*a, **k)

    def counted_update(self, sources):
        COUNTS["update"] += 1
        return update(self, sources)

    prepared.prepare_launch = counted_prepare  # (where numbatma.launch looks it up)
    prepared.PreparedLaunch.update = counted_update
    pools, turn = {}, [0]

    def device_array(shape, dtype):  # (attention's own lse: a numba array at a new address each call, taken from
        key = (tuple(shape), np.dtype(dtype))  # a pool made here: allocating - cuMemAlloc on a GPU - is not counted)
        if key not in pools:
            pools[key] = [fakes.numba_array(shape, dtype, (1 << 40) + i * (1 << 20)) for i in range(64)]
        turn[0] += 1
        return pools[key][turn[0] % 64]

    cuda.device_array = device_array

    def empty(shape, dtype=None, device=None):  # (torch.empty for attention_backward's work arrays, from a pool too)
        key = (tuple(shape), dtype.name)
        if key not in pools:
            pools[key] = [fakes.FakeTorchTensor(shape, dtype, ptr=(1 << 41) + i * (1 << 24)) for i in range(64)]
        turn[0] += 1
        return pools[key][turn[0] % 64]

    TORCH.empty = empty


def arrays(kind, base):
    """The tensors of benchmarks/host_path.py, at addresses ``base + ...`` (multiples of 1024 apart)."""
    import ml_dtypes

    def np_dtype(name):
        return np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name)

    if kind == "torch":
        def t(shape, dtype="float32", off=0):
            return fakes.FakeTorchTensor(shape, dtype, ptr=base + off)
    elif kind == "numba":
        def t(shape, dtype="float32", off=0):
            return fakes.numba_array(shape, np_dtype(dtype), base + off)
    else:
        def t(shape, dtype="float32", off=0):
            return fakes.FakeCudaArray(shape, np_dtype(dtype), ptr=base + off)
    mb = 1 << 20
    return dict(x=t((64, 64)), y=t((64, 64), off=mb), a=t((64, 64), off=2 * mb), rows=t((64,), off=3 * mb),
                bf=t((128, 128), "bfloat16", off=4 * mb), cf=t((128, 128), "bfloat16", off=5 * mb),
                q=t((1, 1, 128, 64), "bfloat16", off=6 * mb), k=t((1, 1, 128, 64), "bfloat16", off=7 * mb),
                v=t((1, 1, 128, 64), "bfloat16", off=8 * mb), o=t((1, 1, 128, 64), "bfloat16", off=9 * mb),
                do=t((1, 1, 128, 64), "bfloat16", off=10 * mb), lse=t((1, 1, 128), off=11 * mb),
                dq=t((1, 1, 128, 64), "bfloat16", off=12 * mb), dk=t((1, 1, 128, 64), "bfloat16", off=13 * mb),
                dv=t((1, 1, 128, 64), "bfloat16", off=14 * mb))


FORMS = {
    "stream_copy": lambda d: K.stream_copy(d["x"], d["y"]),
    "axpy": lambda d: K.axpy(2.0, d["x"], d["a"], d["y"]),
    "transpose": lambda d: K.transpose(d["x"], d["y"]),
    "row_sum": lambda d: K.row_sum(d["x"], d["rows"]),
    "softmax": lambda d: K.softmax(d["x"], d["y"]),
    "laplacian5": lambda d: K.laplacian5(d["x"], d["y"]),
    "gemm": lambda d: K.gemm(d["bf"], d["bf"], d["cf"]),
    "attention": lambda d: K.attention(d["q"], d["k"], d["v"], d["o"]),
    "attention_backward": lambda d: K.attention_backward(*(d[n] for n in ("q", "k", "v", "o", "do", "lse", "dq",
                                                                          "dk", "dv"))),
}


def per_call_us(fn, calls, rounds):
    fn()
    best = float("inf")
    for _ in range(rounds):  # (the thread's CPU time: what other processes take of the CPU is not counted)
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - t0) / calls)
    return best * 1e6


def counts_per_call(fn, calls=50):
    fn()
    before = dict(COUNTS)
    for _ in range(calls):
        fn()
    return {k: (COUNTS[k] - before[k]) / calls for k in COUNTS}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kind", choices=("torch", "numba", "cai"), default="torch")
    parser.add_argument("--profile")
    args = parser.parse_args()
    offline()
    one, two = arrays(args.kind, 1 << 30), arrays(args.kind, 1 << 34)
    if args.profile:
        import cProfile
        import pstats

        flip = [one, two]
        fn = FORMS[args.profile]
        fn(one), fn(two)
        cProfile.runctx("for i in range(2000): fn(flip[i % 2])", globals(), locals(), "/tmp/host_path_cpu.prof")
        pstats.Stats("/tmp/host_path_cpu.prof").sort_stats("tottime").print_stats(25)
        return 0
    plan = K.StreamCopy(one["x"], one["y"])
    rows = [("StreamCopy plan.launch()", plan.launch, None)]
    for name, fn in FORMS.items():
        flip = [0]

        def alternate(fn=fn, flip=flip):
            flip[0] ^= 1
            return fn(two if flip[0] else one)

        rows.append((name, (lambda fn=fn: fn(one)), alternate))
    print(f"arrays: {args.kind}; µs per call (best of {args.rounds} x {args.calls}), launch excluded")
    print(f"{'case':26s} {'same':>8s} {'new':>8s}   prep/call (same, new)  upd/call (same, new)")
    for name, same, new in rows:
        t_same = per_call_us(same, args.calls, args.rounds)
        c_same = counts_per_call(same)
        if new is None:
            print(f"{name:26s} {t_same:8.2f} {'':>8s}   {c_same['prepare']:4.2f}                   "
                  f"{c_same['update']:4.2f}")
            continue
        t_new = per_call_us(new, args.calls, args.rounds)
        c_new = counts_per_call(new)
        print(f"{name:26s} {t_same:8.2f} {t_new:8.2f}   {c_same['prepare']:4.2f}, {c_new['prepare']:4.2f}"
              f"             {c_same['update']:4.2f}, {c_new['update']:4.2f}")
    print(f"plan cache: {K.plan_cache_info()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
