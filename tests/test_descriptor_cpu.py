"""CPU tests of intrinsics/descriptor.py: the GPU test kernels (tests/descriptor_kernels.py) compile for every
target, their PTX holds each tensormap instruction, they link through nvJitLink; SASS spot checks; typing
errors."""
import re

import numpy as np
import pytest
from numba import cuda, types

from numbatma import TensorMap, compile as nbc
from numbatma._types import TensorMapArrayType
from numbatma.intrinsics import (
    align_up,
    prefetch_tensormap,
    tensormap_fence_acquire_cta,
    tensormap_fence_acquire_gpu,
    tensormap_fence_release_cta,
    tensormap_publish,
    tensormap_ref,
    tensormap_replace_box_dim,
    tensormap_replace_element_stride,
    tensormap_replace_elemtype,
    tensormap_replace_fill_mode,
    tensormap_replace_global_address,
    tensormap_replace_global_dim,
    tensormap_replace_global_stride,
    tensormap_replace_interleave_layout,
    tensormap_replace_rank,
    tensormap_replace_swizzle_mode,
    tensormap_to_shared,
)
from numbatma.intrinsics.descriptor import PTX

import descriptor_kernels as K
from fakes import FakeCudaArray

D2 = TensorMap(FakeCudaArray((16, 32), np.float32), (K.BR, K.BC))
WS2 = TensorMapArrayType(D2.numba_type)


def every_other_op(d, out):
    """The operations the GPU kernels do not use: acquire/release at CTA scope, every replace in both spaces."""
    buf = cuda.shared.array(16, np.uint64, alignment=128)
    h = tensormap_to_shared(buf, d)
    tensormap_replace_rank(h, 2)
    tensormap_replace_box_dim(h, 1, 32)
    tensormap_replace_element_stride(h, 0, 2)
    tensormap_replace_elemtype(h, 7)
    tensormap_replace_interleave_layout(h, 0)
    tensormap_replace_swizzle_mode(h, 128)
    tensormap_replace_fill_mode(h, 0)
    tensormap_fence_release_cta()
    tensormap_fence_acquire_cta(d)
    tensormap_fence_acquire_gpu(d)
    out[0] = align_up(out[1], 1024)


def every_global_replace(ws, out):
    h = tensormap_ref(ws, 1)
    tensormap_replace_global_address(h, out)
    tensormap_replace_rank(h, 2)
    tensormap_replace_box_dim(h, 1, 32)
    tensormap_replace_global_dim(h, 0, 5)
    tensormap_replace_global_stride(h, 0, 256)
    tensormap_replace_element_stride(h, 0, 2)
    tensormap_replace_elemtype(h, 7)
    tensormap_replace_interleave_layout(h, 16)
    tensormap_replace_swizzle_mode(h, 64)
    tensormap_replace_fill_mode(h, 1)


KERNELS = {
    **K.kernel_signatures(FakeCudaArray),  # the GPU / simulator tests' kernels, as their runners launch them
    "every_other_op": (every_other_op, (D2.numba_type, types.int64[::1])),
    "every_global_replace": (every_global_replace, (WS2, types.float32[::1])),
}


@pytest.fixture(scope="module", params=nbc.ARCHS)
def compiled(request):
    arch = request.param
    ptx = {name: nbc.compile_ptx(fn, sig, arch=arch) for name, (fn, sig) in KERNELS.items()}
    return arch, ptx


def _ptx_regex(text):
    body = re.sub(r"\$\w+", "\x00", text)
    return r"[^;\n]*?".join(re.escape(p) for p in body.split("\x00")).replace(r"\ ", r"\s+")


@pytest.mark.parametrize("name", sorted(PTX))
def test_every_instruction_in_ptx(compiled, name):
    arch, ptx = compiled
    text = "\n".join(ptx.values())
    assert re.search(_ptx_regex(PTX[name].text), text), f"{name}: {PTX[name].text!r} not in the {arch} PTX"


def test_ordinals_and_codes(compiled):
    arch, ptx = compiled
    text = ptx["rebuild_all_fields"]
    # array axis 0 of a rank-3 layout is PTX ordinal 2; strides: axis 0 -> ordinal 1
    assert re.search(r"tensormap\.replace\.tile\.box_dim\.shared::cta\.b1024\.b32\s+\[%r\d+\], 2, %r\d+;", text)
    assert re.search(r"tensormap\.replace\.tile\.global_stride\.shared::cta\.b1024\.b64\s+\[%r\d+\], 1, %rd\d+;", text)
    assert re.search(r"tensormap\.replace\.tile\.rank\.shared::cta\.b1024\.b32\s+\[%r\d+\], 2;", text)  # rank 3 - 1
    assert re.search(r"tensormap\.replace\.tile\.elemtype\.shared::cta\.b1024\.b32\s+\[%r\d+\], 6;", text)
    assert re.search(r"tensormap\.replace\.tile\.fill_mode\.shared::cta\.b1024\.b32\s+\[%r\d+\], 1;", text)
    other = ptx["every_other_op"]
    assert re.search(r"swizzle_mode\.shared::cta\.b1024\.b32\s+\[%r\d+\], 3;", other)  # 128B
    glob = ptx["every_global_replace"]
    assert re.search(r"interleave_layout\.global\.b1024\.b32\s+\[%rd\d+\], 1;", glob)  # 16B
    assert re.search(r"global_dim\.global\.b1024\.b32\s+\[%rd\d+\], 1, %r\d+;", glob)  # axis 0 of rank 2


