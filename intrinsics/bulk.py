"""(being written)"""
from __future__ import annotations

__all__ = []
PTX = {}
