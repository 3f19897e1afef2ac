"""CPU, no simulator: the kernels of tests/parity_kernels.py compiled for sm_90a. Those the simulator refuses
(tests/sim/test_sim_parity.py) fail to compile, at the same line; those it runs compile. The shape rule has the
same words on both sides."""
import re

import pytest
from numba import cuda
from numba.core.errors import TypingError
from numba.cuda import types

import numbatma  # noqa: F401 - (installs the hooks)
import parity_kernels as pk
from numbatma import compile as nbc

SIG = (types.float32[:], types.int32)
SM90A = (9, 0, "a")


@pytest.mark.parametrize("name", sorted(pk.ACCEPTED))
def test_accepted_kernels_compile_for_sm90a(name):
    kernel, _ = pk.ACCEPTED[name]
    ptx, _ = cuda.compile_ptx(kernel, SIG, cc=SM90A)
    assert ".target sm_90a" in ptx


@pytest.mark.parametrize("name", sorted(pk.REFUSED))
def test_refused_kernels_fail_to_compile_for_sm90a(name):
    kernel, text, words = pk.REFUSED[name]
    filename, line = pk.line_of(kernel, text)
    with pytest.raises(TypingError) as info:
        cuda.compile_ptx(kernel, SIG, cc=SM90A)
    message = str(info.value)
    if words == pk.SHAPE_WORDS:  # (numbatma's shared-array typer: the simulator's words, at the user's line)
        assert re.match(rf"{re.escape(filename)}:{line}: {words}", message), message
    else:  # (numba's own refusal of getitem on an accumulator with a non-literal index)
        assert "getitem" in message and "wgmma_accumulator" in message, message


def test_numbatma_compile_refuses_a_computed_shape():
    """numbatma.compile (the offline check docs/simulator.md recommends) refuses the same kernel."""
    with pytest.raises(TypingError, match=pk.SHAPE_WORDS + r".*; got int32"):
        nbc.compile_ptx(pk.shared_from_argument, SIG)
