"""Simulator/compiler parity (issue 22): what the GPU build refuses while typing, the simulator refuses with the
same words at the same kernel line, and what it accepts runs (tests/parity_kernels.py holds the kernels;
tests/test_sim_parity_cpu.py compiles the same ones for sm_90a). Also: the GPU's cuda.jit options, and
simulated launches from several host threads at once."""
import re
import threading

import numpy as np
import pytest
from numba import cuda

import numbatma
import parity_kernels as pk
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load,
    tma_store,
)
from numbatma.intrinsics._sim import SimulatedTypingError


def _launch(kernel, threads=128, n=3):
    out = np.zeros(4, np.float32)
    cuda.jit(kernel)[1, threads](out, np.int32(n))
    return out


@pytest.mark.parametrize("name", sorted(pk.ACCEPTED))
def test_constant_operands_run(name):
    kernel, want = pk.ACCEPTED[name]
    assert _launch(kernel)[0] == want


@pytest.mark.parametrize("name", sorted(pk.REFUSED))
def test_computed_operands_are_refused_at_their_line(name):
    kernel, text, words = pk.REFUSED[name]
    filename, line = pk.line_of(kernel, text)
    with pytest.raises(SimulatedTypingError) as info:
        _launch(kernel)
    message = str(info.value)
    assert re.search(rf"{re.escape(filename)}:{line}: {words}", message), message
    assert "got " in message  # (the operand as the kernel spells it)


def test_refusal_names_the_operand():
    with pytest.raises(SimulatedTypingError, match=r"got 'cuda\.threadIdx\.x \+ 1'"):
        _launch(pk.shared_from_thread_index)
    with pytest.raises(SimulatedTypingError, match=r"got the run-time index 'n'"):
        _launch(pk.accumulator_argument_index)


# -- cuda.jit options -----------------------------------------------------------------------------------------
def test_compile_only_jit_options_are_accepted():
    @cuda.jit(max_registers=64, lineinfo=True, opt=True, fastmath=True, cache=False, lto=False, link=[],
              launch_bounds=(128, 1), inline="always", forceinline=False, shared_memory_carveout="MaxShared",
              debug=False)
    def fill(out):
        out[cuda.threadIdx.x] = cuda.threadIdx.x + 1

    out = np.zeros(32, np.int32)
    fill[1, 32](out)
    assert out.tolist() == list(range(1, 33))


def test_jit_options_with_a_signature():
    @cuda.jit("void(float32[:])", max_registers=32)
    def double(x):
        x[cuda.threadIdx.x] *= 2

    x = np.arange(8, dtype=np.float32)
    double[1, 8](x)
    assert x.tolist() == [2.0 * i for i in range(8)]


def test_unknown_jit_option_is_refused_like_the_gpu():
    with pytest.raises(TypeError, match=r"cuda\.jit: unknown option 'max_regs'"):
        cuda.jit(max_regs=64)


def test_cluster_launch_bounds_make_a_cluster_kernel():
    @cuda.jit(launch_bounds=numbatma.cluster_launch_bounds((1, 1, 1)))
    def single(out):
        out[0] = 1

    out = np.zeros(1, np.int32)
    single[1, 1](out)
    assert out[0] == 1 and single._numbatma_cluster_dims == (1, 1, 1)

    @cuda.jit(launch_bounds=numbatma.cluster_launch_bounds((2, 1, 1)))
    def pair(out):
        out[0] = 1

    with pytest.raises(NotImplementedError) as info:
        pair[2, 1](out)
    from numbatma.cluster import _SIM_MESSAGE

    assert str(info.value) == _SIM_MESSAGE.format(shape=(2, 1, 1))  # (cluster_kernel's words)


# -- launches from several host threads ---------------------------------------------------------------------
BM, BN = 8, 16


@cuda.jit
def tma_copy(src, dst):
    tile = cuda.shared.array((BM, BN), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (cuda.blockIdx.x * BM, 0), bar)
        mbarrier_wait_parity(bar, 0)
        tma_store(dst, (cuda.blockIdx.x * BM, 0), tile)
        bulk_commit_group()
        bulk_wait_group(0)


