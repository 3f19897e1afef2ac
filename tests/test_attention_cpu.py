"""CPU: numbatma.kernels.Attention plans (tile choice, argument checks in the user's terms) and what the compiled
kernel is made of, linked offline for sm_90a: every wgmma of a key block issued back to back (no wait between
the k-steps of QKᵀ or of PV), no local memory, ``setmaxnreg`` kept, TMA loads and stores; other targets refuse
it naming wgmma."""
import re

import numpy as np
import pytest

from numbatma import TensorMapError
from numbatma import compile as nbc
from numbatma.intrinsics._asm import UnsupportedTarget
from numbatma.kernels import Attention, _launch
from numbatma.kernels.attention import MAX_REGISTERS, default_config

from fakes import FakeCudaArray


@pytest.fixture(autouse=True)
def fixed_sm_count(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 132)


def arrays(b=2, hq=4, hk=4, sq=1000, sk=1000, d=128, layout="bhsd", dtype=np.float16):
    def shape(h, s):
        return (b, h, s, d) if layout == "bhsd" else (b, s, h, d)

    q = FakeCudaArray(shape(hq, sq), dtype, ptr=1 << 20)
    k = FakeCudaArray(shape(hk, sk), dtype, ptr=1 << 30)
    v = FakeCudaArray(shape(hk, sk), dtype, ptr=1 << 34)
    o = FakeCudaArray(shape(hq, sq), dtype, ptr=1 << 36)
    lse = FakeCudaArray((b, hq, sq), np.float32, ptr=1 << 40)
    return q, k, v, o, lse


def test_tile_choice():
    assert default_config(64) .bn == 128 and default_config(128).bn == 128 and default_config(256).bn == 64
    assert default_config(128).schedule == "overlap" and default_config(256).schedule == "serial"
    assert default_config(128).sweep == "heads"
    assert default_config(64).order == "snake"
    assert default_config(64).q_stages == 2 and default_config(64).stages == 4
    assert default_config(128).q_stages == 1 and default_config(128).stages == 3
    assert default_config(256).q_stages == 1 and default_config(256).stages == 2
    for d in (64, 128, 256):
        cfg = default_config(d)
        assert cfg.smem_bytes <= _launch.SMEM_PER_BLOCK - 1024
        assert cfg.stages >= 2
    assert default_config(128, bn=64, stages=2).smem_bytes == 128 * 128 * 2 + 2 * 2 * 64 * 128 * 2
    assert default_config(128, bn=64, stages=2, q_stages=2).smem_bytes == 2 * 128 * 128 * 2 + 2 * 2 * 64 * 128 * 2
    with pytest.raises(TensorMapError, match=r"stages=3 with head dim 128 and bn=128 needs .* \(with 2 Q stages\)"):
        default_config(128, stages=3, q_stages=2)


@pytest.mark.parametrize("change, message", [
    (dict(d=96), "head dim 96"),
    (dict(hq=6, hk=4), "multiple of the key/value heads"),
    (dict(sk=0), "no keys"),
])
def test_bad_shapes(change, message):
    with pytest.raises(TensorMapError, match=message):
        Attention(*arrays(**change))


def test_bad_arguments():
    q, k, v, o, lse = arrays()
    with pytest.raises(TensorMapError, match="layout must be 'bhsd'"):
        Attention(q, k, v, o, lse, layout="sbhd")
    with pytest.raises(TensorMapError, match="all be bfloat16 or all float16"):
        Attention(q, k, v, FakeCudaArray((2, 4, 1000, 128), np.float32, ptr=1 << 36), lse)
    with pytest.raises(TensorMapError, match="o takes q's shape"):
        Attention(q, k, v, FakeCudaArray((2, 4, 999, 128), np.float16, ptr=1 << 36), lse)
    with pytest.raises(TensorMapError, match=r"lse is a float32 array with shape \(2, 4, 999\)"):
        Attention(q, k, v, o, FakeCudaArray((2, 4, 999), np.float32, ptr=1 << 40))
    with pytest.raises(TensorMapError, match="bn must be an int in 16..64, got 128"):
        Attention(*arrays(d=256), bn=128)
    with pytest.raises(TensorMapError, match="stages=9"):
        Attention(q, k, v, o, lse, stages=9)
    with pytest.raises(TensorMapError, match="schedule must be one of 'serial', 'overlap', 'pingpong'"):
        Attention(q, k, v, o, lse, schedule="fast")
    with pytest.raises(TensorMapError, match="order must be one of 'snake', 'cyclic', got 'zigzag'"):
        Attention(q, k, v, o, lse, order="zigzag")
    with pytest.raises(TensorMapError, match="sweep must be one of 'heads', 'queries', got 'batch'"):
        Attention(q, k, v, o, lse, sweep="batch")
    with pytest.raises(TensorMapError, match="causal must be True or False, got 'yes'"):
        Attention(q, k, v, o, lse, causal="yes")
    for bad in ("0.1", True):
        with pytest.raises(TensorMapError, match=rf"scale must be a real number .*got {bad!r}"):
            Attention(q, k, v, o, lse, scale=bad)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(TensorMapError, match=rf"scale must be a finite number, got {bad!r}"):
            Attention(q, k, v, o, lse, scale=bad)


