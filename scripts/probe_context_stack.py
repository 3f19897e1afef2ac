"""Which calls change the CUDA context stack around a numbatma kernel called on numba arrays of device 1 inside
``with cuda.gpus[1]:`` (two GPUs; an observation for tests/test_gpu_multi_device.py's teardown check).

Logs every cuCtxPushCurrent / cuCtxPopCurrent / cuCtxSetCurrent made through cuda.bindings (numba-cuda's and
numbatma's; cuda.core calls the driver from Cython, unseen) with its Python callers, and the current context's device
after each step.

    python scripts/probe_context_stack.py
"""
import traceback

import numpy as np
from cuda.bindings import driver

LOG = []


def _wrap(name):
    original = getattr(driver, name)

    def call(*args):
        result = original(*args)
        stack = [f"{f.filename.split('/')[-1]}:{f.lineno}:{f.name}" for f in traceback.extract_stack()[-7:-1]]
        LOG.append(f"  {name}({', '.join(map(str, args))}) -> {result}  <- {' < '.join(reversed(stack))}")
        return result

    setattr(driver, name, call)


for _name in ("cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxSetCurrent"):
    _wrap(_name)

import torch  # noqa: E402
from numba import cuda  # noqa: E402

from numbatma import devices  # noqa: E402
from numbatma.kernels import attention, gemm, stream_copy  # noqa: E402


def state(step):
    print(f"{step}: current device {devices.current_device()}")
    for line in LOG:
        print(line)
    LOG.clear()


def main():
    torch.cuda.set_device(0)
    torch.empty(1, device="cuda:0")
    state("torch device 0")
    rng = np.random.default_rng()
    cases = {
        "stream_copy f32": ([rng.standard_normal((300, 1000)).astype(np.float32)], ((300, 1000), np.float32),
                            lambda a, o: stream_copy(a, o)),
        "gemm f16": ([rng.standard_normal((256, 192)).astype(np.float16),
                      rng.standard_normal((192, 320)).astype(np.float16)], ((256, 320), np.float32),
                     lambda a, b, o: gemm(a, b, o)),
        "attention f16": ([rng.standard_normal((1, 2, 200, 64)).astype(np.float16) for _ in range(3)],
                          ((1, 2, 200, 64), np.float16), lambda q, k, v, o: attention(q, k, v, o)),
    }
    for name, (inputs, (shape, dtype), call) in cases.items():
        print(f"== {name}")
        with cuda.gpus[1]:
            state("entered gpus[1]")
            d_in = [cuda.to_device(a) for a in inputs]
            d_out = cuda.to_device(np.full(shape, np.nan, dtype))
            state("arrays made")
            call(*d_in, d_out)
            state("called")
            cuda.synchronize()
            state("synchronized")
        state("left gpus[1]")
        if devices.current_device() != 0:
            torch.empty(1, device="cuda:0")
            cuda.gpus[0].get_primary_context().push()
            state("(device 0 made current again)")


if __name__ == "__main__":
    main()
