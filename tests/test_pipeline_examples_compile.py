"""CPU: the Pipeline examples (double buffering, warp specialization, FA3-style producer/consumer
warpgroups with setmaxnreg, LDGSTS pipeline) compile to PTX for sm_90a and link offline; their SASS has the
instructions each one is about; their layout constants respect the hardware limits; each script explains
itself and exits 0 where it cannot run."""
import collections
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda, types

import numbatma
from numbatma import compile as nbc

from fakes import FakeCudaArray

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = ("double_buffering", "warp_specialized", "fa3_producer_consumer", "ldgsts_pipeline")
STATIC_SMEM_LIMIT = 48 * 1024
DYNAMIC_SMEM_LIMIT = 227 * 1024  # per-block opt-in maximum on H100/H200


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tmap(shape, dtype, box):
    return numbatma.TensorMap(FakeCudaArray(shape, dtype), box)


def opcodes(sass):
    """Count of each SASS opcode (predicates stripped)."""
    return collections.Counter(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M))


def count(ops, prefix):
    return sum(n for op, n in ops.items() if op.startswith(prefix))


def build(pyfunc, argtypes):
    ptx = nbc.compile_ptx(pyfunc, argtypes)
    return ptx, opcodes(nbc.sass(nbc.link_cubin(ptx)))