def _copy_in_threads(configs):
    """Each (blocks, threads) launches tma_copy from its own host thread, all at once; returns [(src, dst)]."""
    results, errors = [], []
    start = threading.Barrier(len(configs))

    def work(i, blocks, threads):
        try:
            src = np.arange(blocks * BM * BN, dtype=np.float32).reshape(blocks * BM, BN) + 1000 * i
            dst = np.zeros_like(src)
            start.wait()
            for _ in range(3):
                tma_copy[blocks, threads](numbatma.TensorMap(src, (BM, BN)), numbatma.TensorMap(dst, (BM, BN)))
            results.append((src, dst))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=work, args=(i, *c)) for i, c in enumerate(configs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not errors, errors
    assert len(results) == len(configs)
    return results


def test_two_host_threads_launch_at_once():
    for src, dst in _copy_in_threads([(2, 32), (3, 32)]):
        np.testing.assert_array_equal(dst, src)


def test_one_kernel_configured_differently_by_two_threads():
    # (kernel[grid, block] configures a copy: neither thread launches with the other's grid)
    for src, dst in _copy_in_threads([(1, 4), (4, 64), (2, 1)]):
        np.testing.assert_array_equal(dst, src)


def test_configuring_returns_a_copy():
    first, second = tma_copy[1, 32], tma_copy[2, 64]
    assert (first.grid_dim, first.block_dim) != (second.grid_dim, second.block_dim)
    assert first.py_func is tma_copy.py_func


# -- Pipeline methods with the wrong number of arguments: the GPU build's words (tests/test_typing_messages_cpu.py)
@cuda.jit
def pipeline_misuse(out, bug):
    pipe = Pipeline(2, 1, 1)
    if bug == 1:
        pipe.producer_acquire(1)
    elif bug == 2:
        pipe.consumer_release(0, 1)
    out[0] = pipe.stages


@pytest.mark.parametrize("bug, words", [
    (1, r"Pipeline\.producer_acquire takes no arguments, got 1 .*call it as pipe\.producer_acquire\(\)"),
    (2, r"Pipeline\.consumer_release takes no arguments, got 2 .*call it as pipe\.consumer_release\(\)"),
])
def test_pipeline_method_arity(bug, words):
    filename, line = pk.line_of(pipeline_misuse.py_func, "pipe.producer_acquire(1)" if bug == 1 else "consumer_release(0, 1)")
    with pytest.raises(SimulatedTypingError, match=rf"{re.escape(filename)}:{line}: {words}"):
        pipeline_misuse[1, 1](np.zeros(1, np.int32), bug)
    out = np.zeros(1, np.int32)
    pipeline_misuse[1, 1](out, 0)
    assert out[0] == 2


# -- a plain Python function where a device function goes (the GPU: tests/test_typing_messages_cpu.py) -------------
def _plain_register(x, half, col, extra):
    return x + extra


def _plain_max(a, b):
    return max(a, b)


@cuda.jit(device=True)
def _device_register(x, half, col, extra):
    return x + extra


def _map_kernel(out, n):
    from numbatma.intrinsics import wgmma_map, wgmma_zeros

    acc = wgmma_map(wgmma_zeros(64), _plain_register, 1.0)  # <- map
    out[0] = acc[0]


def _reduce_kernel(out, n):
    from numbatma.intrinsics import wgmma_row_reduce, wgmma_zeros

    lo, hi = wgmma_row_reduce(wgmma_zeros(64), _plain_max, 0.0)  # <- reduce
    out[0] = lo


@pytest.mark.parametrize("kernel,op,line", [(_map_kernel, "wgmma_map", "map"),
                                            (_reduce_kernel, "wgmma_row_reduce", "reduce")])
def test_a_plain_python_function_is_refused_as_the_gpu_refuses_it(kernel, op, line):
    filename, number = pk.line_of(kernel, f"# <- {line}")
    with pytest.raises(SimulatedTypingError, match=rf"{re.escape(filename)}:{number}: {op}: '_plain_\w+' is a plain "
                                                   r"Python function.*@cuda.jit\(device=True\)"):
        _launch(kernel)


def test_a_device_function_runs_in_wgmma_map():
    from numbatma.intrinsics import wgmma_map, wgmma_zeros

    def kernel(out, n):
        acc = wgmma_map(wgmma_zeros(64), _device_register, 2.5)
        out[0] = acc[0]

    assert _launch(kernel)[0] == 2.5
