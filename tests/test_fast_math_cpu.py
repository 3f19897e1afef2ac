"""CPU tests of numbatma.intrinsics.fast_math: ``fast_exp2`` compiles to the one instruction
``ex2.approx.ftz.f32`` (PTX) - one ``MUFU.EX2`` with none of libdevice's subnormal handling (SASS) - and links for
every target; a non-float32 argument is refused at typing with the user's type; the simulator's semantics (ftz at
both ends, infinities, NaN) next to NumPy."""
import math

import numpy as np
import pytest
from numba import cuda, types

from numbatma import compile as nbc
from numbatma.errors import TypingError
from numbatma.intrinsics import all_ptx, fast_exp2
from numbatma.intrinsics._asm import TARGETS
from numbatma.intrinsics.fast_math import sim_fast_exp2

SIG = (types.float32[::1], types.float32[::1])


def fast(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = fast_exp2(x[i])


def libdevice(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = math.exp2(x[i])


@pytest.mark.parametrize("arch", TARGETS)
def test_compiles_to_ex2_approx_ftz_and_links(arch):
    ptx = nbc.compile_ptx(fast, SIG, arch=arch)
    assert "ex2.approx.ftz.f32" in ptx
    assert nbc.link_cubin(ptx, arch=arch)


def test_one_mufu_and_no_subnormal_handling():
    ours = nbc.sass(nbc.compile_cubin(fast, SIG))
    theirs = nbc.sass(nbc.compile_cubin(libdevice, SIG))
    assert ours.count("MUFU.EX2") == 1 and "FSETP.GEU" not in ours
    assert theirs.count("MUFU.EX2") == 1 and "FSETP.GEU" in theirs  # (what fast_exp2 saves: compare, 2 FMULs)


@pytest.mark.parametrize("argtype", [types.float64, types.int32, types.float16])
def test_non_float32_is_refused_naming_the_type(argtype):
    with pytest.raises(TypingError, match=rf"fast_exp2: x must be a float32 .*got {argtype}"):
        nbc.compile_ptx(fast, (argtype[::1], types.float32[::1]))


def test_ptx_table():
    assert all_ptx()["fast_exp2"].text == "ex2.approx.ftz.f32 $y, $x;"


@pytest.mark.parametrize("x, expected", [
    (0.0, 1.0), (1.0, 2.0), (-1.0, 0.5), (10.5, 2.0 ** 10.5), (-126.0, 2.0 ** -126),
    (-126.5, 0.0), (-149.0, 0.0),  # results below 2^-126 flush to +0
    (2.0 ** -130, 1.0), (-(2.0 ** -130), 1.0),  # a subnormal x is taken as 0
    (-np.inf, 0.0), (np.inf, np.inf), (128.0, np.inf)])
def test_simulator_semantics(x, expected):
    y = sim_fast_exp2(np.float32(x))
    assert type(y) is np.float32
    assert y == np.float32(expected) and not np.signbit(y)


def test_simulator_nan_and_refusal():
    assert np.isnan(sim_fast_exp2(np.float32(np.nan)))
    with pytest.raises(TypeError, match="fast_exp2: x must be a float32, got float 0.5"):
        sim_fast_exp2(0.5)
    with pytest.raises(TypeError, match="fast_exp2: x must be a float32, got float64"):
        sim_fast_exp2(np.float64(0.5))
