"""A battery of bad inputs (issue #11, section 2): every error a user can trigger names the user's value or
rule on its first line; typing errors start with the user's kernel file and line (``file:line: op: ...``),
with no "No implementation of function" wall and no second, contradictory candidate error.

Three parts: host (descriptor / cluster / plan constructors), typing (kernels misusing intrinsics, compiled
offline with ``cuda.compile_ptx(..., cc=(9, 0, "a"))``) and launch (arguments checked before a launch, on
the GPU path and in the simulator)."""
import inspect
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, types
from numba.core.errors import TypingError as NumbaTypingError
from numba.cuda.typing.typeof import typeof

import numbatma
import numbatma.kernels as K
from numbatma import Im2colTensorMap, TensorMap, TensorMapArray, TensorMapError
from numbatma import _numba_internals as internals
from numbatma.errors import TypingError
from numbatma.intrinsics import (
    Pipeline,
    bulk_load,
    bulk_reduce,
    bulk_wait_group,
    cp_async,
    cp_async_wait_group,
    elect_one_sync,
    ldmatrix,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_ref,
    mbarrier_wait,
    mbarrier_wait_parity,
    memcpy_async,
    named_barrier_sync,
    prefetch_tensormap,
    setmaxnreg_dec,
    setmaxnreg_inc,
    shared_view,
    stmatrix,
    swizzle_offset,
    swizzled,
    tensormap_acquire,
    tma_load,
    tma_prefetch,
    tma_reduce,
    tma_store,
    wgmma_zeros,
)

from fakes import FakeCudaArray

HERE = os.path.abspath(__file__)


def first_line(exc):
    return str(exc).splitlines()[0] if str(exc) else ""


# =============================================================================================================
# Host: constructors refuse bad values, naming them
# =============================================================================================================
def F(shape, dtype=np.float32, ptr=1 << 20, strides=None):
    return FakeCudaArray(shape, dtype, strides=strides, ptr=ptr)


A2 = F((64, 64))
X4 = F((2, 8, 8, 16), np.float16)
RECORD2 = np.dtype([("a", "i1"), ("b", "i1")])
OTHER = 1 << 24  # a second, non-overlapping allocation


def _tm(**kw):
    return lambda: TensorMap(A2, (16, 32), **kw)


def _box(box):
    return lambda: TensorMap(A2, box)


def _im(**kw):
    args = dict(channels_per_pixel=16, pixels_per_column=8)
    args.update(kw)
    return lambda: Im2colTensorMap(X4, **args)


