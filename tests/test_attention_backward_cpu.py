"""CPU tests of numbatma.kernels.AttentionBackward: its arguments refused in the user's terms before any GPU work
(shapes, dtypes, layouts, head dims, grouped heads, the forward's lse, the scale, stages, a non-contiguous head
dim), and the main kernel compiled for sm_90a: wgmma products back to back, two setmaxnreg, no local memory at
D = 64. (Correctness: tests/sim/test_sim_attention_backward.py in the simulator, tests/test_gpu_attention_backward.py
on the GPU.)"""
import importlib
import itertools
import re

import numpy as np
import pytest

from fakes import FakeCudaArray
from launch_types import launch_types
from numbatma import TensorMapError, array_layout
from numbatma.compile import compile_cubin, sass
from numbatma.kernels import AttentionBackward

backward_module = importlib.import_module("numbatma.kernels.attention_backward")


def main_sass(plan):
    """SASS of the plan's main kernel for sm_90a under the launch's register cap (168), typed as a launch types it."""
    return sass(compile_cubin(plan.kernel.py_func, launch_types(plan.args), max_registers=168))


def wgmma_ops(text):
    """The HGMMA and WARPGROUP.DEPBAR (wgmma wait) opcodes of a SASS listing, in order."""
    return [line.split("*/")[1].split(";")[0].split()[0] for line in text.splitlines()
            if "*/" in line and ("HGMMA" in line or "WARPGROUP.DEPBAR" in line)]


@pytest.fixture(autouse=True)
def no_gpu_scratch(monkeypatch):
    """The plan's float32 work arrays as stand-ins (no GPU here)."""
    ptrs = itertools.count(1)
    monkeypatch.setattr(backward_module, "_scratch_maker", lambda q: (
        lambda shape, dtype=np.float32: FakeCudaArray(shape, dtype, ptr=next(ptrs) << 44)))


def arrays(b=2, hq=4, hk=2, sq=1000, sk=1000, d=64, layout="bhsd", dtype=np.float16, **change):
    def shape(h, s):
        return (b, h, s, d) if layout == "bhsd" else (b, s, h, d)

    ptr = iter(range(20, 48, 2))
    made = dict(q=shape(hq, sq), k=shape(hk, sk), v=shape(hk, sk), o=shape(hq, sq), do=shape(hq, sq),
                lse=(b, hq, sq), dq=shape(hq, sq), dk=shape(hk, sk), dv=shape(hk, sk))
    out = {}
    for name, shp in made.items():
        spec = change.get(name, (shp, np.float32 if name == "lse" else dtype))
        out[name] = FakeCudaArray(spec[0], spec[1], ptr=1 << next(ptr))
    return [out[n] for n in ("q", "k", "v", "o", "do", "lse", "dq", "dk", "dv")]


