"""CPU: the accumulator family (wgmma_map, wgmma_row_reduce) compiles and links for every target (no wgmma
needed), inlines the element functions (no call), reduces with two butterfly shuffles per row half, keeps
everything in registers; misuse is a typing error in the user's terms."""
import pytest
from numba import cuda, types

from numbatma import compile as nbc
from numbatma.intrinsics import wgmma_map, wgmma_map2, wgmma_row_reduce, wgmma_store_global, wgmma_zeros, wgmma_zeros_f16

import accumulator_kernels as K


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_120a"])
def test_map_and_reduce_compile_everywhere(arch):
    ptx = nbc.compile_ptx(K.map_and_reduce_kernel, K.SIGNATURE, arch=arch)
    assert ptx.count("shfl.sync.bfly.b32") == 8  # two reductions x two row halves x two steps
    assert "call" not in ptx.replace("call.uni", "")  # the element functions are inlined
    sass = nbc.sass(nbc.link_cubin(ptx, arch=arch))
    assert "STL" not in sass and "LDL" not in sass


def _typing_error(kernel, sig=(types.float32[:, ::1],)):
    from numba.core.errors import TypingError

    with pytest.raises(TypingError) as info:
        nbc.compile_ptx(kernel, sig)
    return str(info.value)


@cuda.jit(device=True, inline="always")
def two_args(a, b):
    return a + b


@cuda.jit(device=True, inline="always")
def as_tuple(v, half, col, ex):
    return (v, v)


def test_map_needs_a_device_function_of_four_arguments():
    def not_a_function(out):
        acc = wgmma_map(wgmma_zeros(64), 3, 0)
        wgmma_store_global(acc, out, 0, 0)

    assert "wgmma_map: fn must be a cuda.jit(device=True) function taking (value, half, col, extra)" in \
        _typing_error(not_a_function)

    def wrong_arity(out):
        acc = wgmma_map(wgmma_zeros(64), two_args, 0)
        wgmma_store_global(acc, out, 0, 0)

    assert "wgmma_map: fn taking (value, half, col, extra)" in _typing_error(wrong_arity)

    def returns_tuple(out):
        acc = wgmma_map(wgmma_zeros(64), as_tuple, 0)
        wgmma_store_global(acc, out, 0, 0)

    assert "must return a number" in _typing_error(returns_tuple)


def test_float16_accumulators_and_bad_init_refused():
    def f16(out):
        acc = wgmma_map(wgmma_zeros_f16(64), K.from_array, (out, 0))
        wgmma_store_global(acc, out, 0, 0)

    assert "wgmma_map: expected a float32 wgmma accumulator" in _typing_error(f16)

    def bad_init(out):
        a, b = wgmma_row_reduce(wgmma_zeros(64), K.fmax, (1, 2))
        out[0, 0] = a

    assert "wgmma_row_reduce: init must be a number" in _typing_error(bad_init)


@cuda.jit(device=True, inline="always")
def _weighted_difference(a, b, half, col, ex):
    return (a - b) * ex + col


def _map2_kernel(x, y, out):
    """out = (x - y) * 0.5 + column, through two accumulators (wgmma_map2) of one warpgroup."""
    t = cuda.threadIdx.x
    row0 = 16 * (t // 32) + (t % 32) // 4
    a = wgmma_map(wgmma_zeros(64), K.from_array, (x, row0))
    b = wgmma_map(wgmma_zeros(64), K.from_array, (y, row0))
    wgmma_store_global(wgmma_map2(a, b, _weighted_difference, 0.5), out, 0, 0)


MAP2_SIG = (types.float32[:, ::1], types.float32[:, ::1], types.float32[:, ::1])


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_120a"])
def test_map2_compiles_everywhere_inlined_in_registers(arch):
    ptx = nbc.compile_ptx(_map2_kernel, MAP2_SIG, arch=arch)
    assert "call" not in ptx.replace("call.uni", "")
    sass = nbc.sass(nbc.link_cubin(ptx, arch=arch))
    assert "STL" not in sass and "LDL" not in sass


def test_map2_refuses_accumulators_of_two_shapes():
    @cuda.jit(device=True, inline="always")
    def diff(a, b, half, col, ex):
        return a - b

    def kernel(x):
        c = wgmma_map2(wgmma_zeros(64), wgmma_zeros(128), diff, 0)
        x[0, 0] = c[0]

    assert "wgmma_map2: a and b must be accumulators of one shape" in _typing_error(kernel)
