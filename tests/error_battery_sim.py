"""Launch-time misuse under the CUDA simulator (run by tests/test_error_battery.py in a subprocess with
NUMBA_ENABLE_CUDASIM=1): prints one JSON object {case: [exception type, first line of the message]}."""
import json
import os
import sys

import numpy as np
from numba import cuda

from numbatma import TensorMap, TensorMapArray
from numbatma.intrinsics import prefetch_tensormap, tensormap_acquire, tensormap_ref, tma_load, tma_store

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@cuda.jit
def load(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)


@cuda.jit
def store(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    tma_store(d, (0, 0), t)


@cuda.jit
def prefetch(d):
    prefetch_tensormap(d)


@cuda.jit
def acquire(ds, i):
    prefetch_tensormap(tensormap_acquire(ds, i))


@cuda.jit
def ref(ds, i):
    tensormap_ref(ds, i)


x = cuda.to_device(np.zeros((64, 64), np.float32))
D = TensorMap(x, (16, 32))
DS = TensorMapArray([D, D])
CASES = {
    "array as tma_load descriptor": lambda: load[1, 1](x),
    "array as tma_store descriptor": lambda: store[1, 1](x),
    "number as prefetch descriptor": lambda: prefetch[1, 1](3),
    "TensorMap as TensorMapArray": lambda: acquire[1, 1](D, 0),
    "acquire index 2 of 2": lambda: acquire[1, 1](DS, 2),
    "acquire index -1": lambda: acquire[1, 1](DS, -1),
    "tensormap_ref index 5": lambda: ref[1, 1](DS, 5),
}
results = {}
for name, run in CASES.items():
    try:
        run()
        results[name] = [None, ""]
    except Exception as exc:  # noqa: BLE001 - reported to the parent test
        results[name] = [type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""]
json.dump(results, sys.stdout)
