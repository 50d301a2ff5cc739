#!/usr/bin/env bash
# The RL arms of the small model's builds (configs/arms_demo.yaml), one (arm, seed) at a time, each
# run tested on the held-out test world at its last step and at its dev-chosen step. The commands
# behind docs/LOG.md's entries "builds 6 and 7" and "build 8" (and build 5's, run then from copies
# of these lines), kept here so that a wiped scratch folder loses nothing but the runs.
#
#   prorag pipeline --config configs/arms_demo.yaml --run-dir RUN --set seed=3     # a build
#   OMP_NUM_THREADS=1 bash benchmarks/rl_seed_runs.sh RUN prmfesgn:0 prmfesgn:1 ...  # one lane
#   python benchmarks/rl_seed_runs.py RUN --arms prmfesgn prmfesgnsh --out results/X.json
#
# Per ARM:SEED, in RUN: `prorag rl` into probes/ARM-sSEED (RL from pi_rft on the first 192 RL
# questions unscreened: lr 2e-4, no KL, one pass of 48 steps of 8 questions x G 8, two optimisation steps per
# rollout batch, dev EM on 200 dev questions every 12 steps, policy/ = the dev-chosen weights), then
# `prorag eval` on splits/test.jsonl of the last checkpoint (checkpoints/checkpoint-48 but for the
# two-pass arm: probes/test-ARM-sSEED-last) and of policy/ (probes/test-ARM-sSEED-best; a copy of -last
# where dev chose the last step). A run folder without policy/ (a stopped run: policy/ is written when
# RL ends) is removed and started again; finished runs and evaluations are kept.
#
# ARMs (every one the same schedule; same seed -> same questions and rollout streams):
#   ngrpo       outcome-only GRPO
#   ngrpob      the same, advantages divided by the batch's std instead of each group's
#   ngrpolr1    the same at learning rate 1e-4 (half the schedule's)
#   ngrpokl     the same with a KL penalty to pi_rft in the loss (beta_kl 0.1, the value dev chose on 2026-11-25)
#   ngrpolora   the same with a LoRA adapter (rank 8, alpha 32, no dropout) at learning rate 1e-3 instead of
#               every weight; its checkpoints hold the adapter, so it keeps its last step (select_policy
#               last: policy/ is step 48 merged), and that is what is tested
#   ngrpoptx    the same with SFT replay (InstructGPT's ptx): 1.0 x the format-aware SFT loss on 16 of the
#               warm-up's gold trajectories (sft_data/trajectories.jsonl) added to every RL loss
#   ptxonly     ngrpoptx with every advantage 0 (`advantage: zero`): the SFT replay alone on the same schedule,
#               the control for what RL adds beside it; `replay_only` skips the rollouts (the same weights bit
#               for bit as generating them, as seeds 0 and 1 were run: docs/LOG.md, 2026-11-29 late morning)
#   ngrpoptx2   ngrpoptx for two passes over the same 192 questions (96 steps; checkpoints at 48 and 96)
#   ptxonly2    ptxonly for as many steps: its control
#   nofesgnptx  nofesgn (below) with ngrpoptx's replay: the oracle's step verdicts once the drift is held
#   nofesgnshptx  its shuffled control, with the same replay
#   nofesgnptx2, nofesgnshptx2  the same two for two passes (96 steps), beside ngrpoptx2
#   nofesgn     the oracle's step verdicts up to the first error, advantage dual_signed
#   prmsgn      the learned PRM on every step, dual_signed
#   prmfesgn    the learned PRM up to its first step below 0, dual_signed
#   ...sh       (nofesgnsh, prmsgnsh, prmfesgnsh) the same step rewards permuted within each group
#   frozen      outcome-only GRPO at learning rate 0: pi_rft sampled on the same question stream, the
#               control for the training rollouts' own rewards (its weights are pi_rft's, so no test
#               evaluation is run for it)
set -euo pipefail
RUN=${1:?usage: rl_seed_runs.sh RUN ARM:SEED ...}; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd "$RUN"

SCHEDULE=(--set prm_scope=reasoning --set per_device_batch_size=64 --set eval_file=splits/dev.jsonl
    --set eval_every=12 --set eval_questions=200 --set learning_rate=0.0002 --set num_iterations=2
    --set max_steps=48 --set outcome_reward.nu2=0.2 --set limit=192 --set question_filter=none
    --set scoring_rows=null --set beta_kl=0 --set select_policy=best_dev)

PTX="--set sft_replay.file=sft_data/trajectories.jsonl --set sft_replay.coef=1.0 --set sft_replay.batch_size=16"
TWO_PASSES="--set max_steps=96 --set save_steps=48"