@pytest.mark.parametrize("change, options, message", [
    (dict(), dict(layout="bsdh"), "layout must be 'bhsd' .* or 'bshd' .*, got 'bsdh'"),
    (dict(k=((2, 2, 1000, 64), np.float32)), dict(), "k is a .*float32.*must all be bfloat16 or all float16"),
    (dict(dq=((2, 4, 999, 64), np.float16)), dict(), r"dq is \(2, 4, 999, 64\) but q is \(2, 4, 1000, 64\)"),
    (dict(dv=((2, 2, 1000, 32), np.float16)), dict(), r"dv is \(2, 2, 1000, 32\) but k is"),
    (dict(lse=((2, 4, 1000), np.float16)), dict(), "lse is .*; it must be the forward's float32 log-sum-exp"),
    (dict(), dict(scale=2.0), r"\|scale\| must be at most 1 .* got 2.0"),
    (dict(), dict(scale=float("nan")), "scale must be a finite number"),
    (dict(), dict(stages=5), "stages must be an int(?:eger)? in 1..4, got 5"),
    (dict(d=128), dict(stages=4), "stages=4 and kv_stages=1 with head dim 128 need .* bytes of shared memory; a block may use"),
    (dict(), dict(causal=1), "causal must be True or False, got 1"),
    (dict(), dict(dq_reduce="red"), "dq_reduce must be .*'tma'.*'atomic'.*, got 'red'"),
    (dict(), dict(dq_split="rows"), "dq_split must be .*'cols'.*'keys'.*, got 'rows'"),
    (dict(), dict(deterministic=1), "deterministic must be True or False, got 1"),
    (dict(), dict(pingpong="yes"), "pingpong must be True or False, got 'yes'"),
    (dict(), dict(kv_stages=3), "kv_stages must be an int(?:eger)? in 1..2, got 3"),
    (dict(d=256), dict(kv_stages=2), "stages=1 and kv_stages=2 with head dim 256 need"),
    (dict(), dict(deterministic=True, dq_reduce="atomic"), "deterministic=True orders dq's TMA reduce-adds; it "
                                                            "cannot order dq_reduce='atomic'"),
    (dict(), dict(dq_split="cols"), "dq_split='cols' is not a choice at head dim 64: 'cols' needs 128"),
    (dict(d=256), dict(dq_split="keys"), "dq_split='keys' is not a choice at head dim 256"),
    (dict(), dict(kv_registers=1), "kv_registers must be True or False, got 1"),
    (dict(d=128), dict(kv_registers=True), "kv_registers=True needs head dim 64 .*64 more registers a thread at "
                                           "head dim 128"),
    (dict(), dict(dq_writer=1), "dq_writer must be True or False, got 1"),
    (dict(d=128), dict(dq_writer=True, dq_reduce="atomic"), "dq_writer=True hands dq's TMA reduce-adds to a store "
                                                             "warp; dq_reduce='atomic' has none"),
    (dict(), dict(dv_first="no"), "dv_first must be True or False, got 'no'"),
    (dict(), dict(persistent=0), "persistent must be True or False, got 0"),
    (dict(sq=65535 * 32 + 1, sk=100), dict(), r"q has 2097121 query rows .*the row kernels take at most 2097120"),
    (dict(), dict(queries=96), "queries must be 64 or 128, got 96"),
    (dict(d=128), dict(queries=128), "queries=128 .* needs head dim 64 .*got head dim 128"),
    (dict(), dict(queries=128, kv_registers=True), "kv_registers=True and queries=128 do not fit together"),
    (dict(), dict(queries=128, deterministic=True, dq_writer=True), "deterministic=True with queries=128 orders the "
                                                                     "consumers' own reduce-adds; it is not "
                                                                     "implemented with dq_writer=True"),
    (dict(), dict(queries=128, dq_split="keys"), "dq_split='keys' is not a choice with queries=128"),
    (dict(), dict(persistent=False, deterministic=True), "deterministic=True needs persistent=True"),
    (dict(d=128), dict(split_scores=True), "split_scores=True shares .* at head dim 256 .*got head dim 128"),
    (dict(d=256), dict(split_scores="yes"), "split_scores must be True or False, got 'yes'"),
])
def test_bad_arguments(change, options, message):
    with pytest.raises(TensorMapError, match="AttentionBackward: " + message):
        AttentionBackward(*arrays(**change), **options)


def test_no_queries_is_refused_not_left_unwritten():
    with pytest.raises(TensorMapError, match="q has no query rows .*dk and dv are then all 0"):
        AttentionBackward(*arrays(sq=0))


def test_other_head_dims_and_uneven_groups_are_refused():
    with pytest.raises(TensorMapError, match="head dim 96 .*supported: 64, 128, 256"):
        AttentionBackward(*arrays(d=96))
    with pytest.raises(TensorMapError, match="q has 3 heads and k/v 2"):
        AttentionBackward(*arrays(hq=3, hk=2))


