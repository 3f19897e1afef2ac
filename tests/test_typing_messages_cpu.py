"""Typing errors (issue 22), compiled offline: a Pipeline method called with the wrong number of arguments, a
plain Python function where a device function goes (wgmma_map, wgmma_row_reduce, a call), and grid dependency
control compiled for a GPU older than sm_90. Each error is numbatma's (a numba TypingError), starts with the
kernel's file:line (the line marked ``# <-``), says what to do, and carries no "No implementation" wall."""
import inspect
import os

import numpy as np
import pytest
from numba import cuda, types
from numba.core.errors import TypingError as NumbaTypingError
from numba.cuda.typing.typeof import typeof

import numbatma
from numbatma._numba_internals import offline_target
from numbatma.errors import TypingError
from numbatma.intrinsics import (
    Pipeline,
    griddepcontrol_launch_dependents,
    griddepcontrol_wait,
    wgmma_map,
    wgmma_row_reduce,
    wgmma_zeros,
)

from fakes import FakeCudaArray

HERE = os.path.abspath(__file__)
D2T = typeof(numbatma.TensorMap(FakeCudaArray((64, 64), np.float32, ptr=1 << 20), (16, 32)))
SM90A, SM80 = (9, 0, "a"), (8, 0)
CASES = {}  # name -> (kernel, signature, compute capability, words the first line holds)


def case(sig, cc, *words):
    def register(kernel):
        CASES[kernel.__name__] = (kernel, sig, cc, words)
        return kernel

    return register


# -- Pipeline methods with the wrong number of arguments --------------------------------------------------------
@case((D2T,), SM90A, "Pipeline.producer_acquire takes no arguments, got 1", "call it as pipe.producer_acquire()")
def k_acquire_with_a_stage(d):
    pipe = Pipeline(2, 1, 1)
    pipe.producer_acquire(1)  # <-


@case((D2T,), SM90A, "Pipeline.consumer_wait takes no arguments, got 1", "call it as pipe.consumer_wait()")
def k_wait_with_a_stage(d):
    pipe = Pipeline(2, 1, 1)
    s = pipe.consumer_wait(3)  # <-
    pipe.consumer_release()
    return s


@case((D2T,), SM90A, "Pipeline.consumer_release takes no arguments, got 2", "call it as pipe.consumer_release()")
def k_release_with_arguments(d):
    pipe = Pipeline(2, 1, 1)
    pipe.consumer_release(0, 1)  # <-


@case((D2T,), SM90A, "Pipeline.load takes 3 argument(s) (tile, desc, coords), got 2",
      "missing a required argument: 'coords'", "call it as pipe.load(tile, desc, coords)")
def k_load_without_coordinates(d):
    ring = cuda.shared.array((2, 16, 32), np.float32, alignment=128)
    pipe = Pipeline(2, 1, 1)
    pipe.producer_acquire()
    pipe.load(ring[0], d)  # <-


@case((D2T,), SM90A, "Pipeline.producer_commit takes no arguments, got 1", "call it as pipe.producer_commit()")
def k_commit_with_a_barrier(d):
    pipe = Pipeline(2, 1, 1)
    pipe.producer_commit(d)  # <-


# -- plain Python functions where a device function goes ------------------------------------------------------
def plain_register(v, half, col, ex):
    return v + ex


def plain_max(a, b):
    return max(a, b)


@cuda.jit(device=True, inline="always")
def device_register(v, half, col, ex):
    return v + ex


@case((D2T,), SM90A, "'plain_register' is a plain Python function", "@cuda.jit(device=True)", "wgmma_map")
def k_map_plain_function(d):
    acc = wgmma_map(wgmma_zeros(64), plain_register, 1.0)  # <-
    return acc[0]


def _closure_kernel():
    def local_fn(v, half, col, ex):
        return v

    def k_map_plain_closure(d):
        acc = wgmma_map(wgmma_zeros(64), local_fn, 0)  # <-
        return acc[0]

    return k_map_plain_closure


k_map_plain_closure = case((D2T,), SM90A, "'local_fn' is the plain Python function", "@cuda.jit(device=True)")(
    _closure_kernel())