arm_flags() {  # the flags that make ARM
    case $1 in
        ngrpo) echo --process-reward none --set beta=0 ;;
        ngrpob) echo --process-reward none --set beta=0 --set scale_advantages=batch ;;
        ngrpolr1) echo --process-reward none --set beta=0 --set learning_rate=0.0001 ;;
        ngrpokl) echo --process-reward none --set beta=0 --set beta_kl=0.1 ;;
        ngrpolora) echo --process-reward none --set beta=0 --set lora.enabled=true --set lora.r=8 --set lora.alpha=32 \
            --set lora.dropout=0 --set learning_rate=0.001 --set select_policy=last ;;
        ngrpoptx) echo --process-reward none --set beta=0 $PTX ;;
        ngrpoptx2) echo "$(arm_flags ngrpoptx)" $TWO_PASSES ;;
        ptxonly) echo --process-reward none --set beta=0 --set advantage=zero --set replay_only=true $PTX ;;
        ptxonly2) echo "$(arm_flags ptxonly)" $TWO_PASSES ;;
        nofesgnptx) echo --process-reward oracle-first-error --set advantage=dual_signed $PTX ;;
        nofesgnshptx) echo --process-reward oracle-first-error-shuffled --set advantage=dual_signed $PTX ;;
        nofesgnptx2) echo "$(arm_flags nofesgnptx)" $TWO_PASSES ;;
        nofesgnshptx2) echo "$(arm_flags nofesgnshptx)" $TWO_PASSES ;;
        nofesgn) echo --process-reward oracle-first-error --set advantage=dual_signed ;;
        nofesgnsh) echo --process-reward oracle-first-error-shuffled --set advantage=dual_signed ;;
        prmsgn) echo --prm prm/prm --process-reward prm --set advantage=dual_signed ;;
        prmsgnsh) echo --prm prm/prm --process-reward shuffled --set advantage=dual_signed ;;
        prmfesgn) echo --prm prm/prm --process-reward prm-first-error --set advantage=dual_signed ;;
        prmfesgnsh) echo --prm prm/prm --process-reward prm-first-error-shuffled --set advantage=dual_signed ;;
        frozen) echo --process-reward none --set beta=0 --set learning_rate=0 ;;
        *) echo "rl_seed_runs.sh: unknown arm '$1' (see the list at the top of this script)" >&2; return 2 ;;
    esac
}

test_eval() {  # test_eval POLICY OUT
    [ -f "$2/metrics.json" ] || prorag eval --policy "$1" --data splits/test.jsonl --index index --out "$2" --max-actions 11
}

for job in "$@"; do
    arm=${job%%:*} seed=${job##*:}
    [[ $job == *:* && $seed =~ ^[0-9]+$ ]] || { echo "rl_seed_runs.sh: expected ARM:SEED, got '$job'" >&2; exit 2; }
    flags=$(arm_flags "$arm")
    dir=probes/$arm-s$seed
    [ -d "$dir/policy" ] || rm -rf "$dir"
    echo "$(date -u +%H:%M:%S) $arm seed $seed: rl -> $RUN/$dir"
    # shellcheck disable=SC2086  # the arm's flags are words
    [ -d "$dir/policy" ] || prorag rl --policy policies/rft/policy --data splits/rl.jsonl --index index \
        --run-dir "$dir" --seed "$seed" "${SCHEDULE[@]}" $flags  # the arm's flags last: later --set wins
    [ "$arm" = frozen ] && { echo "$(date -u +%H:%M:%S) $arm seed $seed: done (pi_rft's weights: no test evaluation)"; continue; }
    if [ -f "$dir/checkpoints/checkpoint-48/adapter_config.json" ]; then  # a LoRA run: policy/ is step 48 merged
        test_eval "$dir/policy" "probes/test-$arm-s$seed-last"
        [ -e "probes/test-$arm-s$seed-best" ] || cp -r "probes/test-$arm-s$seed-last" "probes/test-$arm-s$seed-best"
        echo "$(date -u +%H:%M:%S) $arm seed $seed: done (LoRA, last step kept: -best is a copy of -last)"
        continue
    fi
    last=$(find "$dir/checkpoints" -maxdepth 1 -name 'checkpoint-*' | sed 's/.*checkpoint-//' | sort -n | tail -n 1)
    test_eval "$dir/checkpoints/checkpoint-$last" "probes/test-$arm-s$seed-last"
    chosen=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["best"]["step"])' "$dir/dev_eval/best.json")
    if [ "$chosen" = "$last" ] && [ ! -e "probes/test-$arm-s$seed-best" ]; then  # dev chose the last step: the same weights
        cp -r "probes/test-$arm-s$seed-last" "probes/test-$arm-s$seed-best"
    fi
    test_eval "$dir/policy" "probes/test-$arm-s$seed-best"
    echo "$(date -u +%H:%M:%S) $arm seed $seed: done"
done
