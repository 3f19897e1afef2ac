"""numbatma.kernels: ready-made TMA kernels built only on numbatma's public API."""
from .copy import default_box, tma_copy
from .stream import Axpy, StreamCopy, axpy, stream_copy

__all__ = ["default_box", "tma_copy", "StreamCopy", "stream_copy", "Axpy", "axpy"]
from .stencil import Laplacian5, laplacian5  # noqa: E402

__all__ += ["Laplacian5", "laplacian5"]
from .transpose import Transpose, transpose  # noqa: E402

__all__ += ["Transpose", "transpose"]
from .rows import RowSum, Softmax, row_sum, softmax  # noqa: E402

__all__ += ["RowSum", "Softmax", "row_sum", "softmax"]