HOST = {
    # TensorMap: boxes that are not tuples of integers
    "box True": (_box(True), TensorMapError, "box must be a tuple of integers, got True"),
    "box np.True_": (_box(np.bool_(True)), TensorMapError, "box must be a tuple of integers"),
    "box (16, True)": (_box((16, True)), TensorMapError, "box must be a tuple of integers, got (16, True)"),
    "box (16.0, 32)": (_box((16.0, 32)), TensorMapError, "box must be a tuple of integers, got (16.0, 32)"),
    "box np.float32": (_box(np.float32(16)), TensorMapError, "box must be a tuple of integers"),
    "box np.float64 entry": (_box((np.float64(16), 32)), TensorMapError, "box must be a tuple of integers"),
    "box string": (_box("16"), TensorMapError, "box must be a tuple of integers"),
    "box None": (_box(None), TensorMapError, "box must be a tuple of integers, got None"),
    "box (16, None)": (_box((16, None)), TensorMapError, "box must be a tuple of integers"),
    "box complex": (_box((16, 32j)), TensorMapError, "box must be a tuple of integers"),
    "box rank short": (_box((16,)), TensorMapError, "box (16,) has 1 entries but"),
    "box rank long": (_box((1, 16, 32)), TensorMapError, "has 3 entries but"),
    "box zero": (_box((0, 32)), TensorMapError, "box (0, 32) has 0 along dimension 0"),
    "box negative": (_box((-16, 32)), TensorMapError, "has -16 along dimension 0"),
    "box too large": (_box((512, 32)), TensorMapError, "has 512 along dimension 0"),
    "box row 12 bytes": (_box((16, 3)), TensorMapError, "innermost box dimension is 3 float32 elements = 12 bytes"),
    "box wider than swizzle": (_tm(swizzle=32), TensorMapError, "innermost box dimension is 32 float32"),
    "element_strides float": (_tm(element_strides=(1.0, 1)), TensorMapError, "element_strides must be a tuple of"),
    "element_strides bool": (_tm(element_strides=(True, 1)), TensorMapError, "element_strides must be a tuple"),
    "element_strides zero": (_tm(element_strides=(0, 1)), TensorMapError, "element_strides"),
    "element_strides 9": (_tm(element_strides=(9, 1)), TensorMapError, "element_strides"),
    "swizzle 7": (_tm(swizzle=7), TensorMapError, "swizzle"),
    "swizzle name": (_tm(swizzle="diagonal"), TensorMapError, "swizzle"),
    "oob_fill name": (_tm(oob_fill="garbage"), TensorMapError, "oob_fill"),
    "l2_promotion 100": (_tm(l2_promotion=100), TensorMapError, "l2_promotion"),
    "interleave 3": (_tm(interleave=3), TensorMapError, "interleave"),
    "allow_store_overhang str": (_tm(allow_store_overhang="yes"), TensorMapError, "allow_store_overhang must be True"),
    "element e4m3 on float32": (_tm(element="e4m3"), TensorMapError, "e4m3"),
    "element unknown": (lambda: TensorMap(F((64, 64), np.uint8), (16, 32), element="e9m9"), TensorMapError, "e9m9"),
    # TensorMap: arrays TMA cannot describe
    "2-byte record dtype": (lambda: TensorMap(F((64, 64), RECORD2), (16, 16)), TensorMapError,
                            "2-byte records or raw bytes ('|V2'), not numbers, and are not taken for bfloat16"),
    "raw V2 dtype": (lambda: TensorMap(F((64, 64), np.dtype("V2")), (16, 16)), TensorMapError, "not taken for bfloat16"),
    "complex dtype": (lambda: TensorMap(F((64, 64), np.complex64), (16, 8)), TensorMapError, "complex64"),
    "not an array (list)": (lambda: TensorMap([[1.0]], (1, 4)), TensorMapError, "expected a CUDA array"),
    "not an array (numpy)": (lambda: TensorMap(np.zeros((64, 64), np.float32), (16, 32)), TensorMapError,
                             "ndarray"),
    "rank 6": (lambda: TensorMap(F((2,) * 5 + (16,)), (1,) * 5 + (16,)), TensorMapError, "has rank 6"),
    "misaligned address": (lambda: TensorMap(F((64, 64), ptr=(1 << 20) + 4), (16, 32)), TensorMapError, "16"),
    "row stride not 16B": (lambda: TensorMap(F((64, 60), strides=(244, 4)), (16, 32)), TensorMapError, "244"),
    "innermost not contiguous": (lambda: TensorMap(F((64, 64), strides=(512, 8)), (16, 32)), TensorMapError,
                                 "stride"),
    # Im2colTensorMap
    "im2col channels 0": (_im(channels_per_pixel=0), TensorMapError, "channels_per_pixel is 0; it must be in 1..256"),
    "im2col channels True": (_im(channels_per_pixel=True), TensorMapError,
                             "channels_per_pixel must be an integer, got True"),
    "im2col channels float": (_im(channels_per_pixel=16.0), TensorMapError, "channels_per_pixel must be an integer"),
    "im2col channels np.float": (_im(channels_per_pixel=np.float64(16)), TensorMapError,
                                 "channels_per_pixel must be an integer"),
    "im2col pixels huge": (_im(pixels_per_column=100000), TensorMapError, "pixels_per_column is 100000"),
    "im2col pixels bool": (_im(pixels_per_column=False), TensorMapError, "pixels_per_column must be an integer"),
    "im2col corner float": (_im(pixel_box_lower_corner=(0.0, 0)), TensorMapError,
                            "pixel_box_lower_corner must be a tuple of integers, got (0.0, 0)"),
    "im2col corner True": (_im(pixel_box_lower_corner=True), TensorMapError,
                           "pixel_box_lower_corner must be a tuple of integers, got True"),
    "im2col corner length": (_im(pixel_box_upper_corner=(0, 0, 0)), TensorMapError,
                             "pixel_box_upper_corner (0, 0, 0) has 3 entries"),
    "im2col element_strides float": (_im(element_strides=(1, 1, 1.5, 1)), TensorMapError,
                                     "element_strides must be a tuple of integers"),
    "im2col rank 2": (lambda: Im2colTensorMap(F((8, 16), np.float16), channels_per_pixel=16, pixels_per_column=8),
                      TensorMapError, "has rank 2; im2col descriptors describe rank 3 to 5"),
    "im2col record dtype": (lambda: Im2colTensorMap(F((2, 8, 8, 16), RECORD2), channels_per_pixel=16,
                                                    pixels_per_column=8), TensorMapError, "2-byte records"),
    # TensorMapArray
    "TensorMapArray empty": (lambda: TensorMapArray([]), TensorMapError, "needs at least one TensorMap"),
    "TensorMapArray int": (lambda: TensorMapArray(5), TensorMapError, "expected a sequence of TensorMaps"),
    "TensorMapArray one TensorMap": (lambda: TensorMapArray(TensorMap(A2, (16, 32))), TensorMapError,
                                     "expected a sequence of TensorMaps (e.g. a list), got TensorMap"),
    "TensorMapArray array item": (lambda: TensorMapArray([TensorMap(A2, (16, 32)), A2]), TensorMapError,
                                  "item 1 is a FakeCudaArray, not a TensorMap"),
    "TensorMapArray mixed types": (lambda: TensorMapArray([TensorMap(A2, (16, 32)), TensorMap(A2, (16, 16))]),
                                   TensorMapError, "every descriptor must have the same kernel type"),
    # clusters
    "cluster 0": (lambda: numbatma.cluster_kernel((0, 1, 1)), ValueError, "at least 1, got (0, 1, 1)"),
    "cluster float": (lambda: numbatma.cluster_kernel((2.0, 1, 1)), TypeError, "must hold ints, got (2.0, 1, 1)"),
    "cluster 16 CTAs": (lambda: numbatma.cluster_kernel((16, 1, 1)), ValueError, "holds 16 CTAs"),
    "cluster True": (lambda: numbatma.cluster_kernel(True), TypeError, "got True"),
    "cluster 4-D": (lambda: numbatma.cluster_kernel((1, 1, 1, 1)), TypeError, "got (1, 1, 1, 1)"),
    "cluster_launch_bounds 0": (lambda: numbatma.cluster_launch_bounds((0, 2, 1)), ValueError, "(0, 2, 1)"),
    # plans of numbatma.kernels
    "StreamCopy shapes": (lambda: K.StreamCopy(A2, F((64, 32), ptr=OTHER)), TensorMapError, "shape (64, 32)"),
    "StreamCopy dtypes": (lambda: K.StreamCopy(A2, F((64, 64), np.float16, ptr=OTHER)), TensorMapError, "float16"),
    "StreamCopy stages 0": (lambda: K.StreamCopy(A2, F((64, 64), ptr=OTHER), stages=0), TensorMapError,
                            "stages must be an integer in 1..32, got 0"),
    "StreamCopy stages True": (lambda: K.StreamCopy(A2, F((64, 64), ptr=OTHER), stages=True), TensorMapError,
                               "stages must be an integer in 1..32, got True"),
    "Axpy stages float": (lambda: K.Axpy(1.0, A2, F((64, 64), ptr=OTHER), F((64, 64), ptr=OTHER + (1 << 20)),
                                         stages=2.0), TensorMapError, "stages must be an integer in 1..32, got 2.0"),
    "Transpose float tile": (lambda: K.Transpose(F((64, 32)), F((32, 64), ptr=OTHER), tile=(32.0, 32)),
                             TensorMapError, "tile must be a pair (tile_m, tile_n) of integers, got (32.0, 32)"),
    "Transpose stages True": (lambda: K.Transpose(F((64, 32)), F((32, 64), ptr=OTHER), stages=True),
                              TensorMapError, "stages must be an integer in 1..16, got True"),
    "Transpose shape": (lambda: K.Transpose(F((64, 32)), F((64, 32), ptr=OTHER)), TensorMapError, "(32, 64)"),
    "Transpose dtypes": (lambda: K.Transpose(F((64, 32)), F((32, 64), np.float16, ptr=OTHER)), TensorMapError,
                         "same dtype"),
    "Transpose tile": (lambda: K.Transpose(F((64, 32)), F((32, 64), ptr=OTHER), tile=(3, 5)), TensorMapError,
                       "tile (3, 5)"),
    "Gemm float32": (lambda: K.Gemm(F((128, 64)), F((64, 128), ptr=OTHER), F((128, 128), ptr=2 * OTHER)),
                     TensorMapError, "both must be bfloat16 or both float16"),
    "Gemm shapes": (lambda: K.Gemm(F((128, 64), np.float16), F((32, 128), np.float16, ptr=OTHER),
                                   F((128, 128), ptr=2 * OTHER)), TensorMapError, "shapes do not multiply"),
    "Gemm b_layout": (lambda: K.Gemm(F((128, 64), np.float16), F((64, 128), np.float16, ptr=OTHER),
                                     F((128, 128), ptr=2 * OTHER), b_layout="xx"), TensorMapError, "'xx'"),
    "Laplacian5 shapes": (lambda: K.Laplacian5(A2, F((64, 32), ptr=OTHER)), TensorMapError, "shape (64, 32)"),
    "Laplacian5 in place": (lambda: K.Laplacian5(A2, A2), TensorMapError, "overlap"),
    "Laplacian5 walk": (lambda: K.Laplacian5(A2, F((64, 64), ptr=OTHER), walk="diag"), TensorMapError, "'diag'"),
    "Laplacian5 tile bool": (lambda: K.Laplacian5(A2, F((64, 64), ptr=OTHER), tile=(16, True)), TensorMapError,
                             "tile"),
    "Axpy shapes": (lambda: K.Axpy(2.0, A2, F((64, 32), ptr=OTHER), F((64, 64), ptr=2 * OTHER)), TensorMapError,
                    "shape (64, 32)"),
    "TmaCopy box row 12 bytes": (lambda: K.TmaCopy(A2, F((64, 64), ptr=OTHER), box=(16, 3)), TensorMapError,
                                 "12 bytes"),
    "TmaCopy box True": (lambda: K.TmaCopy(A2, F((64, 64), ptr=OTHER), box=True), TensorMapError, "got True"),
    "RowSum out shape": (lambda: K.RowSum(A2, F((32,), ptr=OTHER)), TensorMapError, "shape (32,)"),
    "Softmax out shape": (lambda: K.Softmax(A2, F((64, 32), ptr=OTHER)), TensorMapError, "shape (64, 32)"),
    # this session's entry points (issues 23, 24): warp_roles, devices.sm_count, autotune, Attention's tile options
    "Attention producer_registers 28": (lambda: K.Attention(*_attention_arrays(), producer_registers=28),
                                        TensorMapError, "producer_registers must be one of (24, 32, 40)"),
    "Attention bn 208": (lambda: K.Attention(*_attention_arrays(), bn=208), TensorMapError, "got 208"),
    "Attention autotune with bn": (lambda: K.Attention(*_attention_arrays(), autotune=True, bn=64), TensorMapError,
                                   "got bn=64 as well"),
    "Attention autotune 1": (lambda: K.Attention(*_attention_arrays(), autotune=1), TensorMapError,
                             "autotune must be True or False, got 1"),
    "Attention o_buffer 'yes'": (lambda: K.Attention(*_attention_arrays(), o_buffer="yes"), TensorMapError,
                                 "o_buffer must be True or False, got 'yes'"),
    "Attention o_buffer with too many stages": (lambda: K.Attention(*_attention_arrays(), o_buffer=True, stages=6),
                                                TensorMapError, "(with 2 Q stages and an O buffer)"),
    "Attention autotune with o_buffer": (lambda: K.Attention(*_attention_arrays(), autotune=True, o_buffer=True),
                                         TensorMapError, "got o_buffer=True as well"),
    "Attention carry 'no'": (lambda: K.Attention(*_attention_arrays(), carry="no"), TensorMapError,
                             "carry must be True or False, got 'no'"),
    "Attention carry serial": (lambda: K.Attention(*_attention_arrays(), carry=True, schedule="serial"),
                               TensorMapError, "got schedule='serial'"),
    "Attention carry one Q stage": (lambda: K.Attention(*_attention_arrays(), carry=True, q_stages=1), TensorMapError,
                                    "q_stages=1, o_buffer=False"),
    "Attention autotune with carry": (lambda: K.Attention(*_attention_arrays(), autotune=True, carry=True),
                                      TensorMapError, "got carry=True as well"),
    "Attention cluster_m 3": (lambda: K.Attention(*_attention_arrays(), cluster_m=3), TensorMapError,
                              "cluster_m must be an integer in 1..2, got 3"),
    "Attention cluster_m causal": (lambda: K.Attention(*_attention_arrays(), cluster_m=2, causal=True),
                                   TensorMapError, "is for full attention"),
    "Attention cluster_m odd grid": (lambda: K.Attention(*_attention_arrays(), cluster_m=2, grid=7), TensorMapError,
                                     "grid=7 with cluster_m=2: the grid must be a multiple of the cluster"),
    "Attention lazy_rescale 1": (lambda: K.Attention(*_attention_arrays(), lazy_rescale=1), TensorMapError,
                                 "lazy_rescale must be True or False, got 1"),
    "Attention autotune with lazy_rescale": (lambda: K.Attention(*_attention_arrays(), autotune=True,
                                                                 lazy_rescale=False),
                                             TensorMapError, "got lazy_rescale=False as well"),
    "Attention poly_exp2 0.3": (lambda: K.Attention(*_attention_arrays(), poly_exp2=0.3), TensorMapError,
                                "must be one of 0, 1/8, 2/8, ... 1, got 0.3"),
    "AttentionBackward scale 2": (lambda: K.AttentionBackward(*_backward_arrays(), scale=2.0), TensorMapError,
                                  "|scale| must be at most 1"),
    "AttentionBackward dq_reduce": (lambda: K.AttentionBackward(*_backward_arrays(), dq_reduce="red"),
                                    TensorMapError, "dq_reduce must be"),
    "AttentionBackward head dim 96": (lambda: K.AttentionBackward(*_backward_arrays(d=96)), TensorMapError,
                                      "head dim 96"),
    "AttentionBackward dq off 4 bytes": (lambda: K.AttentionBackward(*_backward_arrays(dq_shift=2)),
                                         TensorMapError, "its rows must start on 4-byte boundaries"),
    "AttentionBackward lse float16": (lambda: K.AttentionBackward(*_backward_arrays(lse=np.float16)),
                                      TensorMapError, "it must be the forward's float32 log-sum-exp"),
    "AttentionBackward dq_split keys at 256": (lambda: K.AttentionBackward(*_backward_arrays(d=256), dq_split="keys"),
                                               TensorMapError, "dq_split='keys' is not a choice at head dim 256"),
    "AttentionBackward deterministic atomic": (lambda: K.AttentionBackward(*_backward_arrays(), deterministic=True,
                                                                           dq_reduce="atomic"),
                                               TensorMapError, "it cannot order dq_reduce='atomic'"),
    "AttentionBackward pingpong 1": (lambda: K.AttentionBackward(*_backward_arrays(), pingpong=1), TensorMapError,
                                     "pingpong must be True or False, got 1"),
    "AttentionBackward kv_stages 3": (lambda: K.AttentionBackward(*_backward_arrays(), kv_stages=3), TensorMapError,
                                      "kv_stages must be an int"),
    "AttentionBackward kv_stages 2 at 256": (lambda: K.AttentionBackward(*_backward_arrays(d=256), kv_stages=2),
                                             TensorMapError, "kv_stages=2 with head dim 256 need"),
    "AttentionBackward kv_registers 1": (lambda: K.AttentionBackward(*_backward_arrays(), kv_registers=1),
                                         TensorMapError, "kv_registers must be True or False, got 1"),
    "AttentionBackward kv_registers at 128": (lambda: K.AttentionBackward(*_backward_arrays(d=128), kv_registers=True),
                                              TensorMapError, "kv_registers=True needs head dim 64"),
    "AttentionBackward dq_writer 1": (lambda: K.AttentionBackward(*_backward_arrays(), dq_writer=1),
                                      TensorMapError, "dq_writer must be True or False, got 1"),
    "AttentionBackward dq_writer with atomics": (
        lambda: K.AttentionBackward(*_backward_arrays(d=128), dq_writer=True, dq_reduce="atomic"), TensorMapError,
        "dq_writer=True hands dq's TMA reduce-adds to a store warp; dq_reduce='atomic' has none"),
    "AttentionBackward dv_first 'no'": (lambda: K.AttentionBackward(*_backward_arrays(), dv_first="no"),
                                        TensorMapError, "dv_first must be True or False, got 'no'"),
    "AttentionBackward persistent 0": (lambda: K.AttentionBackward(*_backward_arrays(), persistent=0),
                                       TensorMapError, "persistent must be True or False, got 0"),
    "AttentionBackward non-persistent deterministic": (
        lambda: K.AttentionBackward(*_backward_arrays(), persistent=False, deterministic=True), TensorMapError,
        "deterministic=True needs persistent=True"),
    "AttentionBackward queries 96": (lambda: K.AttentionBackward(*_backward_arrays(), queries=96),
                                     TensorMapError, "queries must be 64 or 128, got 96"),
    "AttentionBackward queries 128 at 128": (lambda: K.AttentionBackward(*_backward_arrays(d=128), queries=128),
                                             TensorMapError, "needs head dim 64"),
    "AttentionBackward queries 128 with kv_registers": (
        lambda: K.AttentionBackward(*_backward_arrays(), queries=128, kv_registers=True), TensorMapError,
        "kv_registers=True and queries=128 do not fit together"),
    "AttentionBackward queries 128 with dq_split": (
        lambda: K.AttentionBackward(*_backward_arrays(), queries=128, dq_split="keys"), TensorMapError,
        "dq_split='keys' is not a choice with queries=128"),
    "AttentionBackward queries 128 deterministic store warp": (
        lambda: K.AttentionBackward(*_backward_arrays(), queries=128, deterministic=True, dq_writer=True),
        TensorMapError, "deterministic=True with queries=128 orders the consumers' own reduce-adds"),
    "AttentionBackward split_scores at 128": (
        lambda: K.AttentionBackward(*_backward_arrays(d=128), split_scores=True), TensorMapError,
        "between the consumers at head dim 256 (at 64 and 128 each consumer has keys of its own), got head dim 128"),
    "AttentionBackward split_scores yes": (lambda: K.AttentionBackward(*_backward_arrays(d=256), split_scores="yes"),
                                           TensorMapError, "split_scores must be True or False, got 'yes'"),
    "store_warp barriers past 15": (lambda: numbatma.intrinsics.store_warp(2, 13), ValueError,
                                    "barrier ids 13..16 within 1..15, got consumers=2, first_barrier=13"),
    "tile_handoff barrier 16": (lambda: numbatma.intrinsics.tile_handoff(2, 16), ValueError,
                                "a barrier id in 1..15, got consumers=2, barrier=16"),
    "wait_release lag 8": (lambda: numbatma.intrinsics.wait_release(8), ValueError, "lag must be an int in 0..7"),
    "store_buffers wait_in_publish with one buffer": (
        lambda: numbatma.intrinsics.store_buffers(1, wait_in_publish=True), ValueError,
        "wait_in_publish needs count >= 2"),
    "persistent_grid sms 0": (lambda: numbatma.intrinsics.persistent_grid(10, 0), ValueError,
                              "sms must be an int >= 1, got 0"),
    "sm_count device -1": (lambda: numbatma.devices.sm_count(-1), ValueError, "got -1"),
    "autotune empty configs": (lambda: numbatma.autotune.tune("k", [], lambda c: None), ValueError, "got []"),
    "autotune bucket 0": (lambda: numbatma.autotune.bucket(0), ValueError, "got 0"),
}


