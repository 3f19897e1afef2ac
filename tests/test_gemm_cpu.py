"""CPU: numbatma.kernels.Gemm plans (tile heuristic, argument checks) and what the compiled kernel is made of -
HGMMA issued back to back, no local memory, ``setmaxnreg`` kept, TMA loads/stores, multicast in cluster mode -
linked offline for sm_90a; other targets refuse it naming wgmma. The multistage comparison kernel of
benchmarks/gemm_multistage.py (once ``warp_specialized=False``): its SASS, and Gemm's refusal of the old option."""
import importlib.util
import pathlib
import re

import numpy as np
import pytest

from numbatma import TensorMapError
from numbatma.intrinsics._asm import UnsupportedTarget
from numbatma import compile as nbc
from numbatma.kernels import Gemm, _launch

from fakes import FakeCudaArray

gemm_module = __import__("numbatma.kernels.gemm", fromlist=["default_config"])


@pytest.fixture(autouse=True)
def fixed_sm_count(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 132)


def arr(shape, dtype=np.float16, ptr=1 << 20, strides=None):
    return FakeCudaArray(shape, dtype, strides=strides, ptr=ptr)


def plan(m, n, k, layout="nk", out=np.float16, **options):
    """Arrays whose rows are padded to a multiple of 64 elements (views, as TMA needs 16-byte row strides)."""
    pad = -(-n // 64) * 64
    b = arr((n, k), ptr=1 << 30) if layout == "nk" else arr((k, n), ptr=1 << 30, strides=(pad * 2, 2))
    itemsize = np.dtype(out).itemsize
    return Gemm(arr((m, k)), b, arr((m, n), out, ptr=1 << 34, strides=(pad * itemsize, itemsize)),
                b_layout=layout, **options)


def test_tile_heuristic():
    config = gemm_module.default_config
    big = config(8192, 8192, 8192, 2)
    assert (big.bn, big.stages, big.cluster_m) == (256, 4, 1)
    assert big.smem_bytes <= _launch.SMEM_PER_BLOCK - 1024
    assert config(2048, 2048, 2048, 2).bn == 256  # 128 tiles of 128 x 256 for 132 SMs
    assert config(257, 4096, 1000, 2).bn == 128  # 48 tiles of 128 x 256 would leave most SMs idle; 96 of 128
    assert config(1024, 1024, 1024, 2).bn == 64  # 128 tiles of 128 x 64 rather than 64 of 128 x 128
    assert config(1024, 1024, 1024, 2, cluster_m=2, b_nk=False).bn == 128  # (K, N): an even number of boxes
    assert config(1024, 1024, 1024, 2, cluster_m=2).bn == 64  # (N, K) tiles split in row halves
    assert config(16384, 128, 512, 2).bn == 128  # N fits one tile of 128
    assert config(8192, 64, 512, 2).bn == 64
    assert config(8192, 8192, 8192, 2, bn=128).stages == 5  # (at most 5)
    assert config(8192, 8192, 8192, 4).epilogue_cols == 32  # float32 output: 128-byte epilogue chunks


@pytest.mark.parametrize("options, message", [
    (dict(bn=96), "bn must be 64, 128, 192 or 256"),
    (dict(stages=9), "at most 4 stages fit"),
    (dict(stages=0), "at most 4 stages fit"),
    (dict(cluster_m=4), "cluster_m must be 1 or 2"),
    (dict(cluster_m=0), "cluster_m must be 1 or 2"),
])
def test_bad_options(options, message):
    with pytest.raises(TensorMapError, match=re.escape(message)):
        plan(8192, 8192, 1024, **options)


@pytest.mark.parametrize("value", [False, True, 0])
def test_warp_specialized_is_refused_naming_the_benchmark_module(value):
    """The option is gone (issue 23): a TypeError that names it, the user's value and where the kernel went."""
    with pytest.raises(TypeError, match=re.escape(f"Gemm: warp_specialized is no longer an option, got "
                                                  f"warp_specialized={value!r}")) as info:
        plan(8192, 8192, 1024, warp_specialized=value)
    assert "benchmarks/gemm_multistage.py" in str(info.value)
    with pytest.raises(TypeError, match=re.escape("Gemm: unknown option warp_specialised=False; the options are "
                                                  "alpha, beta")):
        plan(8192, 8192, 1024, warp_specialised=False)


def test_kn_tiles_of_an_odd_number_of_boxes_are_not_split_between_two_ctas():
    with pytest.raises(TensorMapError, match="even number of 64-column boxes"):
        plan(1024, 1024, 1024, "kn", bn=192, cluster_m=2)
    assert plan(1024, 1024, 1024, "nk", bn=192, cluster_m=2).config.cluster_m == 2


def test_bad_arrays():
    a, b = arr((64, 64)), arr((64, 64), np.float32, ptr=1 << 30)
    with pytest.raises(TensorMapError, match="both must be bfloat16 or both float16"):
        Gemm(a, b, arr((64, 64), ptr=1 << 34))
    with pytest.raises(TensorMapError, match=r"shapes do not multiply: a is \(64, 64\), b is \(32, 64\)"):
        Gemm(a, arr((32, 64), ptr=1 << 30), arr((64, 64), ptr=1 << 34))
    with pytest.raises(TensorMapError, match="supported output dtypes"):
        Gemm(a, arr((64, 64), ptr=1 << 30), arr((64, 64), np.int32, ptr=1 << 34))
    with pytest.raises(TensorMapError, match="b_layout must be 'kn'"):
        Gemm(a, arr((64, 64), ptr=1 << 30), arr((64, 64), ptr=1 << 34), b_layout="nn")
    with pytest.raises(TensorMapError, match="Gemm takes 2-D arrays"):
        Gemm(arr((4, 64, 64)), arr((64, 64), ptr=1 << 30), arr((64, 64), ptr=1 << 34))
    with pytest.raises(TensorMapError, match="K is 0"):
        Gemm(arr((64, 0)), arr((64, 0), ptr=1 << 30), arr((64, 64), ptr=1 << 34), b_layout="nk")


def test_grid_is_persistent_and_never_larger_than_the_work():
    assert plan(8192, 8192, 1024).grid == 132
    assert plan(256, 512, 64).grid == 2 * 8  # 2 x 8 tiles of 128 x 64
    assert plan(8192, 8192, 1024, grid=7).grid == 7


def _sass(p):
    """SASS as the GPU build makes it (LTO; the warp-specialized kernel has a register cap for setmaxnreg, the
    multistage benchmark kernel none)."""
    cap = gemm_module.MAX_REGISTERS if isinstance(p, Gemm) else None
    cubin = nbc.compile_cubin(p.kernel.py_func, p.args, "sm_90a", max_registers=cap)
    return nbc.sass(cubin)


# One build per variant (each compiles the whole kernel: ~10-20 s).
VARIANTS = {
    "nk": dict(layout="nk"),
    "kn-f32-beta-tail": dict(layout="kn", out=np.float32, beta=0.5, n=8189),
    "nk-cluster": dict(layout="nk", cluster_m=2),
    "multistage": dict(layout="nk", multistage=True, bn=256),  # benchmarks/gemm_multistage.py (Gemm's tile)
}


def load_benchmark(name):
    """A module of benchmarks/ (not a package) by path."""
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def multistage_plan(m, n, k, layout="nk", out=np.float16, **options):
    """benchmarks/gemm_multistage.py's plan on the arrays :func:`plan` makes."""
    bench = load_benchmark("gemm_multistage")
    pad = -(-n // 64) * 64
    b = arr((n, k), ptr=1 << 30) if layout == "nk" else arr((k, n), ptr=1 << 30, strides=(pad * 2, 2))
    itemsize = np.dtype(out).itemsize
    return bench.MultistageGemm(arr((m, k)), b, arr((m, n), out, ptr=1 << 34, strides=(pad * itemsize, itemsize)),
                                b_layout=layout, **options)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def built(request):
    v = dict(VARIANTS[request.param])
    n = v.pop("n", 8192)
    layout, out = v.pop("layout"), v.pop("out", np.float16)
    make = multistage_plan if v.pop("multistage", False) else plan
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_launch, "sm_count", lambda *a: 132)
        p = make(8192, n, 8192, layout, out, **v)
    return request.param, p, _sass(p)


def test_sass(built):
    name, p, sass = built
    bn = p.bn if name == "multistage" else p.config.bn
    assert re.search(r"\bHGMMA\.64x%dx16\.F32" % bn, sass), "no m64n%dk16 HGMMA" % bn
    assert not re.search(r"\b(STL|LDL)\b", sass), "local memory in the GEMM kernel"
    assert "UTMALDG" in sass and "UTMASTG" in sass
    # the four k-steps of a stage issue back to back: nothing that waits (warpgroup barriers, mbarrier or
    # block syncs) between the first and the last HGMMA of the group, only descriptor arithmetic
    ops = [line.split("*/")[1].split()[0] for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    hgmma = [i for i, op in enumerate(ops) if op.startswith("HGMMA")]
    assert len(hgmma) == 4, f"{len(hgmma)} HGMMA (one stage: four k-steps of 16)"
    between = ops[hgmma[0]:hgmma[-1]]
    assert not [op for op in between if op.startswith(("WARPGROUP", "BAR", "SYNCS", "DEPBAR", "WARPSYNC"))]
    if name == "multistage":
        assert "USETMAXREG" not in sass and p.block == 256, "the multistage kernel has no role split"
    else:
        assert "USETMAXREG" in sass, "setmaxnreg did not survive the build"
    if name == "nk-cluster":
        assert "MULTICAST" in sass
    if "beta" in name:
        assert re.search(r"\bSTG?\.E", sass), "the tail columns need ordinary stores"


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120a"])
def test_other_targets_say_wgmma_is_sm_90a_only(arch):
    p = plan(256, 256, 64)
    with pytest.raises(UnsupportedTarget, match="wgmma"):
        nbc.compile_ptx(p.kernel.py_func, p.args, arch)


# The default kernels (bfloat16 4096^3, bn 256, 4 stages) as they compiled before Gemm was rebuilt on
# numbatma.intrinsics.warp_roles (commit 715408c, nvJitLink of this image): total SASS instructions, the HGMMA of
# the main loop, and per-class counts. "uniform": the uniform datapath (U*), where ptxas keeps the warp-uniform
# tile arithmetic; a role split that loses that proof moves ~130 of them to vector registers (and spills).
SASS_BEFORE_BLOCKS = {
    ("nk", 0.0, 1): (1880, {"fp": 217, "barrier": 55, "tma": 16, "shared": 16, "uniform": 1087}),
    ("kn", 0.5, 1): (2512, {"fp": 345, "barrier": 63, "tma": 38, "shared": 80, "uniform": 1216}),
    # (cluster 2: 4 barrier instructions fewer since the remote stage release arrives at CTA scope - the two
    # MEMBARs, .CTA and .GPU, before each of its two remote arrives are gone, and with B as (K, N) 16 instructions
    # in all; 2026-11-27)
    ("nk", 0.0, 2): (2088, {"fp": 217, "barrier": 70, "tma": 16, "shared": 16, "uniform": 623}),
    ("kn", 0.5, 2): (2408, {"fp": 345, "barrier": 58, "tma": 11, "shared": 80, "uniform": 761}),
}
SASS_CLASSES = {"fp": r"^(F[A-Z0-9]*|HADD2|HMUL2|HFMA2|MUFU)(\.|$)",
                "barrier": r"^(BAR|SYNCS|WARPGROUP|DEPBAR|MEMBAR|FENCE|WARPSYNC|ELECT|USETMAXREG|UCGABAR)",
                "tma": r"^(UTMA|UBLKCP)", "shared": r"^(STS|LDS|STSM|LDSM)", "uniform": r"^U"}


def sass_opcodes(sass):
    """The opcodes (with modifiers, predicates dropped) of a SASS listing, in order."""
    out = []
    for line in sass.splitlines():
        if re.search(r"/\*[0-9a-f]{4}\*/", line):
            words = line.split("*/")[1].split(";")[0].split()
            out.append(words[1] if words[0].startswith("@") else words[0])
    return out


@pytest.mark.parametrize("variant", sorted(SASS_BEFORE_BLOCKS), ids=lambda v: f"{v[0]}-beta{v[1]}-cluster{v[2]}")
def test_sass_same_as_before_the_building_blocks(variant):
    from toolchain import require_measured_toolchain

    require_measured_toolchain()
    layout, beta, cluster = variant
    from fakes import FakeTorchTensor
    a = FakeTorchTensor((4096, 4096), "bfloat16", ptr=1 << 20)
    b = FakeTorchTensor((4096, 4096), "bfloat16", ptr=1 << 30)
    c = FakeTorchTensor((4096, 4096), "bfloat16", ptr=1 << 34)
    p = Gemm(a, b, c, b_layout=layout, beta=beta, cluster_m=cluster)
    assert (p.config.bn, p.config.stages) == (256, 4)
    ops = sass_opcodes(_sass(p))
    total, classes = SASS_BEFORE_BLOCKS[variant]
    classes = dict(classes)
    assert [op for op in ops if op.startswith("HGMMA")] == ["HGMMA.64x256x16.F32.BF16"] * 4
    got = {name: sum(1 for op in ops if re.match(rx, op)) for name, rx in SASS_CLASSES.items()}
    uniform = got.pop("uniform"), classes.pop("uniform")
    assert got == classes  # floating point, barriers, TMA, shared memory: exactly as before
    assert abs(uniform[0] - uniform[1]) <= 8, f"{uniform[0]} uniform-datapath instructions, {uniform[1]} before"
    assert abs(len(ops) - total) <= 8, f"{len(ops)} SASS instructions, {total} before"
    assert not [op for op in ops if op.startswith(("STL", "LDL"))]
