"""Stand-ins for CUDA arrays on machines without a GPU: only the CUDA Array Interface is needed to build
(and compile kernels against) a TensorMap; encoding waits for the first launch."""
import numpy as np


class FakeCudaArray:
    def __init__(self, shape, dtype, strides=None, ptr=1 << 20):
        self.__cuda_array_interface__ = {
            "data": (ptr, False),
            "shape": tuple(shape),
            "strides": strides,
            "typestr": np.dtype(dtype).str,
            "version": 3,
        }

    def reshape(self, shape):
        """A C-contiguous reshape (what the kernels ask of contiguous arrays)."""
        cai = self.__cuda_array_interface__
        return FakeCudaArray(shape, np.dtype(cai["typestr"]), ptr=cai["data"][0])