def _attention_arrays():
    """q, k, v, o and lse of a small float16 attention problem (1 x 2 heads x 100 x 64), apart in memory."""
    return tuple(F((1, 2, 100, 64), np.float16, ptr=(i + 1) * OTHER) for i in range(4)) + (
        F((1, 2, 100), np.float32, ptr=5 * OTHER),)


def _backward_arrays(d=64, dq_shift=0, lse=np.float32):
    """q, k, v, o, do, lse, dq, dk, dv of a small float16 backward problem (1 x 2 heads x 100 x d), apart in memory
    (``dq_shift``: dq's first byte that far past a 16-byte boundary)."""
    arrays = [F((1, 2, 100, d), np.float16, ptr=(i + 1) * OTHER) for i in range(5)]
    arrays.append(F((1, 2, 100), lse, ptr=6 * OTHER))
    arrays += [F((1, 2, 100, d), np.float16, ptr=(i + 7) * OTHER + (dq_shift if i == 0 else 0)) for i in range(3)]
    return arrays


@pytest.fixture(autouse=True)
def _no_gpu_scratch(monkeypatch):
    """AttentionBackward's work arrays (float32 statistics and dq accumulator, int32 turn counters) as stand-ins
    (no GPU here)."""
    import importlib
    import itertools

    ptrs = itertools.count(1)
    monkeypatch.setattr(importlib.import_module("numbatma.kernels.attention_backward"), "_scratch_maker", lambda q: (
        lambda shape, dtype=np.float32: F(shape, dtype, ptr=next(ptrs) << 44)))


