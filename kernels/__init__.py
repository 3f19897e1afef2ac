"""numbatma.kernels: ready-made TMA and tensor-core kernels built only on numbatma's public API."""
from ._launch import persistent_grid, sm_count
from ._plan import NotRebindable, Plan, clear_plan_cache, plan_cache_info, plan_cache_size
from ._plan_cache import cached_plans
from .attention import Attention, AttentionConfig, attention
from .attention_backward import AttentionBackward, attention_backward
from .copy import TmaCopy, default_box, tma_copy
from .gemm import Gemm, GemmConfig, gemm
from .rows import RowSum, Softmax, row_sum, softmax
from .stencil import Laplacian5, laplacian5
from .stream import Axpy, StreamCopy, axpy, stream_copy
from .transpose import Transpose, transpose

__all__ = [
    "Plan", "NotRebindable", "clear_plan_cache", "plan_cache_info", "plan_cache_size", "cached_plans", "persistent_grid", "sm_count",
    "Attention", "AttentionConfig", "attention", "AttentionBackward", "attention_backward",
    "TmaCopy", "default_box", "tma_copy",
    "Gemm", "GemmConfig", "gemm",
    "RowSum", "Softmax", "row_sum", "softmax",
    "Laplacian5", "laplacian5",
    "StreamCopy", "stream_copy", "Axpy", "axpy",
    "Transpose", "transpose",
]
