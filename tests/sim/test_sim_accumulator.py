"""Under NUMBA_ENABLE_CUDASIM=1: wgmma_map places every register at its (row, column) of the m64nN tile and
wgmma_row_reduce reduces whole rows across the quad, like the GPU (tests/test_gpu_accumulator.py runs the same
kernel); a read before the covering wait is reported."""
import numpy as np
import pytest
from numba import cuda

from numbatma.intrinsics import wgmma_map, wgmma_zeros
from numbatma.intrinsics._sim import SimulatedMisuse

import accumulator_kernels as K


def test_map_and_reduce_match_numpy():
    K.run_map_and_reduce(cuda.jit(K.map_and_reduce_kernel), np.random.default_rng())


def test_float16_accumulator_refused():
    from numbatma.intrinsics import wgmma_zeros_f16

    @cuda.jit
    def kernel(x):
        wgmma_map(wgmma_zeros_f16(64), K.from_array, (x, 0))

    with pytest.raises(SimulatedMisuse, match="wgmma_map: expected a float32 wgmma accumulator"):
        kernel[1, 128](cuda.to_device(np.zeros((64, 64), np.float32)))