@pytest.mark.parametrize("case", list(HOST), ids=list(HOST))
def test_host(case):
    make, exc_type, fragment = HOST[case]
    with pytest.raises(Exception) as info:
        make()
    assert isinstance(info.value, exc_type), f"{type(info.value).__name__}: {info.value}"
    line = first_line(info.value)
    assert fragment in line, f"{fragment!r} not on the first line: {line!r}"


# =============================================================================================================
# Typing: kernels that misuse intrinsics. The offending line carries the marker comment "# <-".
# =============================================================================================================
D2 = TensorMap(A2, (16, 32))  # float32, tile (16, 32) = 2048 bytes
D2T = typeof(D2)
D2_SW = typeof(TensorMap(F((64, 64)), (8, 32), swizzle=128))
DA = typeof(TensorMap(A2, (16, 32)).numba_type)  # (a type, not a value: see DARR)
DARR = numbatma.TensorMapArrayType(D2T)
ARR2 = types.float32[:, ::1]
I64 = types.int64
TYPING = {}


def typing_case(sig, fragment):
    def register(kernel):
        TYPING[kernel.__name__] = (kernel, sig, fragment)
        return kernel

    return register


@cuda.jit(device=True, inline="always")
def _difference(a, b, half, col, extra):
    return a - b


@typing_case((types.float32[::1],), "wgmma_map2: a and b must be accumulators of one shape")
def k_wgmma_map2_shapes(x):
    a = numbatma.intrinsics.wgmma_zeros(64)
    b = numbatma.intrinsics.wgmma_zeros(128)
    c = numbatma.intrinsics.wgmma_map2(a, b, _difference, 0)  # <-
    x[0] = c[0]


