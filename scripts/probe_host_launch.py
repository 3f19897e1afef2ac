"""Where the host time of a function form goes on a GPU machine (an observation, not a check), and what the driver
says about the device of a pointer.

Part 1 (one GPU is enough): µs per call, best of 7 rounds of 2000 calls (perf_counter), of torch's ops, of the pieces
of ``numbatma.kernels.axpy(...)`` on a repeated call (the check that it repeats the last call, the cache key of a
call with other arrays, the stream look-up, the prepared launch) and of the
launch itself three ways (numbatma's prepared run; cuda.bindings' ``cuLaunchKernel`` with the same arguments; the
same through ctypes on libcuda).

Part 2 (two GPUs): ``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL / CONTEXT)`` of memory of device 1
(torch's, numba's) with device 0 and with device 1 current, and torch's allocator settings.

    python scripts/probe_host_launch.py
"""
import ctypes
import os
import time


def best_us(fn, calls=2000, rounds=7):
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def part1(torch):
    from cuda.bindings import driver

    import numbatma.kernels as K
    from numbatma import layout_record
    from numbatma.kernels import Axpy, _plan_cache

    x, y, a, o = (torch.randn(64, 64, device="cuda") for _ in range(4))
    K.axpy(2.0, x, a, y)
    torch.cuda.synchronize()
    plan = next(p for p in _plan_cache.cached_plans() if isinstance(p, Axpy))
    last = _plan_cache._hot[Axpy]  # (axpy's last call: what a repeated call is checked against)
    run = plan._prepared_launch[1]
    stream = plan.stream_for(None)
    handle = run._stream_memo[1]
    f, g, b, smem, params = run.function, run.grid, run.block, run.shared_mem, run.params.address
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    launch.restype = ctypes.c_int
    fptr, sptr = int(f), int(handle)
    rows = [
        ("torch copy_", lambda: o.copy_(x)),
        ("torch add(alpha=)", lambda: torch.add(a, x, alpha=2.0, out=y)),
        ("numbatma axpy (function form)", lambda: K.axpy(2.0, x, a, y)),
        ("numbatma stream_copy (function form)", lambda: K.stream_copy(x, o)),
        ("Axpy plan.launch()", lambda: plan.launch()),
        ("  repeated call? (_repeats)", lambda: _plan_cache._repeats(last, (2.0, x, a, y), {})),
        ("  key, other arrays: _key_and_facts", lambda: _plan_cache._key_and_facts(Axpy, (2.0, x, a, y), {})),
        ("  layout_record(tensor)", lambda: layout_record(x)),
        ("  plan.stream_for(None)", lambda: plan.stream_for(None)),
        ("  torch._C._cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("  prepared run(stream)", lambda: run(stream)),
        ("  cuda.bindings cuLaunchKernel", lambda: driver.cuLaunchKernel(f, g[0], g[1], g[2], b[0], b[1], b[2], smem,
                                                                         handle, params, 0)),
        ("  ctypes cuLaunchKernel", lambda: launch(fptr, g[0], g[1], g[2], b[0], b[1], b[2], smem, sptr, params,
                                                   None)),
    ]
    print(f"GPU: {torch.cuda.get_device_name()}; µs per call, best of 7 x 2000")
    for name, fn in rows:
        us = best_us(fn)
        torch.cuda.synchronize()
        print(f"{name:42s} {us:7.2f}")
    assert torch.allclose(y, 2.0 * x + a), "axpy result"


def part2(torch):
    from cuda.bindings import driver
    from numba import cuda

    import numbatma

    print("PYTORCH_CUDA_ALLOC_CONF =", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
          "; allocator backend:", getattr(torch.cuda, "get_allocator_backend", lambda: "?")())
    t1 = torch.zeros(1 << 20, device="cuda:1")
    t0 = torch.zeros(1 << 20, device="cuda:0")
    with cuda.gpus[1]:
        n1 = cuda.device_array(1 << 20, "float32")
    attr = driver.CUpointer_attribute
    for current in (0, 1):
        torch.cuda.set_device(current)
        with cuda.gpus[current]:
            for name, ptr in (("torch cuda:1", t1.data_ptr()), ("torch cuda:0", t0.data_ptr()),
                              ("numba gpus[1]", n1.device_ctypes_pointer.value)):
                ordinal = driver.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
                context = driver.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_CONTEXT, ptr)
                pool = driver.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr)
                print(f"current {current}: {name:14s} DEVICE_ORDINAL {ordinal}  CONTEXT {context}  MEMPOOL {pool}  "
                      f"array_device {numbatma.array_device(numbatma.DeviceView(numbatma.array_layout(t1), None)) if name == 'torch cuda:1' else '-'}")
    torch.cuda.set_device(0)


def main():
    import torch

    part1(torch)
    if torch.cuda.device_count() > 1:
        part2(torch)


if __name__ == "__main__":
    main()
