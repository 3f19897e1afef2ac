"""Under NUMBA_ENABLE_CUDASIM=1: the building blocks of ``numbatma.intrinsics.warp_roles`` run with their
intrinsics' semantics.

* examples/warp_roles_gemm.py (register_budget, warp_specialize, persistent_share, tile_origin,
  lagged_release, store_buffers) matches float64 NumPy, every entry of a NaN-poisoned C written, with one CTA
  walking several tiles and with two CTAs sharing them;
* pingpong + warpgroup_sync: two consumer warpgroups take turns appending to a log; the log holds the turns in
  ring order and each entry sums what the whole warpgroup wrote in that turn. Planted bugs: a consumer that
  skips its turn's wait is reported as a hang; a turn without the warpgroup barrier sums stale scratch.
* tile_handoff gathers every consumer's half; store_warp hands each consumer's buffer, round after round, to a
  store warp that copies it out (bulk_store). Planted bugs: a consumer missing from ``all()``, a store warp that
  skips a ``free`` - both reported as hangs.
"""
import importlib.util
import pathlib

import numpy as np
import pytest
from numba import cuda, float32

from numbatma.intrinsics import (bulk_commit_group, bulk_store, bulk_wait_group, pingpong, store_warp, tile_handoff,
                                 warpgroup_sync)