@typing_case((types.float64[::1],), "poly_exp2: x must be a float32, got float64")
def k_poly_exp2_float64(x):
    x[0] = numbatma.intrinsics.poly_exp2(x[0])  # <-


@typing_case((types.float64[::1],), "fast_exp2: x must be a float32 (ex2.approx.f32 takes one), got float64")
def k_fast_exp2_float64(x):
    x[0] = numbatma.intrinsics.fast_exp2(x[0])  # <-


@typing_case((D2T,), "tma_load: the shared tile has dtype float16 but the descriptor moves float32 elements")
def k_tma_load_dtype(d):
    t = cuda.shared.array((16, 32), np.float16, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)  # <-


@typing_case((D2_SW,), "tma_load: the shared tile was declared with alignment=128, but TMA needs 1024 bytes (the "
                       "repeat of the descriptor's 128-byte swizzle) for this descriptor: declare it with "
                       "alignment=1024")
def k_tma_load_alignment_below_swizzle_repeat(d):
    t = cuda.shared.array((8, 32), np.float32, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)  # <-


@typing_case((D2T,), "tma_load: the descriptor has rank 2 (box (16, 32)) but 3 coordinates were given")
def k_tma_load_rank(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0, 0), b)  # <-


@typing_case((D2T,), "tma_load: the shared tile (8, 32) holds 1024 bytes but one box")
def k_tma_load_size(d):
    t = cuda.shared.array((8, 32), np.float32, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)  # <-


