"""The toolchain that turns kernels into SASS here, for tests that pin instruction counts measured once: NVVM
(Python -> PTX) and nvJitLink (PTX -> SASS), as their pip packages name them. Other versions schedule and count
differently (the GPU image's nvJitLink gave 3648 SASS instructions where this one gave 3656 for the same attention
kernel), so a pinned count is compared only under the toolchain it was measured with."""
import importlib.metadata

import pytest

#: The toolchain the pinned counts in tests/test_gemm_cpu.py and tests/test_attention_cpu.py were measured with.
MEASURED = {"nvidia-nvvm": "13.5.37", "nvidia-nvjitlink": "13.5.37"}


def toolchain():
    """``{package: version or None}`` for the packages of :data:`MEASURED` (None: not installed from pip)."""
    out = {}
    for name in MEASURED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def require_measured_toolchain():
    """Skip the calling test unless the toolchain is the one its pinned counts were measured with."""
    here = toolchain()
    if here != MEASURED:
        pytest.skip(f"instruction counts pinned under {MEASURED}; this toolchain is {here} (re-measure to compare)")