@case((D2T,), SM90A, "'plain_max' is a plain Python function", "@cuda.jit(device=True)")
def k_row_reduce_plain_function(d):
    m0, m1 = wgmma_row_reduce(wgmma_zeros(64), plain_max, np.float32(0))  # <-
    return m0 + m1


@case((D2T,), SM90A, "'plain_max' is a plain Python function", "@cuda.jit(device=True)")
def k_call_plain_function(d):
    return plain_max(1, 2)  # <-


# -- grid dependency control below sm_90 -----------------------------------------------------------------------
@case((D2T,), SM80, "griddepcontrol_wait: grid dependency control (griddepcontrol.wait) needs compute capability "
                    "9.0 or newer, but this kernel is compiled for sm_80", "compile it for sm_90a")
def k_griddep_wait_sm80(d):
    griddepcontrol_wait()  # <-


@case((D2T,), (8, 9), "griddepcontrol_launch_dependents: grid dependency control (griddepcontrol.launch_dependents) "
                      "needs compute capability 9.0 or newer, but this kernel is compiled for sm_89",
      "leave the call out of kernels for older GPUs")
def k_griddep_launch_sm89(d):
    griddepcontrol_launch_dependents()  # <-


def _compile(kernel, sig, cc):
    with offline_target(cc):  # (device functions ask the current device for its compute capability otherwise)
        return cuda.compile_ptx(kernel, sig, cc=cc)


def _marked_line(kernel):
    lines, first = inspect.getsourcelines(kernel)
    return first + next(i for i, line in enumerate(lines) if "# <-" in line)


def _check_refused(kernel, sig, cc, words):
    with pytest.raises(NumbaTypingError) as info:
        _compile(kernel, sig, cc)
    exc = info.value
    assert isinstance(exc, TypingError), f"not numbatma's error:\n{exc}"
    text = str(exc)
    line = text.splitlines()[0]
    head = f"{kernel.__code__.co_filename}:{_marked_line(kernel)}: "
    assert line.startswith(head), f"expected {head!r}..., got {line!r}"
    assert os.path.samefile(line.split(":", 1)[0], HERE)
    for w in words:
        assert w in line, f"{w!r} not on the first line: {line!r}"
    assert "No implementation of function" not in text and "candidate" not in text, text
    assert "# <-" in text.splitlines()[1]  # the offending source line follows


@pytest.mark.parametrize("name", sorted(CASES))
def test_typing_message(name):
    _check_refused(*CASES[name])


def test_enough_cases():
    assert len(CASES) >= 11


def test_griddep_refused_for_sm80_after_an_sm90a_build():
    """The target check runs at each build (a typer's verdict is cached across targets): a kernel built for sm_90a
    first still fails for sm_80, and the sm_90a build holds the instruction."""
    def k_wait_both(d):
        griddepcontrol_wait()  # <-

    ptx, _ = _compile(k_wait_both, (D2T,), SM90A)
    assert "griddepcontrol.wait;" in ptx
    _check_refused(k_wait_both, (D2T,), SM80, ("griddepcontrol_wait", "compiled for sm_80"))


def test_device_function_is_accepted_by_wgmma_map():
    def k_map_device_function(d, out):
        acc = wgmma_map(wgmma_zeros(64), device_register, np.float32(1.0))
        out[0] = acc[0]

    ptx, _ = _compile(k_map_device_function, (D2T, types.float32[:]), SM90A)
    assert ".target sm_90a" in ptx


def test_correct_pipeline_calls_compile():
    def k_pipeline_ok(d, out):
        ring = cuda.shared.array((2, 16, 32), np.float32, alignment=128)
        pipe = Pipeline(2, 1, 1)
        pipe.producer_acquire()
        pipe.load(ring[0], d, (0, 0))
        pipe.producer_commit()
        s = pipe.consumer_wait()
        pipe.consumer_release()
        out[0] = ring[s, 0, 0]

    ptx, _ = _compile(k_pipeline_ok, (D2T, types.float32[:]), SM90A)
    assert "mbarrier" in ptx
