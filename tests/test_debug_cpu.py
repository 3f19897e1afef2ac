"""CPU tests of the GPU debug mode (NUMBATMA_DEBUG=1, numbatma/debug.py): the default build holds no debug code;
a debug build (compiled in a fresh process, as the mode is process-wide) bounds every wait with %globaltimer,
prints through vprintf and traps, names the kernel's variables and lines, and links for sm_90a; the
lowering-site hook and the on-disk cache key."""
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import cuda, types

import numbatma
import numbatma.debug as debug
from numbatma import _numba_internals as internals
from numbatma import compile as nbc

import debug_kernels as dk

HERE = Path(__file__).resolve().parent
DEBUG_MARKERS = ("%globaltimer", "vprintf", "trap;", "numbatma_20debug")

pytestmark = pytest.mark.skipif(numbatma.SIMULATING, reason="compiles PTX")


def _line_of(func, text):
    """The file line of the first statement of ``func`` containing ``text``."""
    lines, first = inspect.getsourcelines(func)
    for offset, line in enumerate(lines):
        if text in line:
            return first + offset
    raise AssertionError(f"{text!r} not in {func.__name__}")


def _strings(ptx):
    """The NUL-terminated constant strings of a PTX module (format strings, the pipeline's origin)."""
    import re

    out = []
    for m in re.finditer(r"\.b8 \S+\[\d+\] = \{([^}]*)\}", ptx):
        out.append(bytes(int(x) for x in m.group(1).split(",")).rstrip(b"\0").decode())
    return out


# -- debug off: nothing changes ----------------------------------------------------------------------------
@pytest.mark.skipif(debug.ENABLED, reason="this process is a debug one (NUMBATMA_DEBUG set)")
def test_default_build_has_no_debug_code():
    ptx = nbc.compile_ptx(dk.representative, dk.representative_types())
    assert "mbarrier.try_wait.parity.shared::cta.b64" in ptx and "cp.async.bulk.tensor.2d" in ptx
    for marker in DEBUG_MARKERS:
        assert marker not in ptx, marker
    assert "NBTMA_DBG" not in ptx