def test_work_items_and_flops():
    plan = Attention(*arrays(sq=1000, sk=1000, d=64), causal=True)
    assert plan.items == 2 * 4 * 8  # 8 blocks of 128 query rows per (batch, head)
    assert plan.flops == 4.0 * 2 * 4 * 1000 * 1000 * 64 * 0.5
    assert plan.grid == 64
    assert plan.output[1] is plan.lse


_SASS = {}


def _sass(d, causal, layout, schedule):
    key = (d, causal, layout, schedule)
    if key not in _SASS:
        plan = Attention(*arrays(d=d, layout=layout, hk=2), causal=causal, layout=layout, schedule=schedule)
        _SASS[key] = (plan, nbc.sass(nbc.compile_cubin(plan.kernel.py_func, plan.args, max_registers=MAX_REGISTERS)))
    return _SASS[key]


def _ops(sass):
    return [line.split("*/")[1].split(";")[0].split()[0] + (" " + line.split("gsb0, ")[1][:3] if "DEPBAR" in line
                                                            else "")
            for line in sass.splitlines() if "*/" in line and ("HGMMA" in line or "WARPGROUP.DEPBAR" in line)]


@pytest.mark.parametrize("d, causal, layout, schedule", [
    (64, False, "bhsd", "serial"), (128, True, "bshd", "serial"), (256, False, "bhsd", "serial"),
    (64, True, "bhsd", "overlap"), (128, False, "bhsd", "pingpong"), (128, True, "bshd", "pingpong")])
def test_kernel_sass(d, causal, layout, schedule):
    plan, sass = _sass(d, causal, layout, schedule)
    bn = plan.config.bn
    qk, pv = f"HGMMA.64x{bn}x16.F32", f"HGMMA.64x{d}x16.F32"
    ops = _ops(sass)
    if schedule == "serial":  # each product: its k-steps back to back, then one wait
        assert ops == [qk] * (d // 16) + ["WARPGROUP.DEPBAR.LE 0x0"] + [pv] * (bn // 16) + ["WARPGROUP.DEPBAR.LE 0x0"], ops
    else:  # block 0's S; then S of block j and P V of block j - 1 back to back, two waits; the last P V
        assert ops == ([qk] * (d // 16) + ["WARPGROUP.DEPBAR.LE 0x0"] + [qk] * (d // 16) + [pv] * (bn // 16)
                       + ["WARPGROUP.DEPBAR.LE 0x1", "WARPGROUP.DEPBAR.LE 0x0"] + [pv] * (bn // 16)
                       + ["WARPGROUP.DEPBAR.LE 0x0"]), ops
    assert "STL" not in sass and "LDL" not in sass, "local memory in the attention kernel"
    assert sass.count("USETMAXREG") == 2
    assert "UTMALDG" in sass and "UTMASTG" in sass
    assert re.search(r"MUFU\.EX2", sass)
    if schedule == "pingpong":  # the consumers' turns: bar.sync / bar.arrive on barriers 3 and 4
        assert "BAR.ARV" in sass


def test_other_targets_refuse_wgmma():
    plan = Attention(*arrays(d=64))
    with pytest.raises(UnsupportedTarget, match="wgmma"):
        nbc.compile_ptx(plan.kernel.py_func, plan.args, arch="sm_100a")
