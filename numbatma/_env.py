"""Process-wide facts read once, at import, from the environment. A leaf: it imports nothing of numbatma, so
any module may take ``SIMULATING`` from here without importing the package (no import circle through
``numbatma/__init__.py``)."""
from __future__ import annotations

import os

# Numba's CUDA simulator replaces the GPU for the whole process (NUMBA_ENABLE_CUDASIM=1).
SIMULATING = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