# -- debug on: a fresh process --------------------------------------------------------------------------------
_COMPILE_ALL = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numbatma, numbatma.debug
assert numbatma.debug.ENABLED and numbatma.debug.TIMEOUT_MS == 200
import debug_kernels as dk
from numba import types
from numbatma import compile as nbc
t = dk.representative_types()
kernels = {
    "representative": (dk.representative, t),
    "hang": (dk.hang, (t[0], t[2])),
    "bad_coordinate": (dk.bad_coordinate, (t[0], t[2], types.int32)),
    "missing_commit": (dk.missing_commit, (t[0], t[2])),
    "misaligned_tile": (dk.misaligned_tile, (t[0], t[2], types.int32)),
    "wide_coordinate": (dk.wide_coordinate, (t[0], t[2], types.int64)),
}
out = {name: nbc.compile_ptx(fn, sig) for name, (fn, sig) in kernels.items()}
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def debug_ptx(tmp_path_factory):
    path = tmp_path_factory.mktemp("debug") / "ptx.json"
    env = dict(os.environ, NUMBATMA_DEBUG="1", NUMBATMA_DEBUG_TIMEOUT_MS="200")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    proc = subprocess.run([sys.executable, "-c", _COMPILE_ALL, str(HERE), str(path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(path.read_text())


def test_debug_build_bounds_every_wait(debug_ptx):
    ptx = debug_ptx["representative"]
    for marker in DEBUG_MARKERS:
        assert marker in ptx, marker
    # bounded waits: mbarrier_wait_parity, mbarrier_wait (token), producer_acquire and consumer_wait (their loops
    # of 4 may be unrolled); no plain loop is left
    assert ptx.count("mov.u64 t0, %globaltimer") >= 4
    assert "setp.lt.u64 p, t1, 200000000;" in ptx  # 200 ms in ns
    assert "NBTMA_WAIT_PARITY:" not in ptx and "NBTMA_WAIT_TOKEN:" not in ptx
    assert "NBTMA_DBG_WAIT_PARITY:" in ptx and "NBTMA_DBG_WAIT_TOKEN:" in ptx
    assert "mbarrier.try_wait.shared::cta.b64" in ptx  # the token wait
    text = "\n".join(_strings(ptx))
    line = _line_of(dk.representative, "mbarrier_wait_parity(bars, 0)")
    assert (f"mbarrier_wait_parity timed out after 200 ms at debug_kernels.py:{line} (in representative): "
            f"barrier `bars`") in text
    line = _line_of(dk.representative, "mbarrier_wait(bar, token)")
    assert f"mbarrier_wait timed out after 200 ms at debug_kernels.py:{line} (in representative): barrier `bar`" in text
    assert "state token `token` = 0x%llx" in text
    line = _line_of(dk.representative, "pipe = Pipeline(")
    assert f"the Pipeline `pipe` created at debug_kernels.py:{line} (in representative)" in text
    assert "Pipeline.consumer_wait() timed out after 200 ms: the full barrier of stage %d" in text
    assert "Pipeline.producer_acquire() timed out after 200 ms: the empty barrier of stage %d" in text
    assert "block (%u, %u, %u) thread (%u, %u, %u)" in text


def test_debug_build_runtime_checks(debug_ptx):
    text = "\n".join(_strings(debug_ptx["bad_coordinate"]))
    line = _line_of(dk.bad_coordinate, "tma_load(tile, src, (0, col), bar)")
    assert (f"tma_load at debug_kernels.py:{line} (in bad_coordinate): the innermost start coordinate of (0, col) = "
            f"(%lld, %lld) is %lld elements of 4 bytes = %lld bytes, not a multiple of 16 bytes") in text
    text = "\n".join(_strings(debug_ptx["misaligned_tile"]))
    line = _line_of(dk.misaligned_tile, "tma_load(tile, src, (0, 0), bar)")
    assert (f"tma_load at debug_kernels.py:{line} (in misaligned_tile): the shared tile `tile` is at shared "
            f"address 0x%x, not a multiple of 128 bytes") in text
    text = "\n".join(_strings(debug_ptx["wide_coordinate"]))
    assert "coordinate 0 of (row, 0) = (%lld, %lld) does not fit in 32 bits" in text
    text = "\n".join(_strings(debug_ptx["missing_commit"]))
    line = _line_of(dk.missing_commit, "pipe = Pipeline(")
    assert f"the Pipeline `pipe` created at debug_kernels.py:{line} (in missing_commit)" in text
    assert "producer_commit missing" in text


def test_debug_build_links_for_sm90a(debug_ptx):
    for name, ptx in debug_ptx.items():
        cubin = nbc.link_cubin(ptx, "sm_90a")
        assert cubin[:4] == b"\x7fELF", name


def test_debug_sass_has_trap_and_timer(debug_ptx):
    try:
        text = nbc.sass(nbc.link_cubin(debug_ptx["hang"], "sm_90a"))
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert "BPT.TRAP" in text or "TRAP" in text
    assert "GLOBALTIMER" in text.upper()


# -- the lowering-site hook (hook 10) ---------------------------------------------------------------------------
def test_debug_hook_points():
    points = internals._debug_hook_points()
    for label, (owner, attr) in points.items():
        assert callable(getattr(owner, attr, None)), label
    from numba.cuda import lowering

    # lower_block sets self.loc and calls self.lower_inst(inst) for every statement; the wrapper relies on it
    src = inspect.getsource(lowering.BaseLower.lower_block)
    assert "self.lower_inst(inst)" in src and "self.loc = inst.loc" in src
    assert list(inspect.signature(lowering.Lower.lower_inst).parameters) == ["self", "inst"]
    assert "func_ir" in inspect.getsource(lowering.BaseLower.__init__)


def test_lowering_site_names_the_kernel_operands():
    from numba.cuda.extending import intrinsic

    from numbatma.intrinsics import mbarrier_ref

    internals.install_lowering_sites()  # (recording only; code generation is unchanged)
    seen = []

    @intrinsic
    def probe(typingctx, a, b):
        def codegen(context, builder, sig, args):
            seen.append(internals.lowering_site())
            return context.get_constant(types.int32, 7)

        return types.int32(a, b), codegen

    def kernel(out, k):
        bars = cuda.shared.array(4, np.uint64)
        row = k + 1
        result = probe(mbarrier_ref(bars, 2), (row, k * 2))
        out[0] = result

    nbc.compile_ptx(kernel, (types.int32[:], types.int32))
    site = seen[-1]
    assert site.filename == __file__ and site.line == _line_of(kernel, "result = probe(")
    assert site.function.endswith("kernel")
    assert site.target == "result"
    assert site.args == ("bars[2]", "(row, k * 2)")


def test_lowering_site_outside_lowering_is_none():
    assert internals.lowering_site() is None


# -- settings and cache keys --------------------------------------------------------------------------------------
def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("NUMBATMA_DEBUG", "1")
    assert debug._read_enabled()
    for off in ("", "0", "no"):
        monkeypatch.setenv("NUMBATMA_DEBUG", off)
        assert not debug._read_enabled()
    monkeypatch.setenv("NUMBATMA_DEBUG_TIMEOUT_MS", "250")
    assert debug._read_timeout_ms() == 250
    monkeypatch.delenv("NUMBATMA_DEBUG_TIMEOUT_MS")
    assert debug._read_timeout_ms() == 2000
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv("NUMBATMA_DEBUG_TIMEOUT_MS", bad)
        with pytest.raises(ValueError, match="NUMBATMA_DEBUG_TIMEOUT_MS"):
            debug._read_timeout_ms()


def test_disk_cache_key_separates_debug_builds(monkeypatch):
    wrapped = internals._debug_index_key(lambda self, sig, codegen: ("sig", "magic"))
    monkeypatch.setattr(debug, "ENABLED", False)
    assert wrapped(None, None, None) == ("sig", "magic")  # a normal build keeps upstream's key
    monkeypatch.setattr(debug, "ENABLED", True)
    monkeypatch.setattr(debug, "TIMEOUT_MS", 200)
    assert wrapped(None, None, None) == ("sig", "magic", ("numbatma_debug", 200))
