"""Planted wgmma bugs (issue 22): what the hardware does asynchronously for wgmma, checked by the simulator. A wgmma
reads its shared operands from its issue until the wgmma_wait_group that retires its commit group, and writes its
accumulator registers until then; register A fragments and accumulators written by other instructions need a
wgmma_fence; ordinary shared stores need fence.proxy.async before the async proxy reads them; the warpgroup issues it
together; an mbarrier's arrival count must match its arrivals per phase.

Each kernel carries one bug when ``bug`` names it and is its correct twin when ``bug`` is 0 (the same kernel with the
bug fixed): every bug must be reported every time, whatever order the simulated threads run in, naming the array or
stage and a line of this file; every twin must run clean and give the right answer against NumPy. Each case runs
RUNS times. The kernels are tiny: one warpgroup (plus a producer warp), m64n16k16 float16 (small integers: every sum
is exact), 32-byte swizzled tiles."""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_ref,
    mbarrier_wait_parity,
    shared_view,
    tma_load,
    wgmma,
    wgmma_a_fragments,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_map,
    wgmma_row_col,
    wgmma_store_global,
    wgmma_wait_group,
    wgmma_zeros,
)
from numbatma.intrinsics._sim import SimulatedHang, SimulatedMisuse

RUNS = 5
HERE = r"test_sim_wgmma_hazards\.py:\d+"
N = 16  # m64n16k16: the accumulator is 64 x 16
BK = 16  # one k-step of float16 per k-tile: 32-byte rows, 32-byte swizzle
STAGES = 2
KT = 4  # k-tiles of the pipelined kernels (stage 0 is refilled)
A_RING, B_RING = STAGES * 64 * BK, STAGES * N * BK  # (elements: shared array shapes are compile-time constants)
RNG = np.random.default_rng()

# bugs of `single`
(ACC_INDEX, ACC_STORE, ACC_MAP, WAIT1, NO_FENCE, ST_SHARED, EXPECT_TX_LONG, EXPECT_TX_SHORT, PARTIAL,
 NEVER_WAITED) = range(1, 11)
REFILL_EARLY = 1  # prefetch
RELEASE_EARLY, COUNT_SMALL = 1, 2  # pipeline
NO_PROXY_FENCE, FENCE_AFTER_BARRIER = 1, 2  # generic_b
UNFENCED_A = 1  # fragments


# == kernels ========================================================================================================
@cuda.jit(device=True)
def _times(x, half, col, extra):
    return x * extra


@cuda.jit
def single(a_map, b_map, out, junk, bug):
    """One warpgroup: thread 0 loads A (64 x 16) and B (16 x 16); acc = 2 (A @ B^T)."""
    a_t = cuda.shared.array((64, BK), np.float16, alignment=1024)
    b_t = cuda.shared.array((N, BK), np.float16, alignment=1024)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if tid == 0:
        tx = a_map.box_bytes + b_map.box_bytes
        if bug == EXPECT_TX_LONG:
            tx += 64
        if bug == EXPECT_TX_SHORT:
            tx = a_map.box_bytes  # (B's bytes go to the next phase)
        mbarrier_arrive_expect_tx(bar, tx)
        tma_load(a_t, a_map, (0, 0), bar)
        tma_load(b_t, b_map, (0, 0), bar)
    mbarrier_wait_parity(bar, 0)
    if bug == PARTIAL and tid != 0:
        return
    acc = wgmma_zeros(N)
    if bug != NO_FENCE:
        acc = wgmma_fence(acc)
    acc = wgmma(acc, wgmma_desc(a_t, a_map, "K", 0, 0), wgmma_desc(b_t, b_map, "K", 0, 0), 1)
    wgmma_commit_group()
    if bug == NEVER_WAITED:
        return
    if bug == ACC_INDEX:
        junk[tid] = acc[0]
    if bug == ACC_STORE:
        wgmma_store_global(acc, out, 0, 0)
    if bug == ACC_MAP:
        acc = wgmma_map(acc, _times, np.float32(2))
    if bug == ST_SHARED and tid < N:
        b_t[tid, 0] = 0
    acc = wgmma_wait_group(1 if bug == WAIT1 else 0, acc)
    if bug != ACC_INDEX:
        junk[tid] = acc[0]
    if bug != ST_SHARED and tid < N:
        b_t[tid, 0] = 0  # (after the wait: the tensor cores are done with B)
    if bug != ACC_MAP:
        acc = wgmma_map(acc, _times, np.float32(2))
    wgmma_store_global(acc, out, 0, 0)