from numbatma.intrinsics._sim import SimulatedHang

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def _example():
    spec = importlib.util.spec_from_file_location("warp_roles_gemm", EXAMPLES / "warp_roles_gemm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("m, n, k, grid, tiles_per_cta", [
    (200, 128, 192, 1, 2),  # one CTA walks two row tiles (the second partial); three k-steps
    (136, 248, 64, 2, 2),  # two CTAs, 2 x 2 tiles (partial in M and N); one k-step: lagged_release's drain only
])
def test_example_gemm_matches_numpy(m, n, k, grid, tiles_per_cta):
    ex = _example()
    a, b_t, c, plan = ex.run(m, n, k, grid=grid, seed=m + n + k)
    assert plan.grid == grid and -(-m // ex.BM) * -(-n // ex.BN) == grid * tiles_per_cta
    assert not np.isnan(c).any(), f"{int(np.isnan(c).sum())} entries of C never written"
    assert ex.check(a, b_t, c) == 0
    ref = a.astype(np.float64) @ b_t.astype(np.float64).T
    np.testing.assert_allclose(c.astype(np.float64), ref, rtol=2e-3, atol=2e-2)


WARPGROUP, ROUNDS = 128, 3
ENTRIES = 2 * ROUNDS  # (a shared array's shape must be a constant)
turns = pingpong(2)  # barriers 3 and 4 (warpgroup_sync takes 1 and 2)


def _make_take_turns(skip_wait, skip_sync):
    @cuda.jit
    def take_turns(log):
        """256 threads: consumer warpgroups 0 and 1 take ROUNDS turns each. In a turn every thread of the
        warpgroup writes its slot of a shared scratch row, the warpgroup synchronises, and its thread 0 sums the
        row and appends (consumer, round, sum) to a shared log at a shared counter."""
        scratch = cuda.shared.array((2, WARPGROUP), np.int32)
        entries = cuda.shared.array((ENTRIES, 3), np.int32)
        count = cuda.shared.array(1, np.int32)
        if cuda.threadIdx.x == 0:
            count[0] = 0
        cuda.syncthreads()
        c = cuda.threadIdx.x // WARPGROUP
        tw = cuda.threadIdx.x % WARPGROUP
        turns.start(c, True)
        for r in range(ROUNDS):
            if not (skip_wait and c == 1):
                turns.wait_turn(c)
            scratch[c, tw] = 1000 * r + tw
            if not skip_sync:
                warpgroup_sync(c)
            if tw == 0:
                s = 0
                for t in range(WARPGROUP):
                    s += scratch[c, t]
                n = count[0]
                if n < 2 * ROUNDS:
                    entries[n, 0] = c
                    entries[n, 1] = r
                    entries[n, 2] = s
                count[0] = n + 1
            turns.pass_turn(c)
        turns.finish(c, True)
        cuda.syncthreads()
        if cuda.threadIdx.x < 2 * ROUNDS:
            for j in range(3):
                log[cuda.threadIdx.x, j] = entries[cuda.threadIdx.x, j]
        if cuda.threadIdx.x == 0:
            log[2 * ROUNDS, 0] = count[0]

    return take_turns


def _expected():
    rows = [(r2 % 2, r2 // 2, WARPGROUP * 1000 * (r2 // 2) + WARPGROUP * (WARPGROUP - 1) // 2)
            for r2 in range(2 * ROUNDS)]
    return np.array(rows + [(2 * ROUNDS, 0, 0)], np.int32)


def _launch(kernel):
    d_log = cuda.to_device(np.full((2 * ROUNDS + 1, 3), -1, np.int32))
    kernel[1, 2 * WARPGROUP](d_log)
    log = d_log.copy_to_host()
    log[2 * ROUNDS, 1:] = 0
    return log


def test_pingpong_turns_alternate_and_warpgroup_sync_gathers_the_warpgroup():
    np.testing.assert_array_equal(_launch(_make_take_turns(False, False)), _expected())


def test_planted_bug_consumer_skipping_its_turn_hangs():
    """Consumer 1 never waits for its turn: the turn barriers no longer balance (barrier 4 completes from
    consumer 0's hand-overs alone) and consumer 0 ends up waiting on barrier 3 (256 threads) for arrivals that
    never come - the simulator reports the hang instead of the GPU hanging."""
    with pytest.raises(SimulatedHang, match=r"named_barrier_sync\(3, 256\)"):
        _launch(_make_take_turns(True, False))


def test_planted_bug_without_warpgroup_sync_breaks_the_sums():
    """Thread 0 sums the scratch row without waiting for its warpgroup: some turn's sum misses other threads'
    writes of that round."""
    log = _launch(_make_take_turns(False, True))
    assert not np.array_equal(log[:, 2], _expected()[:, 2]), "a sum without warpgroup_sync came out right"


def _make_handoff(only_consumer_0):
    handoff = tile_handoff(2)

    @cuda.jit
    def halves(out):
        """Consumer warpgroup c writes row c of a shared tile, hands it to both (``all()``), then each thread of
        warpgroup c sums row 1 - c (the other's half); thread 0 of each warpgroup also checks ``own(c)``."""
        tile = cuda.shared.array((2, WARPGROUP), np.int32)
        c = cuda.threadIdx.x // WARPGROUP
        tw = cuda.threadIdx.x % WARPGROUP
        tile[c, tw] = 7 * c + tw
        if not only_consumer_0 or c == 0:
            handoff.all()
        out[c, tw] = tile[1 - c, tw]
        handoff.own(c)

    return halves


def test_tile_handoff_all_gathers_every_consumer():
    out = cuda.to_device(np.full((2, WARPGROUP), -1, np.int32))
    _make_handoff(False)[1, 2 * WARPGROUP](out)
    want = np.array([[7 * (1 - c) + t for t in range(WARPGROUP)] for c in range(2)], np.int32)
    np.testing.assert_array_equal(out.copy_to_host(), want)


def test_planted_bug_handoff_all_in_one_consumer_hangs():
    """Only consumer 0 calls ``all()``: named barrier 5 waits for 256 threads and gets 128 - reported as a hang."""
    with pytest.raises(SimulatedHang, match=r"named_barrier_sync\(5, 256\)"):
        _make_handoff(True)[1, 2 * WARPGROUP](cuda.to_device(np.zeros((2, WARPGROUP), np.int32)))


def _make_store_warp(rounds, skip_last_free):
    sw = store_warp(2)

    @cuda.jit
    def stores(out):
        """Each round, consumer warpgroup c (warpgroups 1, 2) writes its 128-float buffer (``acquire`` / ``publish``)
        and the store warp (warp 1 of warpgroup 0) copies both buffers to ``out[round, c]`` with ``bulk_store`` -
        one buffer per consumer, reused every round, so a round's writes wait until the last round's copy has read
        the buffer."""
        buf = cuda.shared.array((2, WARPGROUP), np.float32, alignment=128)
        wg = cuda.threadIdx.x // WARPGROUP
        tw = cuda.threadIdx.x % WARPGROUP
        if wg > 0:
            c = wg - 1
            for r in range(rounds):
                sw.acquire(c)
                buf[c, tw] = float32(1000 * r + 200 * c + tw)
                sw.publish(c)
        elif cuda.threadIdx.x // 32 == 1:
            lane = cuda.threadIdx.x % 32
            for r in range(rounds):
                if not (skip_last_free and r == rounds - 1):
                    sw.free(lane)
                for c in range(2):
                    sw.take(c)
                    if lane == 0:
                        bulk_store(out[r, c], buf[c])
                        bulk_commit_group()
            if lane == 0:
                bulk_wait_group(0)

    return stores


def test_store_warp_hands_every_round_of_both_consumers_over():
    rounds = 4
    out = cuda.to_device(np.full((rounds, 2, WARPGROUP), np.nan, np.float32))
    _make_store_warp(rounds, False)[1, 3 * WARPGROUP](out)
    want = np.array([[[1000 * r + 200 * c + t for t in range(WARPGROUP)] for c in range(2)] for r in range(rounds)],
                    np.float32)
    np.testing.assert_array_equal(out.copy_to_host(), want)


def test_planted_bug_store_warp_skipping_a_free_hangs():
    """The store warp does not free the buffers in the last round: both consumers wait at ``acquire`` (the "empty"
    barrier, 160 threads) for the store warp's arrival - reported as a hang."""
    with pytest.raises(SimulatedHang, match=r"named_barrier_sync\([6-9], 160\)"):
        _make_store_warp(3, True)[1, 3 * WARPGROUP](cuda.to_device(np.zeros((3, 2, WARPGROUP), np.float32)))