def test_the_kernel_compiles_without_local_memory():
    """D = 64 with 64 queries a step and K and V in registers (kv_registers): the products back to back, Sᵀ and
    dPᵀ (the first eight) with register A fragments - eight LDSM.x4 (ldmatrix) per item - as dV (issued before the
    dSᵀ barrier: dv_first) and dK, dQ's A (dSᵀ) from shared memory between them."""
    plan = AttentionBackward(*arrays(d=64), causal=False, kv_registers=True)
    assert plan.queries == 64 and not AttentionBackward(*arrays(d=128)).kv_registers
    text = main_sass(plan)
    ops = wgmma_ops(text)
    assert ops.count("HGMMA.64x64x16.F32") == 20  # Sᵀ, dPᵀ: 4 k-steps each; dV, dK: 4 each; dQ: 4
    hgmma = [line.split("*/")[1] for line in text.splitlines() if "*/" in line and "HGMMA" in line]
    register_a = [bool(re.search(r"HGMMA\.\S+ R\d+, R\d+, gdesc", line)) for line in hgmma]
    assert register_a == [True] * 12 + [False] * 4 + [True] * 4, hgmma
    assert text.count("LDSM.16.M88.4") == 8
    assert "STL" not in text and "LDL" not in text, "local memory in the backward kernel"
    assert text.count("USETMAXREG") == 2 and "UTMAREDG.4D.ADD" in text and "UTMALDG" in text  # (dQ: TMA reduce-add)


@pytest.mark.parametrize("d, spills", [(128, 0), (256, 55)])
def test_local_memory_at_head_dims_128_and_256_stays_within_its_pin(d, spills):
    """D = 128 without local memory, D = 256 within its pin (not yet removed, issue 26), as measured on 2026-11-28:
    the producer warpgroup's loop counters and TMA coordinates in 32-bit arithmetic took D = 128 from 20 (18 of them
    the producer's, at 24 registers) to 0 and D = 256 from 82 to 55 (split_scores had taken it from 90; 113 before
    dK and dV left the per-step fence and wait and dQ's reduce-adds moved to the store warp; 118 before the
    consumers' 32-bit descriptor and index arithmetic). A change that adds spills - as a constant flag in an
    inlined helper once doubled them - fails here, and wgmma stays unserialized (one wait per commit group, not per
    instruction). D = 256 (split_scores): Sᵀ and dPᵀ m64n32 (16 k-steps each), dV and dK 2 k-steps from registers
    and 2 from the other consumer's shared halves each, dQ two chunks of 4."""
    plan = AttentionBackward(*arrays(d=d), causal=False)
    text = main_sass(plan)
    local = text.count("STL") + text.count("LDL")
    assert local <= spills, f"{local} local-memory instructions at D = {d} (pinned at {spills})"
    ops = wgmma_ops(text)
    assert ops.count("WARPGROUP.DEPBAR.LE") <= 8, "wgmma serialized"
    if d == 256:
        assert plan.split_scores
        assert [ops.count(f"HGMMA.64x{n}x16.F32") for n in (32, 64, 128)] == [32, 8, 8], ops


def test_row_kernels_move_8_byte_words_where_every_row_allows():
    """o, do, dq rows on 8-byte boundaries: the row kernels read and write 64-bit words (four elements); a view
    whose rows start 4 bytes in takes 32-bit words (tests/sim: the same gradients)."""
    from numbatma import array_layout

    plan = AttentionBackward(*arrays(d=64))
    assert array_layout(plan.prep.args[0]).dtype == np.uint64 and array_layout(plan.post.args[1]).dtype == np.uint64
    narrow = arrays(d=64)
    narrow[6] = FakeCudaArray((2, 4, 1000, 64), np.float16, ptr=(1 << 40) + 4)  # dq: rows 4 bytes past 8
    plan = AttentionBackward(*narrow)
    assert array_layout(plan.post.args[1]).dtype == np.uint32 and array_layout(plan.prep.args[0]).dtype == np.uint64


