"""GPU: the debug mode (NUMBATMA_DEBUG=1) turns a hang or a TMA fault into a message and a failed launch, and
leaves a correct kernel correct. A trap ends the CUDA context, so each case runs in a fresh process
(``tests/debug_kernels.py CASE``) with a 200 ms timeout; the test reads that process's output."""
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import debug_kernels as dk

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parent / "debug_kernels.py"
FAILED = "DEBUG-CASE-LAUNCH-FAILED"


def run_case(case):
    env = dict(os.environ, NUMBATMA_DEBUG="1", NUMBATMA_DEBUG_TIMEOUT_MS="200", PYTHONUNBUFFERED="1")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    try:
        proc = subprocess.run([sys.executable, str(SCRIPT), case], env=env, capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired as exc:  # the debug build must not hang
        pytest.fail(f"case {case!r} did not finish in 120 s: {exc.stdout!r} {exc.stderr!r}")
    out = proc.stdout + proc.stderr
    assert "numbatma debug mode: True, timeout 200 ms" in out, out
    return out


def line_of(func, text):
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_correct_kernel_is_correct_in_debug_mode():
    out = run_case("ok")
    assert "DEBUG-CASE-OK results correct" in out, out
    assert "numbatma debug:" not in out and FAILED not in out, out


def test_expect_tx_too_large_times_out():
    out = run_case("hang")
    line = line_of(dk.hang, "mbarrier_wait_parity(bar, 0)")
    assert (f"numbatma debug: mbarrier_wait_parity timed out after 200 ms at debug_kernels.py:{line} (in hang): "
            f"barrier `bar` (shared address 0x") in out, out
    assert "did not complete its phase of parity 0 (parity `0`)" in out, out
    assert "; block (0, 0, 0) thread (" in out, out
    assert FAILED in out, out


def test_innermost_coordinate_not_16_bytes_traps_before_the_fault():
    out = run_case("coordinate")
    line = line_of(dk.bad_coordinate, "tma_load(tile, src, (0, col), bar)")
    assert (f"numbatma debug: tma_load at debug_kernels.py:{line} (in bad_coordinate): the innermost start "
            f"coordinate of (0, col) = (0, 1) is 1 elements of 4 bytes = 4 bytes, not a multiple of 16 bytes") in out, out
    assert "block (0, 0, 0) thread (0, 0, 0)" in out, out
    assert FAILED in out, out


def test_missing_producer_commit_times_out_in_consumer_wait():
    out = run_case("missing_commit")
    line = line_of(dk.missing_commit, "pipe = Pipeline(")
    assert ("numbatma debug: Pipeline.consumer_wait() timed out after 200 ms: the full barrier of stage 0 "
            "(shared address 0x") in out, out
    assert f"of the Pipeline `pipe` created at debug_kernels.py:{line} (in missing_commit) never completed" in out, out
    assert FAILED in out, out


def test_misaligned_dynamic_tile_traps():
    out = run_case("misaligned_tile")
    line = line_of(dk.misaligned_tile, "tma_load(tile, src, (0, 0), bar)")
    assert (f"numbatma debug: tma_load at debug_kernels.py:{line} (in misaligned_tile): the shared tile `tile` is "
            f"at shared address 0x") in out, out
    assert "not a multiple of 128 bytes" in out, out
    assert FAILED in out, out


def test_coordinate_beyond_32_bits_traps():
    out = run_case("wide_coordinate")
    assert ("the innermost" not in out and
            "coordinate 0 of (row, 0) = (4294967296, 0) does not fit in 32 bits" in out), out
    assert FAILED in out, out
