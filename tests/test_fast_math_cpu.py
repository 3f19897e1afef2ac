"""CPU tests of numbatma.intrinsics.fast_math: ``poly_exp2`` compiles to FMA-pipe instructions and no MUFU, its
simulator semantics (the GPU's steps in float32) within 7.5e-5 of ``2 ** x`` with the ends and NaN as documented;
``fast_exp2`` compiles to the one instruction
``ex2.approx.ftz.f32`` (PTX) - one ``MUFU.EX2`` with none of libdevice's subnormal handling (SASS) - and links for
every target; a non-float32 argument is refused at typing with the user's type; the simulator's semantics (ftz at
both ends, infinities, NaN) next to NumPy."""
import math
import re

import numpy as np
import pytest
from numba import cuda, types

from numbatma import compile as nbc
from numbatma.errors import TypingError
from numbatma.intrinsics import all_ptx, fast_exp2, poly_exp2
from numbatma.intrinsics._asm import TARGETS
from numbatma.intrinsics.fast_math import sim_fast_exp2, sim_poly_exp2
from numbatma.errors import SimulatedMisuse

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


def poly(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = poly_exp2(x[i])


@pytest.mark.parametrize("arch", TARGETS)
def test_poly_exp2_links_for_every_target(arch):
    ptx = nbc.compile_ptx(poly, SIG, arch=arch)
    assert "max.NaN.f32" in ptx and "ex2.approx" not in ptx
    assert nbc.link_cubin(ptx, arch=arch)


def test_poly_exp2_has_no_mufu_and_nine_instructions():
    sass = nbc.sass(nbc.compile_cubin(poly, SIG))
    assert "MUFU" not in sass
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?P\d\s+)?([A-Z0-9_.]+)", sass)
    fma_pipe = [op for op in ops if op.split(".")[0] in ("FADD", "FFMA", "FMUL", "FMNMX")]
    assert sorted(fma_pipe) == ["FADD"] * 3 + ["FFMA"] * 3 + ["FMNMX.NAN", "FMUL.FTZ"], fma_pipe
    assert "IMAD.SHL.U32" in ops or "SHF.L.U32" in ops  # (2^r: r + 127 shifted into the exponent field)


@pytest.mark.parametrize("argtype", [types.float64, types.int32])
def test_poly_exp2_refuses_non_float32(argtype):
    with pytest.raises(TypingError, match=rf"poly_exp2: x must be a float32, got {argtype}"):
        nbc.compile_ptx(poly, (argtype[::1], types.float32[::1]))


def test_poly_exp2_simulated_accuracy():
    x = np.concatenate([np.linspace(-125.0, 127.0, 200001), np.linspace(-1, 1, 20001)]).astype(np.float32)
    y = np.array([sim_poly_exp2(v) for v in x[::7]], np.float64)
    exact = np.exp2(x[::7].astype(np.float64))
    rel = np.abs(y - exact) / exact
    assert rel.max() < 7.6e-5, (rel.max(), x[::7][rel.argmax()])


@pytest.mark.parametrize("x, expected", [
    (0.0, 1.0), (-np.inf, 0.0), (-127.0, 0.0), (-126.6, 0.0), (-200.0, 0.0), (1e-40, 1.0)])
def test_poly_exp2_simulated_ends(x, expected):
    y = sim_poly_exp2(np.float32(x))
    assert type(y) is np.float32 and abs(y - expected) <= 7.6e-5 * expected and not np.signbit(y)


def test_poly_exp2_simulated_nan_and_refusals():
    assert np.isnan(sim_poly_exp2(np.float32(np.nan)))
    for x in (127.5, np.inf):
        with pytest.raises(SimulatedMisuse, match="poly_exp2: x = .* is above 127"):
            sim_poly_exp2(np.float32(x))
    with pytest.raises(TypeError, match="poly_exp2: x must be a float32, got float 0.5"):
        sim_poly_exp2(0.5)