def test_default_schedule_per_head_dim():
    """Q/dO stages, staged dQ buffers, dQ's split and who issues its reduce-adds, by head dim: D = 64 128 queries a
    step, two stages, each consumer adding the dQ of its own 64 queries and issuing its own reduce-adds from two
    rotating buffers; D = 128
    three stages, the consumers splitting dQ's columns, one buffer each for the store warp (``dq_writer``; without
    it two stages and two buffers - a third stage would cost the second); D = 256 one stage, the consumers splitting
    the head dim, two buffers each (its two chunks) for the store warp. dV first everywhere."""
    got = {d: (p.stages, p.dq_buffers, p.dq_split, p.dq_writer, p.dv_first, p.queries) for d in (64, 128, 256)
           for p in [AttentionBackward(*arrays(d=d))]}
    assert got == {64: (2, 2, "keys", False, True, 128), 128: (3, 1, "cols", True, True, 64),
                   256: (1, 2, "halves", True, True, 64)}
    # 64 queries a step where an option needs them (kv_registers, dq_split, deterministic with the store warp): D = 64
    # three stages then; a CTA per item only at D = 256 causal (not deterministic); split scores at D = 256
    assert [(p.queries, p.stages) for p in (AttentionBackward(*arrays(d=64), **o) for o in (
        dict(kv_registers=True), dict(dq_split="keys"), dict(deterministic=True, dq_writer=True)))] == [(64, 3)] * 3
    assert [AttentionBackward(*arrays(d=d), causal=c, deterministic=det).persistent
            for d, c, det in ((256, True, False), (256, True, True), (256, False, False), (128, True, False))] == [
        False, True, True, True]
    assert [AttentionBackward(*arrays(d=d)).split_scores for d in (64, 128, 256)] == [False, False, True]
    assert [(p.stages, p.dq_buffers) for p in (AttentionBackward(*arrays(d=128), dq_writer=False, **o)
                                                for o in ({}, {"stages": 3}))] == [(2, 2), (3, 1)]
    assert not AttentionBackward(*arrays(d=128), dq_reduce="atomic").dq_writer  # (no reduce-adds to hand over)
    # two K/V stages: D = 64 keeps three Q/dO stages and two dQ buffers with 64 queries a step (two stages and one
    # buffer with 128), D = 128 is left one Q/dO stage (and the store warp's one buffer)
    assert [(p.stages, p.dq_buffers) for p in (AttentionBackward(*arrays(d=d), kv_stages=2, **o) for d, o in (
        (64, dict(queries=64)), (64, {}), (128, {})))] == [(3, 2), (2, 1), (1, 1)]


def test_head_dim_256_takes_one_stage_by_default():
    """D = 256: 64 keys an item, K and V 32 KiB each, a Q/dO stage 64 KiB: two stages do not fit beside the static
    tiles."""
    assert AttentionBackward(*arrays(d=256)).stages == 1 and AttentionBackward(*arrays(d=128)).stages == 3
    with pytest.raises(TensorMapError, match="stages=2 and kv_stages=1 with head dim 256 need"):
        AttentionBackward(*arrays(d=256), stages=2)


def test_the_deterministic_variant_compiles_without_serializing():
    """``deterministic=True``: thread 0 of a consumer waits for the query block's turn (an atomic read in a loop),
    reduce-adds, waits for the additions and counts them (an atomic add); the wgmma products stay back to back:
    one wait per commit group (Sᵀ, dPᵀ, dV, dQ, dK) and one at the item's end, not one per instruction (20).
    (D = 64 here, the quickest build; the GPU tests run all three head dims.)"""
    plan = AttentionBackward(*arrays(d=64), deterministic=True)
    assert plan.queries == 128  # (the default tile at D = 64)
    text = main_sass(plan)
    assert "UTMAREDG.4D.ADD" in text and "ATOMG.E.ADD" in text or "ATOM.E.ADD" in text
    ops = wgmma_ops(text)
    assert ops.count("HGMMA.64x128x16.F32") == 8 and ops.count("HGMMA.64x64x16.F32") == 24, ops
    assert ops.count("WARPGROUP.DEPBAR.LE") <= 6, "wgmma serialized"


def test_an_empty_problem_re_points_too():
    """Batch 0: the plan computes nothing and builds no row kernels' plans; the function form's cache still
    re-points it at new (empty) arrays without error (``Plan.subplans`` absent), and its launch returns them."""
    old = arrays(b=0)
    new = [FakeCudaArray(array_layout(a).shape, array_layout(a).dtype, ptr=array_layout(a).ptr + (5 << 24))
           for a in old]
    plan = AttentionBackward(*old)
    assert plan.kernel is None and plan.rebind(*new) is plan
    assert plan.launch() == tuple(new[6:])


