"""Host launch cost of a kernel with one TensorMap argument vs a plain numba-cuda launch.

Both kernels take the same other arguments (one device array and one int); the numbatma kernel also takes
one descriptor, passed by value. Each sample is the mean over a burst of launches timed on the host;
the figure is the median of the samples after warm-up. Run: python benchmarks/launch_overhead.py
"""
import statistics
import sys
import time

import numpy as np
from numba import cuda

import numbatma


@cuda.jit
def plain_kernel(x, n):
    if cuda.threadIdx.x == 0 and n < 0:
        x[0] = n


@cuda.jit
def descriptor_kernel(desc, x, n):
    if cuda.threadIdx.x == 0 and n < 0:
        x[0] = desc.box_bytes


def per_launch_us(launch, burst=200, samples=30):
    for _ in range(burst):  # warm-up: compile, load module, encode descriptor
        launch()
    cuda.synchronize()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(burst):
            launch()
        t1 = time.perf_counter()
        cuda.synchronize()
        times.append((t1 - t0) / burst * 1e6)
    return statistics.median(times)


def main():
    x = cuda.to_device(np.random.default_rng().standard_normal((1024, 1024)).astype(np.float32))
    desc = numbatma.TensorMap(x, (64, 32))
    results = {}
    for round_ in range(3):  # interleave the two so drift affects both
        results.setdefault("plain", []).append(per_launch_us(lambda: plain_kernel[1, 32](x, 1)))
        results.setdefault("descriptor", []).append(per_launch_us(lambda: descriptor_kernel[1, 32](desc, x, 1)))
    plain = statistics.median(results["plain"])
    withdesc = statistics.median(results["descriptor"])
    ratio = withdesc / plain
    print(f"GPU: {cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes) else cuda.get_current_device().name}")
    print(f"plain numba-cuda launch (array, int):           {plain:7.2f} us")
    print(f"numbatma launch (TensorMap by value, array, int): {withdesc:7.2f} us")
    print(f"ratio: {ratio:.3f}x (target <= 1.15x)")
    return 0 if ratio <= 1.15 else 1


if __name__ == "__main__":
    sys.exit(main())
