#!/usr/bin/env bash
# The RL arms of the small model's builds (configs/pipelines/arms_demo.yaml), one (arm, seed) at a time, each
# run tested on the held-out test world at its last step and at its dev-chosen step. The arms are
# research/arms/rl_seed_runs.yaml's (research/README.md maps them to the codes of docs/LOG.md and
# results/), read through `python -m research.drivers.arms flags ARM`.
#
#   prorag pipeline --config configs/pipelines/arms_demo.yaml --run-dir RUN --set seed=3                    # a build
#   OMP_NUM_THREADS=1 bash research/drivers/rl_seed_runs.sh RUN prm-first-error-signed:0 ...     # one lane
#   python -m research.drivers.rl_seed_runs RUN --arms prm-first-error-signed prm-first-error-signed-shuffled \
#       --seeds 0-4 --out results/X.json
#
# Per ARM:SEED, in RUN: `prorag rl` into probes/ARM-sSEED with the arm's assignments (the schedule's, then
# its own; policy/ = the dev-chosen weights), then `prorag eval` on splits/test.jsonl of the last
# checkpoint (probes/test-ARM-sSEED-last) and of policy/ (probes/test-ARM-sSEED-best; a copy of -last
# where dev chose the last step). A run folder without policy/ (a stopped run: policy/ is written when
# RL ends) is removed and started again; finished runs and evaluations are kept. The `frozen` arm
# (pi_rft at learning rate 0) is not evaluated: its weights are pi_rft's. PRORAG (default: prorag) and
# PYTHON (default: python3) name the commands run.
set -euo pipefail
RUN=${1:?usage: rl_seed_runs.sh RUN ARM:SEED ...}; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # the repository: research.drivers.arms runs from it
PRORAG=${PRORAG:-prorag} PY=${PYTHON:-python3}
cd "$RUN"

arm_flags() {  # the `prorag rl` options of ARM, one word a line
    (cd "$ROOT" && "$PY" -m research.drivers.arms flags "$1")
}

test_eval() {  # test_eval POLICY OUT
    [ -f "$2/metrics.json" ] || "$PRORAG" eval --policy "$1" --data splits/test.jsonl --index index --out "$2" --max-actions 11
}

for job in "$@"; do  # every job checked before the first run starts
    [[ $job == *:* && ${job##*:} =~ ^[0-9]+$ ]] || { echo "rl_seed_runs.sh: expected ARM:SEED, got '$job'" >&2; exit 2; }
    arm_flags "${job%%:*}" > /dev/null
done

for job in "$@"; do
    arm=${job%%:*} seed=${job##*:}
    words=$(arm_flags "$arm")
    mapfile -t flags <<< "$words"
    dir=probes/$arm-s$seed
    [ -d "$dir/policy" ] || rm -rf "$dir"
    echo "$(date -u +%H:%M:%S) $arm seed $seed: rl -> $RUN/$dir"
    [ -d "$dir/policy" ] || "$PRORAG" rl --policy policies/rft/policy --data splits/rl.jsonl --index index \
        --run-dir "$dir" --seed "$seed" "${flags[@]}"
    [ "$arm" = frozen ] && { echo "$(date -u +%H:%M:%S) $arm seed $seed: done (pi_rft's weights: no test evaluation)"; continue; }
    if [ -f "$dir/checkpoints/checkpoint-48/adapter_config.json" ]; then  # a LoRA run: policy/ is step 48 merged
        test_eval "$dir/policy" "probes/test-$arm-s$seed-last"
        [ -e "probes/test-$arm-s$seed-best" ] || cp -r "probes/test-$arm-s$seed-last" "probes/test-$arm-s$seed-best"
        echo "$(date -u +%H:%M:%S) $arm seed $seed: done (LoRA, last step kept: -best is a copy of -last)"
        continue
    fi
    last=$(find "$dir/checkpoints" -maxdepth 1 -name 'checkpoint-*' | sed 's/.*checkpoint-//' | sort -n | tail -n 1)
    test_eval "$dir/checkpoints/checkpoint-$last" "probes/test-$arm-s$seed-last"
    chosen=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["best"]["step"])' "$dir/dev_eval/best.json")
    if [ "$chosen" = "$last" ] && [ ! -e "probes/test-$arm-s$seed-best" ]; then  # dev chose the last step: the same weights
        cp -r "probes/test-$arm-s$seed-last" "probes/test-$arm-s$seed-best"
    fi
    test_eval "$dir/policy" "probes/test-$arm-s$seed-best"
    echo "$(date -u +%H:%M:%S) $arm seed $seed: done"
done
