"""CPU: the examples' and the kernel library's kernels type-check, compile and link for sm_90a; the
examples explain themselves on a machine without a GPU."""
import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from numba import types

import numbatma
from numbatma import compile as nbc
from numbatma.kernels.copy import TmaCopy

from fakes import FakeCudaArray

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tmap(shape, dtype, box):
    return numbatma.TensorMap(FakeCudaArray(shape, dtype), box)


def test_tma_copy_example_compiles():
    m = load("tma_copy")
    t = tmap((1000, 1008), np.float32, (m.BM, m.BN))
    assert "UTMALDG.2D" in nbc.sass(nbc.link_cubin(nbc.compile_ptx(m.tma_copy_kernel.py_func, (t, t))))


def test_seed_002_example_compiles():
    m = load("seed_002_tile_load")
    t = tmap((128, 64), np.float16, (128, 64))
    nbc.link_cubin(nbc.compile_ptx(m.tma_tile_load.py_func, (t, types.float16[:, :])))


def test_seed_003_example_compiles():
    m = load("seed_003_load_store")
    t = tmap((300, 512), np.float32, (m.CTA_M, m.CTA_N))
    nbc.link_cubin(nbc.compile_ptx(m.scale_tiles.py_func, (t, t, types.float32)))


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_copy_kernel_compiles_for_every_rank(rank):
    shape = (3, 5, 7, 9, 40)[-rank:]
    src, dst = FakeCudaArray(shape, np.int16), FakeCudaArray(shape, np.int16, ptr=1 << 30)
    plan = TmaCopy(src, dst)  # rows of 40 int16 (80 bytes): no tail
    ptx = nbc.compile_ptx(plan.kernel.py_func, plan.args)
    assert f"cp.async.bulk.tensor.{rank}d" in ptx and not plan.out.has_tail
    odd = (3, 5, 7, 9, 37)[-rank:]  # rows of 74 bytes (in rows of 80): TMA for 64, ordinary stores for 5
    strides = tuple(int(np.prod((3, 5, 7, 9, 40)[-rank:][i + 1:])) * 2 for i in range(rank))
    plan = TmaCopy(FakeCudaArray(odd, np.int16, strides), FakeCudaArray(odd, np.int16, strides, ptr=1 << 30),
                   swizzle=128)
    assert plan.out.has_tail and plan.out.aligned == 32
    sass = nbc.sass(nbc.link_cubin(nbc.compile_ptx(plan.kernel.py_func, plan.args)))
    assert f"UTMASTG.{rank}D" in sass and "STL" not in sass


def test_main_example_runs_in_the_simulator_without_a_gpu():
    """Without a TMA GPU the main example re-runs itself in the CUDA simulator, says so, and checks the
    copy against NumPy there."""
    from gpuinfo import gpu_reason

    if gpu_reason() is None:
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, str(EXAMPLES / "tma_copy.py")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "running the same kernel in the CUDA simulator" in out.stdout
    assert "(CUDA simulator): OK, matches NumPy" in out.stdout


def test_gemm_example_compiles_to_hgmma_without_local_memory():
    m = load("gemm")
    a, b, c = (FakeCudaArray(s, np.float16, ptr=p) for s, p in
               (((1000, 512), 1 << 20), ((768, 512), 1 << 30), ((1000, 768), 1 << 34)))
    plan = m.ExampleGemm(a, b, c)
    sass = nbc.sass(nbc.compile_cubin(m.gemm_kernel.py_func, (plan.a_map, plan.b_map, plan.c_map, plan.k),
                                      max_registers=m.MAX_REGISTERS))
    assert sass.count("HGMMA.64x256x16.F32") == 4 and "USETMAXREG" in sass and "UTMASTG.2D" in sass
    assert "STL" not in sass and "LDL" not in sass
    ops = [line.split("*/")[1].split()[0] for line in sass.splitlines() if "*/" in line and "HGMMA" in line
           or "WARPGROUP" in line]
    first = ops.index("HGMMA.64x256x16.F32")
    assert ops[first:first + 4] == ["HGMMA.64x256x16.F32"] * 4, "ptxas serialized the k-step's wgmma"


def test_gemm_example_runs_in_the_simulator_without_a_gpu():
    from gpuinfo import gpu_reason

    if gpu_reason() is None:
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, str(EXAMPLES / "gemm.py")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "(CUDA simulator): OK, matches float64 dot products" in out.stdout


def test_flash_attention_example_compiles_to_back_to_back_hgmma_without_local_memory():
    m = load("flash_attention")
    shape = (2, 4, 1024, m.D)
    q, k, v, o = (FakeCudaArray(shape, np.float16, ptr=1 << p) for p in (20, 30, 34, 36))
    maps = [numbatma.TensorMap(x, (1, 1, rows, 64), swizzle=128) for x, rows in ((q, 64), (k, m.BN), (v, m.BN), (o, 64))]
    sass = nbc.sass(nbc.compile_cubin(m.attention_kernel.py_func, (*maps, 4, 1024, np.float32(0.1)),
                                      max_registers=m.MAX_REGISTERS))
    ops = [line.split("*/")[1].split()[0] for line in sass.splitlines()
           if "*/" in line and ("HGMMA" in line or "WARPGROUP.DEPBAR" in line)]
    # QKᵀ: eight k-steps of 64 x 128 x 16, then one wait; PV: eight of 64 x 128 x 16 with A from registers, one wait
    assert ops == ["HGMMA.64x128x16.F32"] * 8 + ["WARPGROUP.DEPBAR.LE"] + ["HGMMA.64x128x16.F32"] * 8 \
        + ["WARPGROUP.DEPBAR.LE"], ops
    assert "STL" not in sass and "LDL" not in sass and sass.count("USETMAXREG") == 2 and "UTMASTG.4D" in sass


def test_flash_attention_example_runs_in_the_simulator_without_a_gpu():
    from gpuinfo import gpu_reason

    if gpu_reason() is None:
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, str(EXAMPLES / "flash_attention.py")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "head dim 128: OK" in out.stdout


def test_warp_roles_gemm_example_compiles_to_hgmma_without_local_memory():
    """examples/warp_roles_gemm.py (built from numbatma.intrinsics.warp_roles) compiles for sm_90a: four
    back-to-back HGMMA per k-step, setmaxnreg, TMA loads and stores, and no local memory."""
    m = load("warp_roles_gemm")
    a, b, c = (FakeCudaArray(s, np.float16, ptr=p) for s, p in
               (((1000, 512), 1 << 20), ((768, 512), 1 << 30), ((1000, 768), 1 << 34)))
    plan = m.WarpRolesGemm(a, b, c, grid=132)
    sass = nbc.sass(nbc.compile_cubin(m.warp_roles_gemm.py_func, plan.args, max_registers=m.BUDGET.launch))
    assert sass.count("HGMMA.64x128x16.F32") == 4 and sass.count("USETMAXREG") == 2
    assert "UTMALDG.2D" in sass and "UTMASTG.2D" in sass
    assert "STL" not in sass and "LDL" not in sass
    ops = [line.split("*/")[1].split()[0] for line in sass.splitlines() if "*/" in line and "HGMMA" in line]
    assert ops == ["HGMMA.64x128x16.F32"] * 4, ops
    assert plan.grid == 48  # persistent_grid: never more CTAs than the 8 x 6 tiles (132 SMs asked for)