@cuda.jit(device=True)
def load_stage(a_s, b_s, full, a_map, b_map, kt):
    """Thread-level: load k-tile ``kt`` of A and B into stage kt % STAGES."""
    s = kt % STAGES
    bar = mbarrier_ref(full, s)
    mbarrier_arrive_expect_tx(bar, a_map.box_bytes + b_map.box_bytes)
    tma_load(shared_view(a_s, s * 64 * BK, (64, BK)), a_map, (0, kt * BK), bar)
    tma_load(shared_view(b_s, s * N * BK, (N, BK)), b_map, (0, kt * BK), bar)


@cuda.jit(device=True)
def mma_stage(acc, a_s, b_s, a_map, b_map, s):
    a_stage = shared_view(a_s, s * 64 * BK, (64, BK))
    b_stage = shared_view(b_s, s * N * BK, (N, BK))
    return wgmma(acc, wgmma_desc(a_stage, a_map, "K", 0, 0), wgmma_desc(b_stage, b_map, "K", 0, 0), 1)


@cuda.jit
def prefetch(a_map, b_map, out, bug):
    """One warpgroup, 2 stages, 4 k-tiles: thread 0 refills a stage once the wgmma reading it is retired (bug:
    right after the commit, before the wait)."""
    a_s = cuda.shared.array(A_RING, np.float16, alignment=1024)
    b_s = cuda.shared.array(B_RING, np.float16, alignment=1024)
    full = cuda.shared.array(STAGES, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        for s in range(STAGES):
            mbarrier_init(mbarrier_ref(full, s), 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if tid == 0:
        for kt in range(STAGES):
            load_stage(a_s, b_s, full, a_map, b_map, kt)
    acc = wgmma_fence(wgmma_zeros(N))
    for kt in range(KT):
        s = kt % STAGES
        mbarrier_wait_parity(mbarrier_ref(full, s), (kt // STAGES) % 2)
        acc = mma_stage(acc, a_s, b_s, a_map, b_map, s)
        wgmma_commit_group()
        if bug == REFILL_EARLY and tid == 0 and kt + STAGES < KT:
            load_stage(a_s, b_s, full, a_map, b_map, kt + STAGES)
        acc = wgmma_wait_group(0, acc)
        if bug != REFILL_EARLY and tid == 0 and kt + STAGES < KT:
            load_stage(a_s, b_s, full, a_map, b_map, kt + STAGES)
    wgmma_store_global(acc, out, 0, 0)


@cuda.jit
def pipeline(a_map, b_map, out, bug):
    """Warp-specialised, 2 stages, 4 k-tiles: warp 4's lane 0 produces, warpgroup 0 consumes and releases each stage
    with one arrival per warp after the wait that retires its wgmma. Bug 1: released between the commit and the
    wait; bug 2: the empty barriers are created with an arrival count of 1 instead of 4."""
    a_s = cuda.shared.array(A_RING, np.float16, alignment=1024)
    b_s = cuda.shared.array(B_RING, np.float16, alignment=1024)
    full = cuda.shared.array(STAGES, np.uint64)
    empty = cuda.shared.array(STAGES, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        for s in range(STAGES):
            mbarrier_init(mbarrier_ref(full, s), 1)
            mbarrier_init(mbarrier_ref(empty, s), 1 if bug == COUNT_SMALL else 4)
        fence_mbarrier_init()
    cuda.syncthreads()
    if tid >= 128:
        if tid == 128:
            for kt in range(KT):
                if kt >= STAGES:
                    mbarrier_wait_parity(mbarrier_ref(empty, kt % STAGES), (kt // STAGES - 1) % 2)
                load_stage(a_s, b_s, full, a_map, b_map, kt)
        return
    acc = wgmma_fence(wgmma_zeros(N))
    for kt in range(KT):
        s = kt % STAGES
        mbarrier_wait_parity(mbarrier_ref(full, s), (kt // STAGES) % 2)
        acc = mma_stage(acc, a_s, b_s, a_map, b_map, s)
        wgmma_commit_group()
        if bug == RELEASE_EARLY and tid % 32 == 0:
            mbarrier_arrive(mbarrier_ref(empty, s))
        acc = wgmma_wait_group(0, acc)
        if bug != RELEASE_EARLY and tid % 32 == 0:
            mbarrier_arrive(mbarrier_ref(empty, s))
    wgmma_store_global(acc, out, 0, 0)


@cuda.jit
def generic_b(a_map, b_map, b_src, out, bug):
    """B written by the threads (st.shared, the 32-byte swizzle applied by hand), A by TMA; every writer fences
    (fence.proxy.async) before the block barrier that precedes the wgmma (bug 1: nobody fences; bug 2: the fence
    comes after the barrier, where it orders nothing before the other threads' wgmma)."""
    a_t = cuda.shared.array((64, BK), np.float16, alignment=1024)
    b_t = cuda.shared.array((N, BK), np.float16, alignment=1024)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    for e in (tid, tid + 128):
        r, c = e // BK, e % BK
        b_t[r, (((c // 8) ^ ((r // 4) % 2)) * 8) + c % 8] = b_src[r, c]
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    if bug == 0:
        fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if bug == FENCE_AFTER_BARRIER:
        fence_proxy_async_shared_cta()
    if tid == 0:
        mbarrier_arrive_expect_tx(bar, a_map.box_bytes)
        tma_load(a_t, a_map, (0, 0), bar)
    mbarrier_wait_parity(bar, 0)
    acc = wgmma(wgmma_fence(wgmma_zeros(N)), wgmma_desc(a_t, a_map, "K", 0, 0), wgmma_desc(b_t, b_map, "K", 0, 0), 1)
    wgmma_commit_group()
    wgmma_store_global(wgmma_wait_group(0, acc), out, 0, 0)


@cuda.jit
def fragments(a_map, b_map, out, bug):
    """P = A @ B^T, then O = f16(P) @ B^T with P as register A fragments, passed through the wgmma_fence before the
    second wgmma (bug: the fence is given only O)."""
    a_t = cuda.shared.array((64, BK), np.float16, alignment=1024)
    b_t = cuda.shared.array((N, BK), np.float16, alignment=1024)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if tid == 0:
        mbarrier_arrive_expect_tx(bar, a_map.box_bytes + b_map.box_bytes)
        tma_load(a_t, a_map, (0, 0), bar)
        tma_load(b_t, b_map, (0, 0), bar)
    mbarrier_wait_parity(bar, 0)
    p = wgmma(wgmma_fence(wgmma_zeros(N)), wgmma_desc(a_t, a_map, "K", 0, 0), wgmma_desc(b_t, b_map, "K", 0, 0), 1)
    wgmma_commit_group()
    p = wgmma_wait_group(0, p)
    frags = wgmma_a_fragments(p, "f16")
    o = wgmma_zeros(N)
    if bug == UNFENCED_A:
        o = wgmma_fence(o)
    else:
        o, frags = wgmma_fence((o, frags))
    o = wgmma(o, frags[0], wgmma_desc(b_t, b_map, "K", 0, 0), 1)
    wgmma_commit_group()
    wgmma_store_global(wgmma_wait_group(0, o), out, 0, 0)


# == inputs and references =============================================================================================
def _ints(shape, top=2):
    return RNG.integers(-top, top + 1, size=shape).astype(np.float16)


def _maps(k):
    a, b = _ints((64, k)), _ints((N, k))
    return a, b, numbatma.TensorMap(a, (64, BK), swizzle=32), numbatma.TensorMap(b, (N, BK), swizzle=32)


def _ref(a, b):
    return a.astype(np.float64) @ b.astype(np.float64).T


def _first_registers(ref):
    """What thread t holds in register 0 of the accumulator ``ref``."""
    return np.array([ref[wgmma_row_col(0, t)] for t in range(128)], np.float32)


def _single(bug):
    a, b, a_map, b_map = _maps(BK)
    out, junk = np.full((64, N), np.nan, np.float32), np.full(128, np.nan, np.float32)
    single[1, 128](a_map, b_map, out, junk, bug)
    ref = _ref(a, b)
    np.testing.assert_array_equal(out, 2 * ref)
    np.testing.assert_array_equal(junk, _first_registers(ref))


def _pipelined(kernel, threads):
    def run(bug):
        a, b, a_map, b_map = _maps(KT * BK)
        out = np.full((64, N), np.nan, np.float32)
        kernel[1, threads](a_map, b_map, out, bug)
        np.testing.assert_array_equal(out, _ref(a, b))

    return run


def _generic_b(bug):
    a, b, a_map, b_map = _maps(BK)
    out = np.full((64, N), np.nan, np.float32)
    generic_b[1, 128](a_map, b_map, b, out, bug)
    np.testing.assert_array_equal(out, _ref(a, b))


def _fragments(bug):
    a, b, a_map, b_map = _maps(BK)
    out = np.full((64, N), np.nan, np.float32)
    fragments[1, 128](a_map, b_map, out, bug)
    p = _ref(a, b)  # (integers below 2^11: exact in float16)
    np.testing.assert_array_equal(out, p @ b.astype(np.float64).T)


RUNNERS = {"single": _single, "prefetch": _pipelined(prefetch, 128), "pipeline": _pipelined(pipeline, 160),
           "generic_b": _generic_b, "fragments": _fragments}

STAGE_WRITE = (rf"writes bytes \[\d+, \d+\) of '{{array}}' \(declared at .*{HERE}\) while the [AB] operand of the "
               rf"wgmma issued at .*{HERE} may still read them")

# name -> (runner, bug, exception(s), regex)
CASES = {
    "refill_before_wait_group": (
        "prefetch", REFILL_EARLY, SimulatedMisuse,
        rf"the tile the TMA load at .*{HERE} fills .*" + STAGE_WRITE.format(array="[ab]_s")
        + r".*this thread has not executed the wait that retires it"),
    "release_before_wait": (
        "pipeline", RELEASE_EARLY, SimulatedMisuse,
        rf"thread \(128, 0, 0\): the tile the TMA load at .*{HERE} fills .*" + STAGE_WRITE.format(array="[ab]_s")
        + r".*(no thread of the issuing warpgroup has executed the wait that retires it yet|retired it "
          r"\(wgmma_wait_group\), but no synchronisation orders that wait before this write)"),
    "st_shared_into_operand_in_flight": (
        "single", ST_SHARED, SimulatedMisuse,
        rf"the st\.shared at .*{HERE} " + STAGE_WRITE.format(array="b_t")),
    "missing_fence_accumulator": (
        "single", NO_FENCE, SimulatedMisuse,
        rf"wgmma at .*{HERE} accumulates into registers that other instructions wrote .* with no wgmma_fence"),
    "missing_fence_register_a": (
        "fragments", UNFENCED_A, SimulatedMisuse,
        rf"wgmma at .*{HERE} reads A fragments written at .*{HERE} with no wgmma_fence after them \(or one that "
        r"was not given them"),
    "accumulator_indexed_before_wait": (
        "single", ACC_INDEX, SimulatedMisuse,
        rf"accumulator\[0\] reads an accumulator that the wgmma at .*{HERE} is still writing"),
    "accumulator_stored_before_wait": (
        "single", ACC_STORE, SimulatedMisuse,
        rf"wgmma_store_global reads an accumulator that the wgmma at .*{HERE} is still writing"),
    "accumulator_mapped_before_wait": (
        "single", ACC_MAP, SimulatedMisuse,
        rf"wgmma_map reads an accumulator that the wgmma at .*{HERE} is still writing"),
    "wait_group_1_instead_of_0": (
        "single", WAIT1, SimulatedMisuse,
        rf"accumulator\[0\] reads an accumulator that the wgmma at .*{HERE} is still writing: read it only from the "
        r"value returned by the wgmma_wait_group that covers"),
    "expect_tx_too_large": (
        "single", EXPECT_TX_LONG, SimulatedHang,
        rf"mbarrier 'bar' \(declared at .*{HERE}\).*delivered 64 bytes fewer than expect_tx announced"),
    "expect_tx_short_by_a_tile": (
        # (B's bytes complete the next phase: the wgmma reads B before they are known complete - or, when a thread
        # gets to the wgmma before thread 0 issued B's load, that load lands on the operand in flight)
        "single", EXPECT_TX_SHORT, SimulatedMisuse,
        rf"(wgmma reads shared bytes \[0, 512\) of the tile the TMA load at .*{HERE} fills .*before that copy is "
        rf"known complete: it completes phase 1 .*of mbarrier 'bar'|" + STAGE_WRITE.format(array="b_t") + ")"),
    "fewer_than_128_threads_issue": (
        "single", PARTIAL, SimulatedHang,
        rf"wgmma_fence at .*{HERE}, which all 128 threads 0\.\.127 execute together \(\.sync\.aligned\)"),
    "never_waited_at_exit": (
        "single", NEVER_WAITED, SimulatedMisuse,
        rf"returns with the [AB] operand of the wgmma issued at .*{HERE} still in flight \(reading bytes \[\d+, "
        rf"\d+\) of '[ab]_t' \(declared at .*{HERE}\)\)"),
    "st_shared_then_wgmma_without_proxy_fence": (
        "generic_b", NO_PROXY_FENCE, SimulatedMisuse,
        rf"wgmma from a shared tile that .* wrote .* without fence_proxy_async_shared_cta .*'b_t' \(declared at "
        rf".*{HERE}\); the wgmma at .*{HERE}"),
    "proxy_fence_after_the_barrier": (
        # (a thread whose wgmma runs before some writer fenced sees that writer's bytes unfenced)
        "generic_b", FENCE_AFTER_BARRIER, SimulatedMisuse,
        rf"wgmma from a shared tile that .* wrote .* (and fenced at .*{HERE} \(fence_proxy_async_shared_cta\), but "
        rf"no synchronisation orders that fence before this read|without fence_proxy_async_shared_cta).*'b_t' "
        rf"\(declared at .*{HERE}\); the wgmma at .*{HERE}"),
    "mbarrier_arrival_count_too_small": (
        "pipeline", COUNT_SMALL, SimulatedMisuse,
        rf"mbarrier_arrive: thread \(\d+, 0, 0\) arrives on mbarrier 'empty\[[01]\]' \(declared at .*{HERE}\) in its "
        rf"phase 1, but it has seen only 0 of its 1 completed phase\(s\).*arrival count 1 given to mbarrier_init at "
        rf".*{HERE}"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_planted_bug_is_reported_every_time(name):
    runner, bug, exc, pattern = CASES[name]
    for _ in range(RUNS):
        with pytest.raises(exc, match=pattern):
            RUNNERS[runner](bug)


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_twin_runs_clean_and_correct(runner):
    for _ in range(RUNS):
        RUNNERS[runner](0)


def test_enough_planted_bugs():
    assert len(CASES) >= 10
    assert {runner for runner, *_ in CASES.values()} == set(RUNNERS)  # (every twin is the fix of some bug)
