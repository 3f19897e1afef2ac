"""GPU tests (marker ``gpu``): wgmma_map places every register at its (row, column) of the m64nN tile and
wgmma_row_reduce reduces whole rows across the quad (the kernel of tests/accumulator_kernels.py, on fresh random
data, outputs poisoned)."""
import numpy as np
import pytest
from numba import cuda

import accumulator_kernels as K

pytestmark = pytest.mark.gpu


def test_map_and_reduce_match_numpy():
    K.run_map_and_reduce(cuda.jit(K.map_and_reduce_kernel), np.random.default_rng())
