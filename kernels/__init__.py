"""numbatma.kernels: ready-made TMA kernels built only on numbatma's public API."""
from .copy import default_box, tma_copy

__all__ = ["default_box", "tma_copy"]