@typing_case((D2T, ARR2), "tma_load: the shared-memory tile must be a shared-memory array")
def k_tma_load_global_tile(d, a):
    b = cuda.shared.array(1, np.uint64)
    tma_load(a, d, (0, 0), b)  # <-


@typing_case((D2T,), "tma_load: every coordinate must be an integer, got float64")
def k_tma_load_float_coord(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0.5, 0), b)  # <-


@typing_case((D2T,), "tma_load: coordinates must be a tuple of 2 integers")
def k_tma_load_scalar_coord(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, 0, b)  # <-


@typing_case((ARR2,), "tma_load: the descriptor operand must be a numbatma.TensorMap, got array(float32")
def k_tma_load_array_desc(a):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, a, (0, 0), b)  # <-


@typing_case((D2T,), "tma_load: the mbarrier operand must be a shared uint64 array")
def k_tma_load_bar_dtype(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    b = cuda.shared.array(1, np.int32)
    tma_load(t, d, (0, 0), b)  # <-


@typing_case((D2T, types.uint64[::1]), "tma_load: the mbarrier must live in shared memory")
def k_tma_load_global_bar(d, g):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    tma_load(t, d, (0, 0), g)  # <-


@typing_case((D2T,), "tma_load: takes (dst, desc, coords, bar); the call passes 3 argument(s)")
def k_tma_load_arity(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    tma_load(t, d, (0, 0))  # <-


@typing_case((D2T,), "tma_load: the shared tile must be C-contiguous")
def k_tma_load_layout(d):
    t = cuda.shared.array((32, 16), np.float32, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t.T, d, (0, 0), b)  # <-


@typing_case((D2T,), "tma_store: the shared tile has dtype int32 but the descriptor moves float32")
def k_tma_store_dtype(d):
    t = cuda.shared.array((16, 32), np.int32, alignment=128)
    tma_store(d, (0, 0), t)  # <-


@typing_case((D2T,), "tma_store: the descriptor has rank 2 (box (16, 32)) but 1 coordinates were given")
def k_tma_store_rank(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    tma_store(d, (0,), t)  # <-


@typing_case((ARR2,), "tma_store: the descriptor operand must be a numbatma.TensorMap")
def k_tma_store_array(a):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    tma_store(a, (0, 0), t)  # <-


@typing_case((D2T,), "tma_reduce: unknown reduction 'mul'")
def k_tma_reduce_kind(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    tma_reduce("mul", d, (0, 0), t)  # <-


@typing_case((D2T,), "tma_reduce: reduction 'max' is not defined for float32")
def k_tma_reduce_max_f32(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    tma_reduce("max", d, (0, 0), t)  # <-


@typing_case((D2T,), "tma_prefetch: the descriptor has rank 2 (box (16, 32)) but 3 coordinates")
def k_tma_prefetch_rank(d):
    tma_prefetch(d, (0, 0, 0))  # <-


@typing_case((ARR2,), "prefetch_tensormap: the descriptor must be a numbatma.TensorMap")
def k_prefetch_tensormap_array(a):
    prefetch_tensormap(a)  # <-


@typing_case((D2_SW,), "swizzled: the shared tile has dtype int32 but the descriptor moves float32")
def k_swizzled_dtype(d):
    t = cuda.shared.array((8, 32), np.int32, alignment=1024)
    swizzled(t, d)  # <-


@typing_case((D2_SW,), "swizzled view: the view of a rank-2 box (8, 32) takes 2 indices")
def k_swizzled_index_count(d):
    t = cuda.shared.array((8, 32), np.float32, alignment=1024)
    v = swizzled(t, d)
    v[0] = 1.0  # <-


@typing_case((I64,), "swizzle_offset: the swizzle span must be a compile-time constant")
def k_swizzle_offset_runtime(n):
    swizzle_offset(n, 0)  # <-


@typing_case((), "swizzle_offset: the swizzle span must be one of (0, 32, 64, 128)")
def k_swizzle_offset_span():
    swizzle_offset(48, 0)  # <-


@typing_case((), "mbarrier_init: count must be an integer, got float64")
def k_mbarrier_init_float_count():
    b = cuda.shared.array(1, np.uint64)
    mbarrier_init(b, 1.5)  # <-


@typing_case((ARR2,), "mbarrier_init: the mbarrier must live in shared memory")
def k_mbarrier_init_global(a):
    mbarrier_init(a, 1)  # <-


@typing_case((), "mbarrier_arrive: the mbarrier operand must be a shared uint64 array")
def k_mbarrier_arrive_f32():
    b = cuda.shared.array(1, np.float32)
    mbarrier_arrive(b)  # <-


@typing_case((), "mbarrier_arrive_expect_tx: tx_bytes must be an integer, got float64")
def k_expect_tx_float():
    b = cuda.shared.array(1, np.uint64)
    mbarrier_arrive_expect_tx(b, 2.5)  # <-


@typing_case((), "mbarrier_wait: state must be an integer, got float64")
def k_mbarrier_wait_float():
    b = cuda.shared.array(1, np.uint64)
    mbarrier_wait(b, 0.5)  # <-


@typing_case((), "mbarrier_wait_parity: parity must be an integer, got UniTuple(int64 x 2)")
def k_mbarrier_wait_parity_tuple():
    b = cuda.shared.array(1, np.uint64)
    mbarrier_wait_parity(b, (0, 1))  # <-


@typing_case((ARR2,), "mbarrier_ref: expected a shared uint64 array of barriers")
def k_mbarrier_ref_global(a):
    mbarrier_ref(a, 0)  # <-


@typing_case((), "mbarrier_ref: the barrier index must be an integer, got float64")
def k_mbarrier_ref_float_index():
    b = cuda.shared.array(2, np.uint64)
    mbarrier_ref(b, 0.5)  # <-


@typing_case((I64,), "setmaxnreg_inc: the register count must be a compile-time constant integer")
def k_setmaxnreg_runtime(n):
    setmaxnreg_inc(n)  # <-


@typing_case((), "setmaxnreg_inc: the register count must be in 24..256, got 7")
def k_setmaxnreg_range():
    setmaxnreg_inc(7)  # <-


@typing_case((), "setmaxnreg_dec: the register count must be a multiple of 8 in 24..256, got 41")
def k_setmaxnreg_dec_odd():
    setmaxnreg_dec(41)  # <-


@typing_case((I64,), "cp_async_wait_group: N must be a compile-time constant integer")
def k_cp_async_wait_runtime(n):
    cp_async_wait_group(n)  # <-


@typing_case((I64,), "bulk_wait_group: N must be a compile-time constant integer")
def k_bulk_wait_runtime(n):
    bulk_wait_group(n)  # <-


@typing_case((), "named_barrier_sync: the barrier id must be in 0..15, got 99")
def k_named_barrier_id():
    named_barrier_sync(99, 128)  # <-


@typing_case((ARR2,), "cp_async: nbytes must be in 4..16, got 3")
def k_cp_async_size(a):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    cp_async(t, (0, 0), a, (0, 0), 3)  # <-


@typing_case((ARR2,), "cp_async: the destination must be a shared-memory array")
def k_cp_async_global_dst(a):
    cp_async(a, (0, 0), a, (0, 0), 16)  # <-


@typing_case((types.float32[::1],), "memcpy_async: nbytes must be a non-negative multiple of 16")
def k_memcpy_async_nbytes(a):
    t = cuda.shared.array(64, np.float32, alignment=128)
    memcpy_async(t, a, 20)  # <-


@typing_case((types.float32[::1],), "memcpy_async: nbytes 1024 exceeds the destination")
def k_memcpy_async_too_big(a):
    t = cuda.shared.array(64, np.float32, alignment=128)
    memcpy_async(t, a, 1024)  # <-


@typing_case((types.float32[::1],), "bulk_load: the destination must be a shared-memory array")
def k_bulk_load_global_dst(a):
    b = cuda.shared.array(1, np.uint64)
    bulk_load(a, a, b)  # <-


@typing_case((types.float32[::1],), "bulk_reduce: unknown reduction 'mul'")
def k_bulk_reduce_kind(a):
    t = cuda.shared.array(64, np.float32, alignment=128)
    bulk_reduce("mul", a, t)  # <-


@typing_case((), "ldmatrix: offset 4 is not a multiple of 8 elements")
def k_ldmatrix_offset():
    t = cuda.shared.array(256, np.uint16, alignment=128)
    ldmatrix(t, 4, 4, False)  # <-


@typing_case((), "ldmatrix: the tile must hold 16-bit elements")
def k_ldmatrix_dtype():
    t = cuda.shared.array(256, np.float32, alignment=128)
    ldmatrix(t, 0, 4, False)  # <-


@typing_case((), "ldmatrix: count must be one of 1, 2, 4, got 3")
def k_ldmatrix_count():
    t = cuda.shared.array(256, np.uint16, alignment=128)
    ldmatrix(t, 0, 3, False)  # <-


@typing_case((), "stmatrix: values must be a tuple of 1, 2 or 4 uint32")
def k_stmatrix_values():
    t = cuda.shared.array(256, np.uint16, alignment=128)
    stmatrix(t, 0, (1.0, 2.0), False)  # <-


@typing_case((types.uint8[::1],), "shared_view: the buffer must be a shared-memory array")
def k_shared_view_global(g):
    shared_view(g, 0, (64, 64))  # <-


@typing_case((D2T,), "tensormap_acquire: expected a numbatma.TensorMapArray")
def k_acquire_tensormap(d):
    tensormap_acquire(d, 0)  # <-


@typing_case((DARR,), "tensormap_acquire: the index must be an integer, got float64")
def k_acquire_float_index(ds):
    tensormap_acquire(ds, 0.5)  # <-


@typing_case((), "Pipeline: the number of stages must be in 1..64, got 0")
def k_pipeline_stages():
    Pipeline(0, 1, 1)  # <-


@typing_case((I64,), "Pipeline: the number of stages must be a compile-time constant integer")
def k_pipeline_runtime_stages(n):
    Pipeline(n, 1, 1)  # <-


@typing_case((), "wgmma_zeros: N must be in 8..256, got 7")
def k_wgmma_zeros_n():
    wgmma_zeros(7)  # <-


@typing_case((), "elect_one_sync: takes (); the call passes 1 argument(s)")
def k_elect_one_sync_arity():
    elect_one_sync(1)  # <-


def _marked_line(kernel):
    lines, start = inspect.getsourcelines(kernel)
    marked = [start + i for i, text in enumerate(lines) if text.rstrip().endswith("# <-")]
    assert len(marked) == 1, kernel.__name__
    return marked[0]


@pytest.mark.parametrize("case", list(TYPING), ids=list(TYPING))
def test_typing(case):
    kernel, sig, fragment = TYPING[case]
    with pytest.raises(NumbaTypingError) as info:  # (numba's class: existing handlers keep working)
        cuda.compile_ptx(kernel, sig, cc=(9, 0, "a"))
    exc = info.value
    assert isinstance(exc, TypingError), f"not numbatma's error:\n{exc}"
    text = str(exc)
    line = first_line(exc)
    head = f"{kernel.__code__.co_filename}:{_marked_line(kernel)}: "
    assert line.startswith(head), f"expected {head!r}..., got {line!r}"
    assert os.path.samefile(line.split(":", 1)[0], HERE)
    assert fragment in line, f"{fragment!r} not on the first line: {line!r}"
    assert "No implementation of function" not in text and "candidate" not in text, text
    assert text.count(line.split(": ", 1)[1].split(":")[0] + ":") == 1, text  # one error, not two candidates
    assert "# <-" in text.splitlines()[1]  # the offending source line follows


# =============================================================================================================
# Launch: arguments checked before the launch (GPU path: numbatma's argument hook; simulator: the operands)
# =============================================================================================================
def _encoded(desc, device):
    """A TensorMap that looks encoded for ``device`` (no driver here)."""
    desc._descriptor, desc._device_id = object(), device
    return desc


class _FakeArrayOfTensorMaps:
    tensormaps = [D2]
    address = 1 << 30
    _device_id = 1


def _launch_arg(ty, value):
    internals._prepare_numbatma_arg(ty, value, [])


LAUNCH = {
    "TensorMap of device 1 on device 0": (
        lambda: _launch_arg(D2T, _encoded(TensorMap(A2, (16, 32)), 1)), TensorMapError,
        "this TensorMap describes memory of device 1, but the kernel launches on device 0"),
    "TensorMapArray of device 1 on device 0": (
        lambda: _launch_arg(DARR, _FakeArrayOfTensorMaps()), TensorMapError,
        "describes memory of device 1, but the kernel launches on device 0"),
    "array where a TensorMap goes": (
        lambda: _launch_arg(D2T, np.zeros((64, 64), np.float32)), TensorMapError,
        "the kernel was compiled for a numbatma.TensorMap (TensorMap(float32, box=(16, 32), swizzle=0B)) here but "
        "got a ndarray of shape (64, 64)"),
    "array where a TensorMapArray goes": (
        lambda: _launch_arg(DARR, np.zeros(4)), TensorMapError, "compiled for a numbatma.TensorMapArray"),
    "list where a TensorMap goes": (lambda: _launch_arg(D2T, [D2]), TensorMapError, "got a list"),
}


@pytest.mark.parametrize("case", list(LAUNCH), ids=list(LAUNCH))
def test_launch_gpu_path(case, monkeypatch):
    monkeypatch.setattr("numbatma._launch_hooks.current_device_id", lambda: 0)
    from numbatma import devices

    monkeypatch.setattr(devices, "_COUNT", [2])  # (a process that sees two devices: launches compare devices)
    make, exc_type, fragment = LAUNCH[case]
    with pytest.raises(exc_type) as info:
        make()
    assert fragment in first_line(info.value), first_line(info.value)


def test_launch_same_device_passes(monkeypatch):
    monkeypatch.setattr("numbatma._launch_hooks.current_device_id", lambda: 1)
    args = []
    desc = _encoded(TensorMap(A2, (16, 32)), 1)
    internals._prepare_numbatma_arg(D2T, desc, args)
    assert args == [desc._descriptor]


def k_launch_array_as_desc(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)  # <-


def test_launch_array_where_tensormap_goes_is_typing_error_at_user_line():
    """``kernel[grid, block](array)`` for a kernel written for a TensorMap: the dispatcher compiles for the
    array's type, and the typing error names the user's line (offline: no driver needed to get there)."""
    kernel = cuda.jit(k_launch_array_as_desc)
    with internals.offline_target((9, 0, "a")), pytest.raises(TypingError) as info:
        kernel[1, 128](FakeArrayArg())
    line = first_line(info.value)
    assert line.startswith(f"{HERE}:{_marked_line(k_launch_array_as_desc)}: tma_load: the descriptor operand must "
                           f"be a numbatma.TensorMap, got array(float32, 2d, C)"), line


class FakeArrayArg:
    """A host-side stand-in the dispatcher types as array(float32, 2d, C) (typing happens before any copy)."""

    def __init__(self):
        self.__cuda_array_interface__ = F((64, 64)).__cuda_array_interface__


SIM_CASES = {
    "array as tma_load descriptor": ("SimulatedTypingError",
                                     "tma_load: the descriptor operand must be a numbatma.TensorMap, got an array"),
    "array as tma_store descriptor": ("SimulatedTypingError", "tma_store: the descriptor operand must be a numbatma"),
    "number as prefetch descriptor": ("SimulatedTypingError",
                                      "prefetch_tensormap: the descriptor operand must be a numbatma.TensorMap, got int"),
    "TensorMap as TensorMapArray": ("SimulatedTypingError",
                                    "tensormap_acquire: expected a numbatma.TensorMapArray, got TensorMap"),
    "acquire index 2 of 2": ("SimulatedMisuse", "tensormap_acquire: descriptor index 2 is out of range for a "
                                                "TensorMapArray of 2 descriptor(s) (valid: 0..1)"),
    "acquire index -1": ("SimulatedMisuse", "tensormap_acquire: descriptor index -1 is out of range"),
    "tensormap_ref index 5": ("SimulatedMisuse", "tensormap_ref: descriptor index 5 is out of range"),
}


@pytest.fixture(scope="module")
def simulated():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    here = os.path.dirname(HERE)
    out = subprocess.run([sys.executable, os.path.join(here, "error_battery_sim.py")], cwd=here, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("case", list(SIM_CASES), ids=list(SIM_CASES))
def test_launch_simulator(case, simulated):
    exc_type, fragment = SIM_CASES[case]
    got_type, line = simulated[case]
    assert got_type == exc_type, (got_type, line)
    assert fragment in line, line


def test_battery_size():
    assert len(HOST) + len(TYPING) + len(LAUNCH) + 1 + len(SIM_CASES) >= 100
