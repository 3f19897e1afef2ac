"""How an :class:`~numbatma.kernels.Attention` plan is configured: the tile options (:class:`AttentionConfig`,
:func:`default_config`: every default measured on an H100, by head dim, mask and key length), the softmax mode a
scale selects (:func:`softmax_mode`) and the autotuner's candidates (:data:`TUNE_SPACE`). Host-side only; the
kernel (kernels/attention.py) takes what is chosen here as compile-time constants."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from numbatma import TensorMapError
from numbatma.intrinsics import register_budget

from ._launch import SMEM_PER_BLOCK
from ._options import bool_option, choice_option, int_option, scalar_option

BM = 128  # query rows per item: two consumer warpgroups x 64
WG_ROWS = 64
CHUNK = 64  # head-dim elements per box: one 128-byte swizzle row of bf16/f16
WARPGROUP = 128
BUDGET = register_budget(2)  # 168 registers a thread at launch; 40 for the producer, 232 for each consumer
MAX_REGISTERS = BUDGET.launch  # (the same at launch for every producer budget: register_budget(2, 24).launch)
HEAD_DIMS = (64, 128, 256)
DTYPES = ("bfloat16", "float16")
LAYOUTS = ("bhsd", "bshd")
LOG2E = 1.4426950408889634
LN2_F32 = np.float32(0.6931471805599453)
NEG_INF = np.float32(-np.inf)
POS_INF = np.float32(np.inf)
LOG2E_F32 = np.float32(LOG2E)
FLT_MAX = float(np.finfo(np.float32).max)
RESCALE_THRESHOLD = np.float32(8.0)  # lazy_rescale: O kept at maxima up to 2^8 below the rows' (FA4's choice)
FUSED_MAX_SCALE = 1.0  # |scale| up to this: the fused softmax (the default); beyond: "exact" (see softmax_mode)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
_STATIC_SMEM = 1024  # the pipelines' barriers (static shared memory)
SCHEDULES = ("serial", "overlap", "pingpong")
ORDERS = ("snake", "cyclic")  # how a persistent CTA takes its items, round after round
SWEEPS = ("heads", "queries")  # which index of the items varies fastest


@dataclass(frozen=True)
class AttentionConfig:
    """What an :class:`Attention` plan runs: key block ``bn``, K/V pipeline ``stages``, the shared memory, and the
    consumers' ``schedule``: "serial" (each product issued and waited for in turn), "overlap" (FA3's intra-warpgroup
    overlap: ``S`` of block j issued together with ``P V`` of block j - 1, the softmax of j running while ``P V``
    does) or "pingpong" (overlap, and the two consumer warpgroups take turns to issue - named barriers - so that
    one's softmax runs under the other's products).

    How the persistent CTAs share the items (``G`` CTAs, items numbered as ``sweep`` says): in round ``r`` CTA ``c``
    takes item ``r G + c`` ("cyclic"), or ``r G + G - 1 - c`` in the odd rounds ("snake": with causal items ordered
    longest first, every CTA's total work comes out within a few percent of the mean; cyclic leaves the first
    CTAs up to 25% more). ``sweep``: "heads" numbers the items (batch, head) fastest, "queries" query block
    fastest (the CTAs running at once then share fewer heads' K and V in L2: the default for full attention,
    where it is up to 7.5% faster, and for causal attention over up to 2048 keys, up to 44% faster there; longer
    causal keeps "heads", whose longest-first order balances the CTAs).

    ``q_stages``: Q tiles in shared memory (each also the O staging tile of its item). With 2 the producer loads
    the next item's Q while the consumers still compute (and store) this one's - what short sequences need.

    ``producer_registers``: the producer warpgroup's register budget (24, 32 or 40; the consumers get what it gives
    back: 240, 232 or 232 registers).

    ``o_buffer``: O is staged for its TMA store in a tile of its own (``128 D`` elements) instead of the item's Q
    stage. Then the Q stage goes back to the producer as soon as the item's last ``Q Kᵀ`` has completed (not after
    the epilogue's stores have read it), and no consumer thread waits for a store in the epilogue: the previous
    item's store, one item ago, is all that the next staging waits for. Off by default: on an H100 it measured
    within 1% of the Q-stage staging at D = 64 and 128 (S = 512 to 8192, full and causal) - the stores' waits were
    not what short sequences lose time on.

    ``carry``: the "overlap" pipeline carried from one item to the next: the next item's first ``Q Kᵀ`` is issued
    with this item's last ``P V`` and its first softmax runs under it, then this item's epilogue - an item costs
    its key blocks, without a pipeline start and drain of its own. Needs the "overlap" schedule, two K/V
    ``stages`` and the next item's Q beside this one's (``q_stages = 2``, or ``o_buffer``); head dim 64 only (at
    128 ptxas serializes the carried kernel's wgmmas for want of registers). Measured on an H100 (D = 64): +1.0%
    full and +1.8% causal at S = 8192, 0 to +1.6% at S = 512..2048 - so off by default.

    ``cluster_m``: 2 runs the CTAs in clusters of two that take neighbouring query blocks of one head (full
    attention only: both see every key block): each CTA TMA-loads half of every K and V tile and multicasts it
    into both, so each K/V byte leaves L2 once per pair (FA3's cluster for full attention at D >= 128). Measured on
    an H100: 5-8% behind the default at every head dim and length (the pair's pipelines run in lockstep; the K/V
    traffic it saves was not what limited the kernel), so off by default.

    ``lazy_rescale``: O and the row sums are rescaled only when a row's maximum grows by more than
    ``RESCALE_THRESHOLD`` (8, in log2 units: FA4's rule on Blackwell) - decided per warp (``vote.any``), so that a
    warp whose 16 rows all stay within the threshold skips the ``D / 2`` multiplications a thread (and the two
    ``exp2`` of the factors) with a branch. The weights are then ``exp2(S c - m)`` with ``m`` up to 8 below the
    row's running maximum: at most 256, exact in float16 and bfloat16's range, the row sum and O in float32 -
    the result is the same softmax (``O / l`` and the log-sum-exp ``m + log2 l`` do not depend on which ``m``).
    The "fused" and "zero" softmax modes; the "exact" mode (|scale| > 1) always rescales.

    ``poly_exp2``: the share of the weights (0, 1/8, 2/8, ... 1) whose ``exp2`` runs on the FMA units
    (:func:`numbatma.intrinsics.poly_exp2`: a cubic, nine FMA-pipe instructions, relative error 7.5e-5) instead
    of the multi-function unit's ``MUFU.EX2`` (16 a clock per SM on an H100: at head dim 64 the weights of a block
    take it as long as the block's two products take the tensor cores) - FA4's emulated ``exp2`` on Blackwell.
    Columns whose 8-column group ``g`` has ``g % 8 < 8 · poly_exp2`` take the polynomial."""

    bn: int
    stages: int
    smem_bytes: int
    schedule: str = "pingpong"
    order: str = "snake"
    sweep: str = "heads"
    q_stages: int = 1
    producer_registers: int = 40
    o_buffer: bool = False
    carry: bool = False
    cluster_m: int = 1
    lazy_rescale: bool = False
    poly_exp2: float = 0.0

    @property
    def budget(self):
        """The kernel's :func:`numbatma.intrinsics.register_budget`: 40 producer registers give each consumer 232,
        24 give it 240 (FA3's split) - room for a wider key block."""
        return register_budget(2, producer=self.producer_registers)

    @property
    def tile(self):
        return (BM, self.bn)


def softmax_mode(scale):
    """How the kernel applies ``scale`` (a finite float): ``(mode, negative, kernel scalar)``, the mode and sign
    compile-time constants of the kernel, the scalar its last argument.

    * "fused" (0 < |scale| <= ``FUSED_MAX_SCALE``; the default scale's mode, FlashAttention's):
      ``P = exp2(S · c - m)`` with ``c = scale · log2 e`` (float32) and ``m`` the running maximum of ``S · c``, one
      FMA per element. A negative scale (``negative``) takes the raw row *minimum* (the maximum of ``S · c``) and
      masks with +inf (``+inf · c = -inf``). Exact to float32 rounding while ``|S · c| < 2^26`` for every logit
      (the FMA's rounding of ``m`` is a common factor of the row, ``exp2`` of up to ``|m| 2^-24``, which P must
      hold in float16): with ``|scale| <= 1`` every logit below 4.6e7 in magnitude.
    * "exact" (|scale| > ``FUSED_MAX_SCALE``): the running raw extremum ``M`` and ``P = exp2((S - M) · scale ·
      log2 e)``: ``S - M`` never has the scale's sign, so the exponent is <= 0 or -inf (no ``inf - inf``,
      whatever the scale up to float32's largest); ``lse = M · scale + ln l`` (±inf exactly where the true lse is
      beyond float32). One subtraction and one multiplication more per element than "fused".
    * "zero" (scale 0, or so small that ``scale · log2 e`` is 0 in float32: |scale| < 5e-46, where
      ``|scale · logit| < 2e-7`` for every float32 logit): every unmasked key weighs 1 (logits replaced by 0,
      masked keys -inf, then "fused" with ``c = 1``): ``o`` the mean of V over them, ``lse = ln(their count)``.

    |scale| beyond float32's largest (3.4e38) is refused: the kernel computes in float32."""
    if abs(scale) > FLT_MAX:
        raise TensorMapError(f"Attention: scale must be at most {FLT_MAX:.8g} in magnitude (the kernel's softmax is "
                             f"float32), got {scale!r}")
    c = np.float32(scale * LOG2E) if abs(scale) <= FUSED_MAX_SCALE else None
    if scale == 0 or c == 0:
        return "zero", False, ONE
    if c is not None:
        return "fused", scale < 0, c
    return "exact", scale < 0, np.float32(scale)


# autotune=True: the configurations tried besides the default (options of Attention), per head dim; duplicates of
# the default for a mask are dropped (benchmarks/attention.py --only tiles measured each at S = 8192)
TUNE_SPACE = {
    64: (dict(bn=128), dict(bn=192, schedule="pingpong"), dict(bn=64)),
    128: (dict(schedule="pingpong"), dict(bn=176), dict(bn=64, q_stages=2)),
    256: (dict(schedule="overlap", producer_registers=24), dict(schedule="serial", producer_registers=40),
          dict(bn=96, schedule="serial", producer_registers=24)),
}
TILE_OPTIONS = ("bn", "stages", "schedule", "q_stages", "producer_registers", "o_buffer", "carry", "cluster_m",
                "lazy_rescale", "poly_exp2")
MAX_BN = {64: 192, 128: 192, 256: 96}  # keys per block at most (the consumers' registers: S, P and O)
PRODUCER_REGISTERS = (24, 32, 40)


def default_config(d, *, bn=None, stages=None, schedule=None, order="snake", sweep=None, q_stages=None,
                   producer_registers=None, causal=False, sk=None, o_buffer=None, carry=None,
                   cluster_m=None, lazy_rescale=None, poly_exp2=None):
    """``bn = 128`` keys per block for D = 128 and causal D = 64, 192 for full D = 64, 80 for full D = 256 and 64
    for causal D = 256 (S takes bn / 2 registers per thread, P bn / 4, O D / 2); two Q stages for D = 64 and for
    D = 128 but causal attention over more than 2048 keys, one otherwise (measured on an H100: two Q stages +10% at
    D = 64 S = 1024, where 4 K/V stages still fit; at D = 128, where they leave room for 2 K/V stages instead of 3,
    +2% full at S = 8192, +6-7% full and +1.5-6% causal at S <= 1024, +2.3% causal at 2048, -2% causal at 8192); as many K/V stages as shared memory then holds, at most 4 (2 for D = 256); the "overlap" schedule; the producer's register budget 24 for D = 256 overlapped (its consumers get
    240: S, P and O fit without spilling, full and causal, every softmax mode) but causal over up to 2048 keys (the
    query-first sweep's item arithmetic spills in a 24-register producer; 40 leaves 232, enough for 64-key blocks),
    40 otherwise; the snake order over
    items numbered (batch, head) first for causal attention over more than 2048 keys, query block first otherwise
    (``sweep``). ``causal``:
    the plan's mask (the tile may depend on it); ``sk``: the key length, when known (full D = 64 takes 128-key blocks where 192 would pad the
    last block by more than 3% of the keys: S = 1024 has 5 1/3 blocks of 192). No default depends on the scale's
    softmax mode (:func:`softmax_mode`): every mode's kernel of each default compiles without local memory.

    Measured on an H100 (benchmarks/RESULTS.md, ``--only variants`` and ``--only tiles``, runs interleaved with
    cuDNN's): overlap 1-3% ahead of pingpong at D = 64 and 128; at D = 256 overlap with 240-register consumers
    12% ahead of serial (full and causal, S = 8192; the "exact" mode not measured); bn = 192 at full D = 64 +3%
    (causal +2.5%, but its SASS spills: not taken), wider blocks at D = 128 (FA3's 176) 4-7% behind 128; snake 10%
    ahead of cyclic for causal; the query-first sweep 24-30% behind for causal at S >= 4096 (its longest items
    all come first, to the same CTAs) but ahead at S <= 2048 (D = 128: +25% at S = 512, +14% at 1024, +6% at 2048;
    the CTAs running at once share each head's K and V), and 0-7.5% ahead for full attention (B4 S1024 D128
    +7.5%, D256 S8192 +4%, D128 S8192 equal: the CTAs running at once share the K and V of fewer heads in L2);
    at S = 1024, D = 64, 128-key blocks 15% ahead of 192."""
    short = sk is not None and sk <= 2048  # (a few key blocks per item: the per-item costs weigh more)
    if sweep is None:  # (causal, S <= 2048, queries first: D = 128 +25/+14/+6% at S = 512/1024/2048, D = 256
        # +44/+22/+7%, D = 64 +9/+1/-1%; at S = 4096 -24..-29%, where the longest items pile up on the same CTAs)
        sweep = "heads" if causal and not short else "queries"
    if schedule is None:  # (D = 256 overlapped holds S, P and O at once: only the 240-register consumers fit them)
        schedule = "overlap"
    for name, value, choices in (("schedule", schedule, SCHEDULES), ("order", order, ORDERS), ("sweep", sweep, SWEEPS)):
        choice_option("Attention", name, value, choices)
    if bn is None:  # (D = 64 causal: 192 spills in the mask code, and gains only 2.5%)
        if d == 64:
            bn = 192 if not causal and (sk is None or _padding(sk, 192) <= 0.03) else 128
        elif d == 128:
            bn = 128
        else:  # (80 keys, full attention: +4% at S = 1024..4096, +6% at 8192, +7% at 16384; causal -2..-5%)
            bn = 64 if causal else 80
    most = MAX_BN[d]  # S (bn / 2), P (bn / 4) and O (D / 2) live in the consumer's registers
    bn = int_option("Attention", "bn", bn, 16, most)
    if bn % 16:
        raise TensorMapError(f"Attention: bn (keys per block) must be a multiple of 16 in 16..{most} for head dim "
                             f"{d}, got {bn}")
    if q_stages is None:  # D = 128: two Q stages for full attention (+2% S = 8192, +6-7% S <= 1024), and for short
        # causal (+1.5-6% at S <= 1024, -2% at 8192)
        q_stages = 2 if d == 64 or (d == 128 and bn <= 128 and (not causal or short)) else 1  # (bn <= 128: 2 K/V fit)
    q_stages = int_option("Attention", "q_stages", q_stages, 1, 2)
    q_bytes = q_stages * BM * d * 2
    o_bytes = BM * d * 2  # (O's own staging tile, with o_buffer)
    stage_bytes = 2 * bn * d * 2  # K and V
    room = SMEM_PER_BLOCK - _STATIC_SMEM - q_bytes
    if o_buffer is not None:
        o_buffer = bool_option("Attention", "o_buffer", o_buffer)
    fit = (room - (o_bytes if o_buffer else 0)) // stage_bytes
    if stages is None:
        stages = min(4 if d < 256 else 2, fit)
    stages = int_option("Attention", "stages", stages, 1, 64)
    if o_buffer is None:  # (measured within 1% either way at D = 64 and 128, S = 512..8192: left off)
        o_buffer = False
    if stages > fit:
        raise TensorMapError(f"Attention: stages={stages} with head dim {d} and bn={bn} needs "
                             f"{q_bytes + stages * stage_bytes + (o_bytes if o_buffer else 0)} bytes of shared memory "
                             f"(with {q_stages} Q stage{'s' if q_stages > 1 else ''}"
                             f"{' and an O buffer' if o_buffer else ''}); at most {fit} stages fit in "
                             f"the {SMEM_PER_BLOCK} bytes a block may use")
    if producer_registers is None:
        # (causal with the query-first sweep: the producer's item arithmetic spills at 24 - to local memory, once
        # an item; with 40 the consumers get 232, which a causal D = 256 block of 64 keys fits without spilling)
        producer_registers = 24 if d == 256 and schedule != "serial" and not (causal and sweep == "queries") else 40
    producer_registers = int_option("Attention", "producer_registers", producer_registers, 24, 40)
    if producer_registers not in PRODUCER_REGISTERS:
        raise TensorMapError(f"Attention: producer_registers must be one of {PRODUCER_REGISTERS} (setmaxnreg takes "
                             f"multiples of 8; the consumers get the rest), got {producer_registers}")
    if carry is None:
        carry = False
    carry = bool_option("Attention", "carry", carry)
    if carry and d != 64:
        raise TensorMapError(f"Attention: carry=True (the pipeline carried across items) is built for head dim 64 "
                             f"only, got {d}: at 128 the carried kernel needs more registers than a consumer has and "
                             f"ptxas serializes its wgmmas (C7512); at 256 no second Q stage fits")
    if carry and (schedule != "overlap" or stages < 2 or (q_stages < 2 and not o_buffer)):
        raise TensorMapError(f"Attention: carry=True (the pipeline carried across items) needs schedule='overlap', "
                             f"at least 2 stages and the next item's Q beside this one's (q_stages=2 or "
                             f"o_buffer=True); got schedule={schedule!r}, stages={stages}, q_stages={q_stages}, "
                             f"o_buffer={o_buffer}")
    if cluster_m is None:
        cluster_m = 1
    cluster_m = int_option("Attention", "cluster_m", cluster_m, 1, 2)
    if cluster_m == 2 and causal:
        raise TensorMapError("Attention: cluster_m=2 (pairs of CTAs sharing K and V by multicast) is for full "
                             "attention: the causal mask gives neighbouring query blocks different key blocks")
    if lazy_rescale is None:  # (H100: D = 128 +3..6%, D = 256 +4..5%; D = 64 -1..-5%: its O is 32 FMULs a block)
        lazy_rescale = d != 64
    lazy_rescale = bool_option("Attention", "lazy_rescale", lazy_rescale)
    if poly_exp2 is None:
        poly_exp2 = 0.0
    poly_exp2 = scalar_option("Attention", "poly_exp2", poly_exp2)
    if not (0 <= poly_exp2 <= 1 and (poly_exp2 * 8).is_integer()):
        raise TensorMapError(f"Attention: poly_exp2 (the share of the weights whose exp2 runs on the FMA units) must "
                             f"be one of 0, 1/8, 2/8, ... 1, got {poly_exp2!r}")
    return AttentionConfig(bn, stages, q_bytes + stages * stage_bytes + (o_bytes if o_buffer else 0), schedule, order,
                           sweep, q_stages, producer_registers, o_buffer, carry, cluster_m, lazy_rescale, poly_exp2)


def _padding(sk, bn):
    """The share of the keys that the last block of ``bn`` pads: (ceil(sk / bn) bn - sk) / sk."""
    return (-sk % bn) / sk
