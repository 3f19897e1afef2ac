"""The numba types a launch gives a plan's arguments, for the CPU tests that compile a plan's kernel themselves (SASS
pins): a :class:`numbatma.DeviceView` becomes a numba device array over its memory at launch
(``numbatma.views.launch_argument``), typed C where its strides are C-contiguous (numba's flags), else A - what
``typeof`` of the view itself (always A) would not say. Every other argument is typed by ``typeof``."""
import numpy as np
from numba.core import types
from numba.cuda.typing.typeof import typeof
from numba.np.numpy_support import from_dtype

from numbatma import DeviceView


def launch_type(arg):
    if not isinstance(arg, DeviceView):
        return typeof(arg)
    lay = arg.layout
    dtype = np.dtype(arg.__cuda_array_interface__["typestr"])  # (what the launch's device array sees: bfloat16's bits)
    flags = np.lib.stride_tricks.as_strided(np.empty(1, dtype), lay.shape, lay.strides).flags
    return types.Array(from_dtype(dtype), len(lay.shape), "C" if flags.c_contiguous else "A")


def launch_types(args):
    """``launch_type`` of each argument, as a tuple (a signature)."""
    return tuple(launch_type(a) for a in args)
