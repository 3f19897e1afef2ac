"""Kernel bodies for the simulator/compiler parity tests (issue 22): the same Python functions are compiled for
sm_90a without the simulator (tests/test_sim_parity_cpu.py) and run under it (tests/sim/test_sim_parity.py).
A kernel in REFUSED must fail both ways with the words of its pattern, at its own line; one in ACCEPTED must
compile and run. Each kernel writes ``out[0]`` (and more) so the simulator tests can check what ran."""
import numpy as np
from numba import cuda

from numbatma.intrinsics import wgmma_zeros

R, C = 4, 8
SHAPE = (R, C)
G = 3  # a global register index


def shared_literal(out, n):
    a = cuda.shared.array(8, np.float32)
    a[0] = 8.0
    out[0] = a[0]


def shared_global_tuple(out, n):
    a = cuda.shared.array((R, C), np.float32)
    b = cuda.shared.array(SHAPE, np.float32)
    a[R - 1, C - 1] = 1.0
    b[R - 1, C - 1] = 2.0
    out[0] = a[R - 1, C - 1] + b[R - 1, C - 1]


def shared_local_constant(out, n):
    m = R
    k = 2
    a = cuda.shared.array((m, k), np.float32)
    a[m - 1, k - 1] = 5.0
    out[0] = a[m - 1, k - 1]


def make_shared_closure(size):
    def shared_closure(out, n):
        a = cuda.shared.array(size, np.float32)
        a[size - 1] = 7.0
        out[0] = a[size - 1]

    return shared_closure


def shared_from_argument(out, n):
    a = cuda.shared.array(n, np.float32)
    out[0] = a[0]


def shared_from_thread_index(out, n):
    a = cuda.shared.array(cuda.threadIdx.x + 1, np.float32)
    out[0] = a[0]


def shared_tuple_with_argument(out, n):
    a = cuda.shared.array((R, n), np.float32)
    out[0] = a[0, 0]


def shared_global_arithmetic(out, n):
    a = cuda.shared.array(R * 2, np.float32)
    out[0] = a[0]


def shared_from_branch(out, n):
    m = 4 if n > 0 else 8
    a = cuda.shared.array(m, np.float32)
    out[0] = a[0]


def shared_from_array_shape(out, n):
    a = cuda.shared.array(out.shape[0], np.float32)
    out[0] = a[0]


def accumulator_constant_indices(out, n):
    acc = wgmma_zeros(64)
    j = 2
    out[0] = acc[0] + acc[G] + acc[j] + acc[-1] + 1.0


def accumulator_argument_index(out, n):
    acc = wgmma_zeros(64)
    out[0] = acc[n]


def accumulator_loop_index(out, n):
    acc = wgmma_zeros(64)
    for i in range(4):
        out[i] = acc[i]


def accumulator_computed_index(out, n):
    acc = wgmma_zeros(64)
    out[0] = acc[G + 1]


ACCEPTED = {  # name -> (kernel, out[0] after one launch)
    "shared_literal": (shared_literal, 8.0),
    "shared_global_tuple": (shared_global_tuple, 3.0),
    "shared_local_constant": (shared_local_constant, 5.0),
    "shared_closure": (make_shared_closure(16), 7.0),
    "accumulator_constant_indices": (accumulator_constant_indices, 1.0),
}

SHAPE_WORDS = r"cuda\.shared\.array: the shape must be a compile-time constant"
INDEX_WORDS = r"accumulator\[i\]: the register index must be a compile-time constant"

REFUSED = {  # name -> (kernel, the line's text, the rule's words)
    "shared_from_argument": (shared_from_argument, "cuda.shared.array(n,", SHAPE_WORDS),
    "shared_from_thread_index": (shared_from_thread_index, "cuda.threadIdx.x + 1", SHAPE_WORDS),
    "shared_tuple_with_argument": (shared_tuple_with_argument, "(R, n)", SHAPE_WORDS),
    "shared_global_arithmetic": (shared_global_arithmetic, "R * 2", SHAPE_WORDS),
    "shared_from_branch": (shared_from_branch, "cuda.shared.array(m,", SHAPE_WORDS),
    "shared_from_array_shape": (shared_from_array_shape, "out.shape[0]", SHAPE_WORDS),
    "accumulator_argument_index": (accumulator_argument_index, "acc[n]", INDEX_WORDS),
    "accumulator_loop_index": (accumulator_loop_index, "acc[i]", INDEX_WORDS),
    "accumulator_computed_index": (accumulator_computed_index, "acc[G + 1]", INDEX_WORDS),
}


def line_of(kernel, text):
    """(file, line) of the first line of ``kernel`` holding ``text``."""
    import inspect

    lines, first = inspect.getsourcelines(kernel)
    for i, line in enumerate(lines):
        if text in line:
            return inspect.getsourcefile(kernel), first + i
    raise ValueError(f"{text!r} is not in {kernel.__name__}")
