#!/usr/bin/env bash
# Every RL method (and offline DPO) for a few steps on real data: MuSiQue dev questions with their
# gold decompositions, a BM25 index of the pooled MuSiQue paragraphs, SmolLM2-135M-Instruct (offline).
# On CPU, one model process at a time. Results: $OUT/<method>/metrics.jsonl; timings in $OUT/times.tsv.
#
#   PRORAG_SHARED=/work/shared bash research/drivers/real_data_methods.sh [OUT] [METHOD...]
#
# METHODs: grpo prorag-oracle hiprag cpsearch prorag dpo (default: all). prorag and dpo need step
# pairs: a 2-question MCTS with the same checkpoint, judged by the oracle (`prorag pairs`). The PRM is
# the `likelihood` kind (the policy's LM scoring a step by its mean token log-probability) trained
# for 2 steps on them, or used untrained when there is none (`if_no_pairs=untrained`: an untuned
# SmolLM2 writes no well-formed step, so its trees give no pair); dpo is skipped without pairs.
set -euo pipefail
SHARED=${PRORAG_SHARED:?set PRORAG_SHARED to the shared folder}
OUT=${1:-runs/real_methods}; shift || true
METHODS=("${@:-grpo prorag-oracle hiprag cpsearch prorag dpo}")
METHODS=(${METHODS[@]})
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
B=$SHARED/data/benchmarks
mkdir -p "$OUT"

# --- data, index, model (each skipped when already there)
[ -d "$OUT/smollm2" ] || prorag models setup-offline smollm2 --out "$OUT/smollm2"
[ -f "$OUT/corpus.jsonl" ] || prorag corpus build "$B/train/musique_train_corpus.json" "$B/train/musique_train.json" \
    "$B/musique/musique_ans_dev_200.jsonl" --out "$OUT/corpus.jsonl"
[ -d "$OUT/bm25" ] || prorag index --corpus "$OUT/corpus.jsonl" --out "$OUT/bm25"
[ -f "$OUT/musique_dev.jsonl" ] || prorag data convert "$B/musique/musique_ans_dev_200.jsonl" --format musique --out "$OUT/musique_dev.jsonl"
head -32 "$OUT/musique_dev.jsonl" > "$OUT/rl32.jsonl"   # 32 questions, gold decompositions and paragraph ids

# --- 3 RL steps, 2 questions x G=4 each, short actions
SMALL=(--max-steps 3 --set group_size=4 --set per_device_batch_size=8 --set rollout.max_action_tokens=64
    --set rollout.max_actions=4 --set rollout.max_completion_tokens=512 --set log_kl_to_init=false --set save_steps=3)
rl() {  # rl NAME ASSIGNMENT...
    local name=$1; shift
    local sets=(); for a in "$@"; do sets+=(--set "$a"); done
    local t0=$SECONDS
    prorag rl --policy "$OUT/smollm2" --data "$OUT/rl32.jsonl" --index "$OUT/bm25" --run-dir "$OUT/$name" \
        "${SMALL[@]}" "${sets[@]}"
    printf '%s\t%s\n' "$name" $((SECONDS - t0)) >> "$OUT/times.tsv"
}
pairs() {  # step pairs for the PRM and DPO, once
    [ -f "$OUT/pairs.jsonl" ] && return 0
    prorag mcts --policy "$OUT/smollm2" --data "$OUT/rl32.jsonl" --index "$OUT/bm25" --run-dir "$OUT/mcts" --limit 2 \
        --set simulations=4 --set num_candidates=2 --set max_depth=4 --set rollout.max_actions=4 \
        --set rollout.max_action_tokens=64
    prorag pairs --trees "$OUT/mcts" --judge oracle --min-visits 1 --pairs-per-set all --out "$OUT/pairs.jsonl"
}
have_pairs() { [ -s "$OUT/pairs.jsonl" ] || { echo "no step pairs from the MCTS: $1 skipped"; return 1; }; }

for m in "${METHODS[@]}"; do
    case $m in
        grpo) rl grpo process_reward=none ;;
        prorag-oracle) rl prorag-oracle process_reward=oracle ;;
        hiprag) rl hiprag process_reward=none outcome_reward.form=hiprag ;;
        cpsearch) rl cpsearch process_reward=cpsearch advantage=cpgrpo outcome_reward.form=f1_if_valid ;;
        prorag)
            pairs
            prorag prm --pairs "$OUT/pairs.jsonl" --init "$OUT/smollm2" --run-dir "$OUT/prm" \
                --max-steps 2 --set kind=likelihood --set per_device_batch_size=2 --set if_no_pairs=untrained
            rl prorag process_reward=prm "prm=$OUT/prm" ;;
        dpo)
            pairs; have_pairs dpo || continue
            t0=$SECONDS
            prorag dpo --pairs "$OUT/pairs.jsonl" --init "$OUT/smollm2" --run-dir "$OUT/dpo" --max-steps 3 \
                --set per_device_batch_size=2 --set logging_steps=1
            printf 'dpo\t%s\n' $((SECONDS - t0)) >> "$OUT/times.tsv" ;;
        *) echo "unknown method $m" >&2; exit 2 ;;
    esac
done

# --- per method and step: seconds, loss, rewards and the method's own signal (what docs/LOG.md reports)
python3 - "$OUT" "${METHODS[@]}" <<'PY'
import json, sys
from pathlib import Path
out, keys = Path(sys.argv[1]), ("step_time", "loss", "outcome_reward", "process_reward", "process_steps_per_trajectory",
                                "over_search_rate", "under_search_rate", "format_valid_rate", "searches_per_trajectory")
for method in sys.argv[2:]:
    path = out / method / "metrics.jsonl"
    rows = [r for r in map(json.loads, path.open()) if "loss" in r] if path.exists() else []
    for r in rows:
        print(method, f"step {r['step']}:", ", ".join(f"{k} {r[k]:.3g}" for k in keys if k in r))
    if not rows:
        print(method, "no metrics")
PY
