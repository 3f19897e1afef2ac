#!/usr/bin/env bash
# Before/after benchmarks in one device call: two numbatma versions installed side by side, their runs alternated
# (A B A B ...) so clock drift hits both, each with its peer (cuBLAS, cuDNN) timed in the same process.
#   git worktree add .old <commit>      # the "before" tree (carried to the device machine with .whl)
#   BENCH="attention.py --only seq --seqs 1024,4096,16384 --reps 10" ROUNDS=2 bash scripts/bench_before_after.sh
# BENCH: one or more ';'-separated benchmark command lines (a script of benchmarks/ and its arguments; each version
# runs its own copy of the script). Logs: $OUT/<n>-<before|after>-<round>.txt; BUDGET (seconds, default 540)
# stops starting new runs once spent; PER_RUN_TIMEOUT (default 200) ends one run.
# TREES: more than two versions, e.g. TREES=".old .v1 ." (each a worktree carried along; "." is this checkout):
# logs $OUT/<n>-<tree name>-<round>.txt, the trees alternated in the given order.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu-logs}"; mkdir -p "$out"
base=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$base" .whl/*.whl || exit 1
read -ra trees <<< "${TREES:-.old .}"
declare -A sites names
for t in "${trees[@]}"; do
  sites[$t]=$(mktemp -d)
  names[$t]=$t; [[ $t == .old ]] && names[$t]=before; [[ $t == . ]] && names[$t]=after
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "${sites[$t]}" "./$t" || exit 1
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in "${trees[@]}"; do echo "${names[$t]}: $t ${NUMBATMA_COMMIT:-}" | tee -a "$out/gpu.txt"; done
IFS=';' read -ra benches <<< "${BENCH:-attention.py --only seq --quick}"
for ((r = 1; r <= ${ROUNDS:-1}; r++)); do
  for i in "${!benches[@]}"; do
    for t in "${trees[@]}"; do
      v=${names[$t]}
      if ((SECONDS > ${BUDGET:-540})); then echo "budget spent: skipping $v round $r bench $i" | tee -a "$out/gpu.txt"; continue; fi
      tree=$PWD/$t; site=${sites[$t]}
      read -ra cmd <<< "${benches[$i]}"
      log="$out/$i-$v-$r.txt"
      echo "== $v round $r: ${benches[$i]} (t=${SECONDS}s)" | tee "$log"
      (cd /tmp && PYTHONPATH="$base:$site" NUMBATMA_DISK_CACHE=0 timeout ${PER_RUN_TIMEOUT:-200} \
         python3 "$tree/benchmarks/${cmd[0]}" "${cmd[@]:1}") >> "$log" 2>&1
      echo "exit $?" >> "$log"
    done
  done
done
(cd "$out" && tar czf before_after_logs.tgz [0-9]*-*-*.txt gpu.txt 2>/dev/null && rm -f [0-9]*-*-*.txt)
