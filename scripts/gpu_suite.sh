#!/usr/bin/env bash
# The whole GPU verification in one command, for the device machine (H100/H200):
#   bash scripts/gpu_suite.sh            # all tests, examples, benchmarks
#   PARTS="tests examples" bash scripts/gpu_suite.sh     # a subset (tests, examples, bench, host, launch, gemm, attention, probes, sweep,
#                                                        # pdl, compile, peer (2 GPUs), hostprobe, ctxprobe (2 GPUs),
#                                                        # sanitize: compute-sanitizer, runs beside the others;
#                                                        # attnprofile: ncu over scripts/profile_attention.py;
#                                                        # backward: benchmarks/attention_backward.py;
#                                                        # bwdprofile: ncu over scripts/profile_attention_backward.py;
#                                                        # bwdsource: its main kernel's stall samples per SASS line;
#                                                        # train: examples/torch/train_block.py)
#   TESTS=tests/test_gpu_pipeline.py BENCH_ARGS="--quick" PYTEST_ARGS="-x"   # passed through (word-split)
#   PYTEST_K="store_warp or determin"                                      # pytest -k, one argument
#   EXAMPLES="examples/gemm.py" GEMM_ARGS="--only square --quick"  TEST_TIMEOUT=120
# Needs the wheels from scripts/fetch_wheels.sh in .whl/ (numpy < 2.5 for numba-cuda 0.30.4; pytest-timeout; compute-sanitizer).
# Logs go to $OUT (or ./gpu-logs) so they come back from the device machine.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu-logs}"
mkdir -p "$out"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$site" . || exit 1
export PYTHONPATH="$site${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}"  # (EXTRA_PYTHONPATH: optional peers such as FA4, unpacked by the caller)
export PYTHONUNBUFFERED=1
cd /tmp  # import the installed copy, not the checkout
repo=$OLDPWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import numba_cuda, numpy, cuda.core; print('numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__, 'cuda.core', cuda.core.__version__)" | tee -a "$out/gpu.txt"
parts=" ${PARTS:-tests examples bench gemm attention probes} "
san="$site/nvidia/cu13/bin/compute-sanitizer"  # from the nvidia-cuda-sanitizer-api wheel
chmod +x "$site"/nvidia/cu13/bin/* 2>/dev/null
status=0
# Benchmarks first, on a quiet GPU (the sanitizer runs below share it with the tests).
if [[ $parts == *" bench "* ]]; then
  for b in launch_overhead peer_cxx bandwidth; do
    echo "== $b" | tee -a "$out/benchmarks.log"
    args=""; [[ $b == bandwidth ]] && args=${BENCH_ARGS:-}
    timeout 400 python3 "$repo/benchmarks/$b.py" $args 2>&1 | tee -a "$out/benchmarks.log" || status=1
  done
fi
if [[ $parts == *" gemm "* ]]; then  # tensor-core GEMM against cuBLAS and Triton (benchmarks/gemm.py)
  timeout ${GEMM_TIMEOUT:-500} python3 "$repo/benchmarks/gemm.py" ${GEMM_ARGS:-} 2>&1 | tee "$out/gemm.log" || status=1
fi
if [[ $parts == *" launch "* ]]; then  # a user kernel's launch with a TensorMap vs the plain array (also in bench)
  timeout 300 python3 "$repo/benchmarks/launch_overhead.py" 2>&1 | tee "$out/launch_overhead.log" || status=1
fi
if [[ $parts == *" host "* || $parts == *" bench "* ]]; then  # host time per call against torch (benchmarks/host_path.py)
  timeout 300 python3 "$repo/benchmarks/host_path.py" ${HOST_ARGS:-} 2>&1 | tee "$out/host_path.log" || status=1
fi
if [[ $parts == *" pdl "* ]]; then  # a chain of two plans with and without programmatic dependent launch
  timeout 300 python3 "$repo/benchmarks/pdl_chain.py" --out "$out" ${PDL_ARGS:-} 2>&1 | tee "$out/pdl_chain.log" || status=1
fi
if [[ $parts == *" compile "* ]]; then  # first-call compile per kernel: cold and from the on-disk cache
  timeout 400 python3 "$repo/benchmarks/compile_times.py" --json "$out/compile_times.json" 2>&1 | tee "$out/compile_times.log" || status=1
fi
if [[ $parts == *" hostprobe "* ]]; then  # where a function form's host time goes; the driver's pointer-device answers
  timeout 200 python3 "$repo/scripts/probe_host_launch.py" 2>&1 | tee -a "$out/probe_host.log" || status=1
fi
if [[ $parts == *" ctxprobe "* ]]; then  # who pushes and pops CUDA contexts around a kernel on device 1 (2 GPUs)
  timeout 200 python3 "$repo/scripts/probe_context_stack.py" 2>&1 | tee -a "$out/probe_context.log" || status=1
fi
if [[ $parts == *" peer "* ]]; then  # TMA over NVLink: a copy from another GPU's memory (needs 2 GPUs)
  timeout 300 python3 "$repo/benchmarks/peer_tma.py" 2>&1 | tee "$out/peer_tma.log" || status=1
fi
if [[ $parts == *" attention "* ]]; then  # attention forward against torch SDPA cuDNN / flash (benchmarks/attention.py)
  timeout ${ATTENTION_TIMEOUT:-500} python3 "$repo/benchmarks/attention.py" ${ATTENTION_ARGS:-} 2>&1 | tee "$out/attention.log" || status=1
fi
sanitize_pids=()
if [[ $parts == *" sanitize "* ]]; then
  # compute-sanitizer (from the nvidia-cuda-sanitizer-api wheel in .whl/) over every kernel of numbatma.kernels
  # (scripts/sanitize_kernels.py), every example on a small problem and a sample of the GPU tests; the three tools
  # run side by side in the background while the other parts go on. One log per tool: $out/sanitize-<tool>.log.
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    (
      log="$out/sanitize-$tool.log"
      run() { echo "== $tool: $*" >> "$log"; timeout ${SANITIZE_TIMEOUT:-300} "$san" --tool "$tool" --error-exitcode 9 \
                "$@" >> "$log" 2>&1; echo "exit $? ($tool: $*)" >> "$log"; }
      export NUMBATMA_SMALL_PROBLEMS=1
      run python3 "$repo/scripts/sanitize_kernels.py" ${SANITIZE_KERNELS:-}
      for ex in ${SANITIZE_EXAMPLES-"$repo"/examples/*.py}; do [[ $ex == /* ]] || ex="$repo/$ex"; run python3 "$ex"; done
      [[ $tool == memcheck && ${SANITIZE_TESTS-x} != none ]] && run python3 -m pytest -q -p no:cacheprovider -x ${SANITIZE_TESTS:-"$repo/tests/test_gpu_pipeline.py"}
    ) &
    sanitize_pids+=($!)
  done
fi
if [[ $parts == *" tests "* ]]; then
  paths=""; for t in ${TESTS:-tests}; do paths+=" $repo/$t"; done
  xdist=""
  python3 -c "import xdist" 2>/dev/null && xdist="-n 8"
  # a hung kernel ends its test (stacks dumped, the worker replaced) instead of the whole run
  python3 -c "import pytest_timeout" 2>/dev/null && xdist+=" --timeout ${TEST_TIMEOUT:-180} --timeout-method=thread"
  python3 -m pytest -q -rfEs -p no:cacheprovider $xdist $paths ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 \
    | tee "$out/pytest.log" || status=1
fi
if [[ $parts == *" examples "* ]]; then
  for ex in ${EXAMPLES:-"$repo"/examples/*.py}; do
    [[ $ex == /* ]] || ex="$repo/$ex"
    echo "== $ex" | tee -a "$out/examples.log"
    timeout 300 python3 "$ex" 2>&1 | tee -a "$out/examples.log" || status=1
  done
fi
if [[ $parts == *" train "* ]]; then  # numbatma.kernels.torch in a model: examples/torch/train_block.py, loss curves
  timeout ${TRAIN_TIMEOUT:-400} python3 "$repo/examples/torch/train_block.py" ${TRAIN_ARGS:-} --out "$out/train_block" \
    2>&1 | tee "$out/train_block.log" || status=1
fi
if [[ $parts == *" backward "* ]]; then  # attention backward against cuDNN's and flash's (benchmarks/attention_backward.py)
  timeout ${BACKWARD_TIMEOUT:-400} python3 "$repo/benchmarks/attention_backward.py" ${BACKWARD_ARGS:-} \
    --json "$out/attention_backward.json" 2>&1 | tee "$out/attention_backward.log" || status=1
fi
if [[ $parts == *" sweep "* ]]; then  # option sweeps used to pick the kernels' defaults (not in the default parts)
  timeout 500 python3 "$repo/benchmarks/sweep_options.py" ${SWEEP_ARGS:-} 2>&1 | grep -v Warn | tee "$out/sweep.log"
fi
# ncu_sections TIMEOUT LOG EXTRA_SECTION SCRIPT [ARGS...]: one launch each of numbatma's kernels and its peer's,
# under Nsight Compute with the sections every profile part reads (plus one of its own)
ncu_sections() {
  local limit=$1 log=$2 extra=$3 script=$4; shift 4
  timeout "$limit" ncu --clock-control none --profile-from-start off --section SpeedOfLight \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats $(printf -- '--section %s ' $extra) \
    python3 "$repo/scripts/$script" "$@" 2>&1 | tee "$out/$log"
}
if [[ $parts == *" attnprofile "* ]]; then  # where attention's time goes: numbatma vs cuDNN under ncu (one launch each)
  ncu_sections ${ATTN_PROFILE_TIMEOUT:-240} attention_profile.log Occupancy profile_attention.py ${ATTN_PROFILE_ARGS:-}
fi
if [[ $parts == *" bwdprofile "* ]]; then  # where attention backward's time goes: numbatma vs cuDNN under ncu
  ncu_sections ${BWD_PROFILE_TIMEOUT:-240} attention_backward_profile.log "MemoryWorkloadAnalysis LaunchStats" \
    profile_attention_backward.py ${BWD_PROFILE_ARGS:-}
fi
if [[ $parts == *" bwdsource "* ]]; then  # the backward's main kernel, per SASS instruction: where its warps stall
  timeout ${BWD_PROFILE_TIMEOUT:-240} ncu --clock-control none --profile-from-start off -k regex:attention_backward_kernel \
    --section WarpStateStats --section SourceCounters -o /tmp/bwdsource \
    python3 "$repo/scripts/profile_attention_backward.py" ${BWD_PROFILE_ARGS:-} > "$out/bwd_source_run.log" 2>&1
  ncu --import /tmp/bwdsource.ncu-rep --page details > "$out/bwd_source_details.log" 2>&1
  ncu --import /tmp/bwdsource.ncu-rep --page source --print-source sass --csv > "$out/bwd_source.csv" 2>&1
fi
if [[ $parts == *" profile "* ]]; then  # hardware counters of the bandwidth kernels (ncu, not in the default parts)
  m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum
  timeout 300 ncu --clock-control none --profile-from-start off --metrics "$m" python3 "$repo/scripts/profile_kernels.py" 2>&1 | tee "$out/profile.log"
fi
if [[ $parts == *" probes "* ]]; then
  # Observations, not pass/fail checks.
  timeout 120 python3 "$repo/scripts/probe_setmaxnreg.py" 2>&1 | tee -a "$out/probe.log"
  timeout 120 python3 "$repo/scripts/probe_store_clip.py" 2>&1 | tee -a "$out/probe.log"
  timeout 120 python3 "$repo/scripts/probe_reduce_nan.py" 2>&1 | tee -a "$out/probe.log"  # NaN in min/max reduces
  # which mbarrier hand-offs of shared memory racecheck accepts (exit 9: it reported a hazard; 'none' is a real race)
  for v in lane0 all none; do
    timeout 120 "$san" --tool racecheck --error-exitcode 9 python3 "$repo/scripts/probe_racecheck_mbarrier.py" $v 2>&1 \
      | grep -E "probe|SUMMARY|Error" | cut -c1-160 | tee -a "$out/probe.log"
    echo "racecheck probe $v: exit ${PIPESTATUS[0]}" | tee -a "$out/probe.log"
  done
  if [[ -n ${OOB_PROBE:-} ]]; then  # which innermost start coordinates a tile load accepts (docs/guide.md)
    for c in 0,4 0,-4 -5,-8 0,3 0,-3; do
      timeout 60 python3 "$repo/scripts/debug_oob.py" $c 2>&1 | tail -1 | sed "s/^/probe $c: /" | tee -a "$out/probe.log"
    done
  fi
fi
if ((${#sanitize_pids[@]})); then
  wait "${sanitize_pids[@]}"
  for f in "$out"/sanitize-*.log; do
    echo "== $(basename "$f"): $(grep -c '^exit 0 ' "$f") runs clean, $(grep '^exit ' "$f" | grep -vc '^exit 0 ') not"
    grep '^exit [1-9]' "$f"
  done | tee "$out/sanitize.txt"
  grep -q '^exit [1-9]' "$out"/sanitize-*.log && status=1
fi
exit $status
