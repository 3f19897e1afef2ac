"""Host cost of a user's ``@cuda.jit`` kernel taking a TensorMap, against the same kernel taking the plain array,
and the cost of building a TensorMap.

Launch: two kernels of the same arity - ``(TensorMap, array, int)`` and ``(array, array, int)`` - launched through
numba's ordinary ``kernel[grid, block](...)`` path. One sample is the mean host time per launch over a burst of
``--burst`` launches (after a synchronise; the tiny kernels finish faster than the host issues them, so the queue
never fills); ``--rounds`` rounds alternate the two kernels, one sample each, so drift hits both; the ratio is
taken per round and its median reported with the spread (max - min) / median of the per-round ratios.

Descriptor: host time of ``TensorMap(array, box)`` (validation and encoding) from a numba device array and, when
torch is installed, from a torch tensor; and of re-pointing one at another array of the same layout
(``TensorMap.repoint``). Target (the host-path issue): launch ratio <= 1.10x.

    python benchmarks/launch_overhead.py [--rounds 15] [--burst 200]
"""
import argparse
import statistics
import sys
import time

import numpy as np
from numba import cuda

import numbatma


@cuda.jit
def plain_kernel(a, x, n):
    if cuda.threadIdx.x == 0 and n < 0:
        x[0] = a[0, 0]


@cuda.jit
def descriptor_kernel(desc, x, n):
    if cuda.threadIdx.x == 0 and n < 0:
        x[0] = desc.box_bytes


def per_call_us(fn, burst):
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(burst):
        fn()
    t1 = time.perf_counter()
    cuda.synchronize()
    return (t1 - t0) / burst * 1e6


def spread(values):
    med = statistics.median(values)
    return (max(values) - min(values)) / med


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--burst", type=int, default=200)
    args = parser.parse_args()
    a = cuda.to_device(np.random.default_rng().standard_normal((1024, 1024)).astype(np.float32))
    b = cuda.to_device(np.zeros_like(a.copy_to_host()))
    x = cuda.device_array(4, np.float32)
    desc = numbatma.TensorMap(a, (64, 32))
    plain = lambda: plain_kernel[1, 32](a, x, 1)  # noqa: E731
    with_desc = lambda: descriptor_kernel[1, 32](desc, x, 1)  # noqa: E731
    for fn in (plain, with_desc):  # compile, load, warm up
        per_call_us(fn, args.burst)
    p, d = [], []
    for _ in range(args.rounds):
        p.append(per_call_us(plain, args.burst))
        d.append(per_call_us(with_desc, args.burst))
    ratios = [di / pi for pi, di in zip(p, d)]
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    print(f"GPU: {name}")
    print(f"plain kernel (array, array, int):       {statistics.median(p):7.2f} us (spread {spread(p):.2f})")
    print(f"same kernel (TensorMap, array, int):    {statistics.median(d):7.2f} us (spread {spread(d):.2f})")
    ratio = statistics.median(ratios)
    print(f"launch ratio: {ratio:.3f}x (per-round ratios {min(ratios):.3f}..{max(ratios):.3f}; target <= 1.10x)")

    def build(array):
        return lambda: numbatma.TensorMap(array, (64, 32))

    cases = [("TensorMap(numba array, box)", build(a))]
    try:
        import torch

        t = torch.randn((1024, 1024), device="cuda")
        cases.append(("TensorMap(torch tensor, box)", build(t)))
    except ImportError:
        pass
    flip = [a, b]

    def repoint():
        flip.reverse()
        desc.repoint(flip[0])

    cases.append(("TensorMap.repoint(array of the same layout)", repoint))
    for label, fn in cases:
        fn()
        samples = [per_call_us(fn, args.burst // 4 or 1) for _ in range(args.rounds)]
        print(f"{label:45s} {statistics.median(samples):7.2f} us (spread {spread(samples):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