def test_dq_split_keys_at_head_dim_128_is_the_kernel_built():
    """``dq_split="keys"`` at D = 128: each consumer computes both 64-wide dQ chunks over its own keys, so the store
    warp reduce-adds two chunks of each consumer per block - 8 TMA reduce-add sites against the default ("cols")
    kernel's 4. (The kernel once shadowed its ``split`` argument with split_scores' flag and built "cols" for
    "keys": right gradients, the option silently not honoured.)"""
    text = main_sass(AttentionBackward(*arrays(d=128), dq_split="keys"))
    assert text.count("UTMAREDG.4D.ADD") == 8


def test_the_atomic_dq_variant_compiles():
    """``dq_reduce="atomic"`` (the benchmark's comparison): one red.global.add.f32 per dQ element, no TMA reduce."""
    plan = AttentionBackward(*arrays(d=64), dq_reduce="atomic")
    text = main_sass(plan)
    assert "REDG.E.ADD.F32" in text and "UTMAREDG" not in text


def test_128_queries_a_step_at_head_dim_64():
    """``queries=128`` (FA3's D = 64 tile): Sᵀ and dPᵀ as m64n128 products (four k-steps each), dV and dK over 128
    queries (eight k-steps each, P and dS from registers), each consumer's dQ of its own 64 queries over both key
    halves (two products of four k-steps); K and V from shared memory (no registers left for them), two stages;
    one wait per commit group; local memory pinned (measured 2026-11-28: 16, 4 of them in the loop; 32
    before the producer's 32-bit counters). The default at D = 64."""
    plan = AttentionBackward(*arrays(d=64))
    assert (plan.queries, plan.stages, plan.kv_registers, plan.dq_writer) == (128, 2, False, False)
    text = main_sass(plan)
    ops = wgmma_ops(text)
    assert ops.count("HGMMA.64x128x16.F32") == 8 and ops.count("HGMMA.64x64x16.F32") == 24, ops
    assert ops.count("WARPGROUP.DEPBAR.LE") <= 6, "wgmma serialized"
    assert text.count("STL") + text.count("LDL") <= 16


def test_a_re_point_moves_the_row_kernels_views_too_and_fresh_work_arrays_follow():
    """The function form caches the plan (``Plan.rebind`` / ``fresh_outputs``): every descriptor and view over an
    argument moves by that argument's shift - the row kernels' plans' views as well, and those plans are told
    (``Plan.subplans``: their next launch patches the new addresses in); the three work arrays are the plan's own
    (``owned_output``): a re-point keeps them, ``fresh_outputs`` makes them again and moves what views them."""
    old = arrays(d=64)
    new = [FakeCudaArray(array_layout(a).shape, array_layout(a).dtype, ptr=array_layout(a).ptr + (5 << 24))
           for a in old]
    plan = AttentionBackward(*old, causal=True)
    for p in (plan, plan.prep, plan.post):
        p.__dict__["_stale"] = False  # (as after a launch)
    work = plan.owned_outputs
    ptr = lambda x: array_layout(x).ptr  # noqa: E731
    before = [ptr(a) for a in plan.prep.args[:3]] + [ptr(plan.post.args[1]), plan.q_map._layout.ptr]
    assert plan.rebind(*new) is plan
    after = [ptr(a) for a in plan.prep.args[:3]] + [ptr(plan.post.args[1]), plan.q_map._layout.ptr]
    assert [a - b for a, b in zip(after, before)] == [5 << 24] * 5  # (o, do, lse; dq; q's descriptor)
    assert plan.prep._stale and plan.post._stale and plan.dq is new[6]
    assert plan.owned_outputs == work and ptr(plan.prep.args[4]) == ptr(work[1])  # (dq's accumulator: kept)
    plan.fresh_outputs()
    assert all(a is not b for a, b in zip(plan.owned_outputs, work))
    views = (plan.prep.args[3], plan.prep.args[4], plan.post.args[0], plan.args[7], plan.args[8])
    assert [ptr(v) for v in views] == [ptr(plan.stats), ptr(plan.dqacc), ptr(plan.dqacc), ptr(plan.dqacc),
                                       ptr(plan.turns)]
    assert plan.stats_map._layout.ptr == ptr(plan.stats) and plan.dq_map._layout.ptr == ptr(plan.dqacc)
