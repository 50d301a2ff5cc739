#!/usr/bin/env bash
# Issue 20's GPU checks in one run, each under its own time limit, for a device lent for minutes:
#
#   bash benchmarks/gpu_checks.sh OUT_DIR [BUDGET_SECONDS]
#
# Runs from the repository root (prorag importable: installed, or PYTHONPATH set). In order, until
# BUDGET_SECONDS (default 420) are spent; each check gets at most what is left:
#   1. benchmarks/rl_step_gpu.py --sides prorag --steps 3 --gradient-checkpointing      (the step, by part)
#   2. benchmarks/rl_step_gpu.py --sides trl --steps 3                                   (stock TRL, same machine)
#   3. 1 with --compile-decode                                                           (the decode step compiled whole)
#   4. benchmarks/decode_graphs.py --repeats 1 --sides graphs-compiled                   (decode: eager, graphs, compiled step)
#   5. benchmarks/compile_norms.py --device cuda                                         (norms alone)
# The baseline (stock TRL) runs second, so that a budget cut short still leaves both sides of the ratio;
# the decode check, the longest (HF generate's run and seven engine rollouts of 64 rows, two of them eager),
# saves each side as it finishes.
# Each finished check writes OUT_DIR/NAME.json; every check's output goes to OUT_DIR/checks.log (six files
# at most: a device call returns eight); the tail of each check's output goes to stdout.
set -uo pipefail
if [ $# -lt 1 ]; then
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
OUT=$1 BUDGET=${2:-420}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1
cd "$(dirname "$0")" || exit 1
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1

check() {  # NAME SCRIPT ARGS...: run under the time left, keep its log and JSON
  local name=$1; shift
  local left=$((BUDGET - ($(date +%s) - start)))
  if [ "$left" -lt 30 ]; then
    echo "$name: skipped (${left} s left of ${BUDGET})"
    return
  fi
  local log
  log=$(mktemp)
  timeout -k 10 "$left" python3 "$@" --out "$OUT/$name.json" > "$log" 2>&1
  local status=$?
  { echo "===== $name: python3 $* (exit $status)"; cat "$log"; } >> "$OUT/checks.log"
  echo "$name: exit $status after $(($(date +%s) - start)) s"
  grep -v -i -E "warn|forward_call|original_forward|^\s*$" "$log" | tail -12
  rm -f "$log"
}

check rl_prorag rl_step_gpu.py --sides prorag --steps 3 --gradient-checkpointing
check rl_trl rl_step_gpu.py --sides trl --steps 3
check rl_prorag_compiled rl_step_gpu.py --sides prorag --steps 3 --gradient-checkpointing --compile-decode
check decode decode_graphs.py --repeats 1 --sides graphs-compiled
check norms compile_norms.py --device cuda