def test_links_for_every_target(compiled):
    arch, ptx = compiled
    for name, text in ptx.items():
        assert nbc.link_cubin(text, arch)[:4] == b"\x7fELF", name


def test_sass_spot_check():
    ptx = nbc.compile_ptx(K.prefetch_then_load, KERNELS["prefetch_then_load"][1], arch="sm_90a")
    sass = nbc.sass(nbc.link_cubin(ptx, "sm_90a"))
    assert "UTMACCTL.PF" in sass, "prefetch.tensormap left no descriptor prefetch (UTMACCTL.PF) in SASS"
    ptx = nbc.compile_ptx(K.grouped_publish, KERNELS["grouped_publish"][1], arch="sm_90a")
    sass = nbc.sass(nbc.link_cubin(ptx, "sm_90a"))
    assert "UTMALDG.2D" in sass
    assert "UTMACCTL.IV" in sass  # the tensormap acquire fence: invalidate the TMA unit's cached descriptor


# -- typing errors -------------------------------------------------------------------------------------------
def _expect_typing_error(fn, sig, *fragments):
    with pytest.raises(Exception) as info:
        nbc.compile_ptx(fn, sig)
    assert type(info.value).__name__ == "TypingError", info.value
    for frag in fragments:
        assert frag in str(info.value), f"{frag!r} not in {info.value}"


def k_replace_param(d):
    tensormap_replace_global_dim(d, 0, 5)


def k_bad_buffer(d):
    buf = cuda.shared.array(8, np.uint64)
    tensormap_to_shared(buf, d)


def k_bad_dtype_buffer(d):
    buf = cuda.shared.array(32, np.float32)
    tensormap_to_shared(buf, d)


def k_global_buffer(d, a):
    tensormap_to_shared(a, d)


def k_axis_out_of_range(d):
    buf = cuda.shared.array(16, np.uint64)
    tensormap_replace_global_dim(tensormap_to_shared(buf, d), 2, 5)


def k_stride_innermost(d):
    buf = cuda.shared.array(16, np.uint64)
    tensormap_replace_global_stride(tensormap_to_shared(buf, d), 1, 256)


def k_runtime_axis(d, a):
    buf = cuda.shared.array(16, np.uint64)
    tensormap_replace_box_dim(tensormap_to_shared(buf, d), a[0], 8)


def k_bad_swizzle(d):
    buf = cuda.shared.array(16, np.uint64)
    tensormap_replace_swizzle_mode(tensormap_to_shared(buf, d), 3)


def k_bad_rank(d):
    buf = cuda.shared.array(16, np.uint64)
    tensormap_replace_rank(tensormap_to_shared(buf, d), 6)


def k_box_too_big(d):
    buf = cuda.shared.array(16, np.uint64)
    tensormap_replace_box_dim(tensormap_to_shared(buf, d), 0, 300)


def k_publish_global(ws):
    tensormap_publish(ws, 0, tensormap_ref(ws, 0))


def k_prefetch_array(a):
    prefetch_tensormap(a)


def k_shared_address(d):
    buf = cuda.shared.array(16, np.uint64)
    t = cuda.shared.array(16, np.float32)
    tensormap_replace_global_address(tensormap_to_shared(buf, d), t)


DT = D2.numba_type


@pytest.mark.parametrize("fn, sig, fragments", [
    (k_replace_param, (DT,), ("tensormap_replace_global_dim", "read-only")),
    (k_bad_buffer, (DT,), ("tensormap_to_shared", "holds 64 bytes", "takes 128")),
    (k_bad_dtype_buffer, (DT,), ("shared uint64 (16) or uint8 (128)",)),
    (k_global_buffer, (DT, types.uint64[::1]), ("must be a shared-memory array",)),
    (k_axis_out_of_range, (DT,), ("rank 2", "axis 2", "0..1")),
    (k_stride_innermost, (DT,), ("axis 1", "strided axes", "0..0")),
    (k_runtime_axis, (DT, types.int32[::1]), ("the axis must be a compile-time constant",)),
    (k_bad_swizzle, (DT,), ("swizzle span (bytes) must be one of 0, 32, 64, 128, got 3",)),
    (k_bad_rank, (DT,), ("the rank must be in 1..5, got 6",)),
    (k_box_too_big, (DT,), ("box dim must be in 1..256, got 300",)),
    (k_publish_global, (WS2,), ("must be in shared memory",)),
    (k_prefetch_array, (types.float32[::1],), ("prefetch_tensormap", "must be a numbatma.TensorMap")),
    (k_shared_address, (DT,), ("must be global memory",)),
])
def test_typing_errors(fn, sig, fragments):
    _expect_typing_error(fn, sig, *fragments)