def lto_cubin(pyfunc, argtypes, max_registers=None, arch=(9, 0, "a")):
    """What numba-cuda does on a GPU when nvJitLink is present: LTO-IR, then an LTO link (with the
    kernel's register cap)."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    from numbatma._numba_internals import offline_target

    sig = tuple(a.numba_type if isinstance(a, numbatma.TensorMap) else a for a in argtypes)
    with offline_target(arch):
        ltoir, _ = cuda.compile(pyfunc, sig, device=False, abi="numba", output="ltoir", cc=arch)
    opts = LinkerOptions(arch=f"sm_{arch[0]}{arch[1]}{arch[2]}", max_register_count=max_registers,
                         link_time_optimization=True)
    return Linker(ObjectCode.from_ltoir(ltoir), options=opts).link("cubin").code


# -- 1. double buffering -----------------------------------------------------------------------------
def test_double_buffering_compiles():
    m = load("double_buffering")
    t = tmap((m.ROWS, m.COLS), np.float32, (m.BM, m.BN))
    ptx, ops = build(m.double_buffer_kernel.py_func, (t, t, types.int64))
    assert ptx.count("mbarrier.init.shared::cta.b64") == 2 * m.STAGES  # a full and an empty barrier per stage
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    assert "cp.async.bulk.wait_group.read 0" in ptx
    assert ops["UTMALDG.2D"] >= 2 and ops["UTMASTG.2D"] >= 1  # prologue load, prefetch in the loop, store
    assert count(ops, "SYNCS.PHASECHK") >= 2  # producer_acquire and consumer_wait
    assert count(ops, "SYNCS.ARRIVE") >= 2
    assert count(ops, "LDL") == count(ops, "STL") == 0  # the pipeline state stays in registers


# -- 2. warp specialization --------------------------------------------------------------------------
def test_warp_specialized_compiles():
    m = load("warp_specialized")
    t = tmap((m.ROWS, m.COLS), np.float32, (m.BM, m.BN))
    ptx, ops = build(m.warp_specialized_kernel.py_func, (t, t, types.int64, types.float32, types.float32))
    assert ptx.count("mbarrier.init.shared::cta.b64") == 2 * m.STAGES
    assert "elect.sync" in ptx
    assert "cp.async.bulk.wait_group.read 1" in ptx  # releases lag the stores by one tile
    assert ops["UTMALDG.2D"] >= 1 and ops["UTMASTG.2D"] >= 1
    assert count(ops, "SYNCS.PHASECHK") >= 2
    assert count(ops, "LDL") == count(ops, "STL") == 0


def test_warp_specialized_uses_a_named_barrier_for_the_consumers():
    m = load("warp_specialized")
    t = tmap((m.ROWS, m.COLS), np.float32, (m.BM, m.BN))
    sass = nbc.sass(nbc.link_cubin(nbc.compile_ptx(m.warp_specialized_kernel.py_func,
                                                   (t, t, types.int64, types.float32, types.float32))))
    assert re.search(rf"BAR\.SYNC\S* 0x{m.CONSUMER_BARRIER:x}, 0x{m.CONSUMERS:x}\b", sass)


# -- 3. FA3-style producer / consumer warpgroups -----------------------------------------------------
def fa3_args(m):
    x = tmap((m.ROWS, m.COLS), np.float32, (m.BM, m.BN))
    q = tmap((m.ROWS, m.COLS), np.int8, (m.BM, m.BN))
    s = tmap((m.COLS // m.BN, m.ROWS), np.float32, (1, m.BM))
    return (x, q, s, types.int64)


def test_fa3_example_compiles():
    m = load("fa3_producer_consumer")
    ptx, ops = build(m.fa3_kernel.py_func, fa3_args(m))
    assert f"setmaxnreg.dec.sync.aligned.u32 {m.PRODUCER_REGS};" in ptx
    assert f"setmaxnreg.inc.sync.aligned.u32 {m.CONSUMER_REGS};" in ptx
    assert ptx.count("mbarrier.init.shared::cta.b64") == 2 * 2 * m.STAGES  # two pipelines
    assert "elect.sync" in ptx
    assert ops["UTMALDG.2D"] >= 2  # one load site per pipeline
    assert ops["UTMASTG.2D"] >= 4  # Q and S tiles, per consumer
    assert count(ops, "SHFL.BFLY") >= 2 * m.ROWS_PER_WARP * 5  # the row max reductions
    assert count(ops, "LDL") == count(ops, "STL") == 0  # 64 values per thread stay in registers


def test_fa3_register_budget_adds_up():
    m = load("fa3_producer_consumer")
    assert m.THREADS == 3 * m.WARPGROUP
    assert m.MAX_REGISTERS * m.THREADS <= 64 * 1024
    assert m.PRODUCER_REGS * m.WARPGROUP + m.CONSUMER_REGS * 2 * m.WARPGROUP <= m.MAX_REGISTERS * m.THREADS
    assert all(r % 8 == 0 and 24 <= r <= 256 for r in (m.PRODUCER_REGS, m.CONSUMER_REGS, m.MAX_REGISTERS))
    assert m.PRODUCER_REGS < m.MAX_REGISTERS < m.CONSUMER_REGS


def test_fa3_setmaxnreg_survives_the_lto_link_with_a_register_cap(tmp_path):
    """numba-cuda's GPU path (LTO through nvJitLink, max_registers) keeps setmaxnreg: USETMAXREG in SASS and
    exactly the cap allocated at entry."""
    m = load("fa3_producer_consumer")
    assert m.fa3_kernel.targetoptions.get("max_registers") == m.MAX_REGISTERS
    cubin = lto_cubin(m.fa3_kernel.py_func, fa3_args(m), max_registers=m.MAX_REGISTERS)
    sass = nbc.sass(cubin)
    assert re.search(rf"USETMAXREG\.DEALLOC\S*\s+0x{m.PRODUCER_REGS:x}\b", sass)
    assert re.search(rf"USETMAXREG\.TRY_ALLOC\S*\s+\S+, 0x{m.CONSUMER_REGS:x}\b", sass)
    path = tmp_path / "fa3.cubin"
    path.write_bytes(cubin)
    res = subprocess.run([nbc._tool("cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True,
                         check=True)
    assert f"REG:{m.MAX_REGISTERS} " in res.stdout


def test_fa3_fallback_kernel_has_the_same_layout_without_setmaxnreg():
    m = load("fa3_producer_consumer")
    ptx, ops = build(m.fa3_kernel_plain.py_func, fa3_args(m))
    assert "setmaxnreg" not in ptx
    assert ops["UTMALDG.2D"] >= 2 and ops["UTMASTG.2D"] >= 4


# -- 4. LDGSTS pipeline ------------------------------------------------------------------------------
def test_ldgsts_pipeline_compiles():
    m = load("ldgsts_pipeline")
    ptx, ops = build(m.ldgsts_row_sum_kernel.py_func, (types.float32[:, ::1], types.float32[::1]))
    assert ptx.count("mbarrier.init.shared::cta.b64") == 2 * m.STAGES
    assert "cp.async.cg.shared.global" in ptx and ", 16;" in ptx
    assert "cp.async.mbarrier.arrive.noinc.shared.b64" in ptx
    assert "cp.async.bulk" not in ptx  # no TMA in this one
    assert count(ops, "LDGSTS") >= m.COPIES
    assert count(ops, "LDGSTS.E.BYPASS.128") == count(ops, "LDGSTS")  # 16-byte copies, L2 only
    assert count(ops, "ARRIVES.LDGSTSBAR") >= 1  # producer_commit_async
    assert count(ops, "SYNCS.PHASECHK") >= 2
    assert count(ops, "UTMALDG") == 0
    assert count(ops, "LDL") == count(ops, "STL") == 0


# -- numba-cuda's own GPU build path ------------------------------------------------------------------
def kernels_and_args():
    db, ws, fa, lg = (load(n) for n in SCRIPTS)
    t = tmap((db.ROWS, db.COLS), np.float32, (db.BM, db.BN))
    u = tmap((ws.ROWS, ws.COLS), np.float32, (ws.BM, ws.BN))
    return {
        "double_buffering": (db.double_buffer_kernel, (t, t, types.int64), "UTMALDG.2D"),
        "warp_specialized": (ws.warp_specialized_kernel, (u, u, types.int64, types.float32, types.float32),
                             "UTMASTG.2D"),
        "fa3_producer_consumer": (fa.fa3_kernel_plain, fa3_args(fa), "UTMASTG.2D"),
        "ldgsts_pipeline": (lg.ldgsts_row_sum_kernel, (types.float32[:, ::1], types.float32[::1]), "LDGSTS"),
    }


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_kernel_links_with_lto(name):
    """On a GPU with nvJitLink, numba-cuda builds kernels as LTO-IR and links them with LTO: that path works."""
    kernel, args, op = kernels_and_args()[name]
    assert count(opcodes(nbc.sass(lto_cubin(kernel.py_func, args))), op) >= 1


# -- layout constants --------------------------------------------------------------------------------
def test_layouts_fit_the_hardware():
    db, ws, fa, lg = (load(n) for n in SCRIPTS)
    for m in (db, ws, fa, lg):
        assert m.ROWS * m.COLS * 4 >= 256 << 20  # the problem is at least 256 MiB
    for m in (db, ws, fa):
        assert STATIC_SMEM_LIMIT < m.SMEM_BYTES <= DYNAMIC_SMEM_LIMIT  # dynamic shared memory, opt-in size
        assert (m.BN * 4) % 16 == 0  # innermost box / coordinate steps are multiples of 16 bytes
        assert m.ROWS % m.BM == 0 and m.COLS % m.BN == 0
    assert db.TILE % db.THREADS == 0 and ws.TILE % ws.CONSUMERS == 0
    assert fa.S_OFFSET % 1024 == 0 and fa.Q_OFFSET % 1024 == 0  # TMA tiles 128-byte aligned (here 1 KiB)
    assert (fa.BM * 4) % 16 == 0  # the scale tile's inner box (and the row coordinate) in 16-byte steps
    assert lg.STAGES * lg.BM * lg.BN * 4 + 16 * lg.STAGES <= STATIC_SMEM_LIMIT  # static is enough
    assert lg.BN % lg.CHUNK == 0 and lg.COLS % lg.CHUNK == 0  # every 16-byte copy is 16-byte aligned
    assert lg.BM * lg.BN == lg.COPIES * lg.THREADS * lg.CHUNK
    assert lg.ROWS % lg.BM == 0 and lg.COLS % lg.BN == 0


# -- the scripts without a GPU -------------------------------------------------------------------------
def run_script(name, **env_changes):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(env_changes)
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_in_the_simulator_without_a_gpu(name):
    """Without a usable GPU a script says so, re-runs itself in the CUDA simulator on a small problem and
    checks its result against NumPy there."""
    from gpuinfo import gpu_reason

    if gpu_reason() is None:
        pytest.skip("a GPU is present")
    out = run_script(name)
    assert out.returncode == 0, out.stdout + out.stderr
    first, *rest = out.stdout.strip().splitlines()
    assert first.startswith(f"{name}.py: it needs") and "running it in the CUDA simulator" in first
    assert any("OK" in line for line in rest), out.stdout
    assert rest[-1] == "(CUDA simulator: a small problem, no timing)"

