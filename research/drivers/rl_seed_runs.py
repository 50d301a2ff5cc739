"""One build's RL arms as a results file: every (arm, seed) run of `research/drivers/rl_seed_runs.sh`,
its dev curve and test scores at the last and the dev-chosen step, and the arms compared over seeds.

    python -m research.drivers.rl_seed_runs RUN --arms prm-first-error-signed prm-first-error-signed-shuffled \\
        --control prm-first-error-signed=prm-first-error-signed-shuffled --seeds 0-2 --out results/X.json [--what "..."]

RUN is a pipeline run folder (`prorag pipeline --config configs/pipelines/arms_demo.yaml`) whose ``probes/``
holds the runs (``ARM-sS/``) and their test evaluations (``test-ARM-sS-last/``, ``-best/``); an arm is
a folder name (the old codes of earlier builds' folders too). Written:

- ``arms``: the assignments of every arm named in ``research/arms/rl_seed_runs.yaml``;

- ``build``: pi_sft's and pi_rft's test scores (``RUN/eval/sft``, ``RUN/eval/rft``), the SFT
  held-out loss curve, RFT's kept samples, the PRM's held-out summary;
- ``runs[arm][seed]``: dev EM per evaluated step, the step dev chose, the test scores at the last
  step (``test_last``) and the chosen one (``test_best``), each with ``em_by_question`` (a 0/1 string
  in ``question_ids`` order, so later studies pair per question without the run folder), and the
  training signals' means over the first and the last five steps (``reward_first5``, ...);
- ``step_validity``: the oracle's verdicts on the test steps (judged and valid searches, sub-answers,
  answers, summed over the test questions) for pi_rft and every run at its last step;
- ``compare``: :func:`prorag.experiments.compare.compare_arms` at the last and at the dev-chosen
  step (``prorag compare``'s statistics: per-arm mean ± 95% CI over seeds, each arm against the
  reference and its control, paired by seed and by seed-averaged question);
- ``stream`` (with ``--stream-control frozen``): every run's training EM on its own rollout
  batches beside the control run's (``frozen-sS``: pi_rft sampled on the same seed's question
  stream, learning rate 0), batch by batch (:func:`prorag.experiments.stream_control.stream_difference`;
  ``prorag ablate`` does the same with ``stream_control: true``).

The per-run layout (``runs/ARM/SEED/test_last/em``) is the ``runs`` schema that
`research/drivers/pool_studies_data.py` reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prorag.core.statistics import p_value_text
from prorag.data.jsonl import read_json, read_jsonl
from prorag.experiments.compare import compare_arms, parse_pairs, parse_seeds
from prorag.experiments.stream_control import stream_difference
from research.analysis.arms import read_arms
from research.analysis.results_file import write_results
from research.analysis.scores import SIGNALS, evaluation, first_last, verdict_counts


def run_summary(run: Path, arm: str, seed: int, question_ids: list[str]) -> dict[str, Any]:
    """One (arm, seed): dev curve, chosen step, test scores at both steps, training signals."""
    probes = run / "probes"
    rows = list(read_jsonl(probes / f"{arm}-s{seed}" / "metrics.jsonl"))
    best_file = probes / f"{arm}-s{seed}" / "dev_eval" / "best.json"
    if best_file.is_file():
        best = read_json(best_file)
        dev = {str(e["step"]): e["eval_em"] for e in best["evaluations"]}
        selected = best["best"]["step"]
    else:  # a run that kept its last step (select_policy last: the LoRA arm; its -best is a copy of -last)
        dev = {str(r["step"]): r["eval_em"] for r in rows if "eval_em" in r}
        selected = max(map(int, dev))
    out: dict[str, Any] = {
        "dev_em_by_step": dev,
        "selected_step": selected,
        "test_last": evaluation(probes / f"test-{arm}-s{seed}-last", question_ids),
        "test_best": evaluation(probes / f"test-{arm}-s{seed}-best", question_ids),
    }
    for key in SIGNALS:
        out[f"{key}_first5"], out[f"{key}_last5"] = first_last(rows, key)
    return out


def build_summary(run: Path, question_ids: list[str]) -> dict[str, Any]:
    """What the pipeline made before RL: pi_sft's and pi_rft's test scores and the stages' summaries."""
    out: dict[str, Any] = {}
    for name in ("sft", "rft"):
        folder = run / "eval" / name
        if (folder / "predictions.jsonl").is_file():
            out[f"pi_{name}_test"] = evaluation(folder, question_ids)
    sft_metrics = run / "policies" / "sft" / "metrics.jsonl"
    if sft_metrics.is_file():
        out["sft_eval_loss_by_step"] = {
            str(r["step"]): round(r["eval_loss"], 4) for r in read_jsonl(sft_metrics) if "eval_loss" in r
        }
    for name, path in (("rft", run / "policies" / "rft" / "rft_counts.json"), ("prm", run / "prm" / "summary.json")):
        if path.is_file():
            out[f"{name}_summary"] = read_json(path)
    return out


def collect(
    run: Path,
    arms: list[str],
    seeds: list[int],
    controls: dict[str, str],
    reference: str | None,
    stream_control: str | None = None,
) -> dict[str, Any]:
    """The results file's body for ``arms`` x ``seeds`` (seeds without both evaluations are left out
    of that arm and listed under ``compare.*.missing``); ``stream`` when ``stream_control`` names
    the arm whose runs (``probes/ARM-sS/metrics.jsonl``) every run's rollout batches are paired with."""
    probes = run / "probes"
    question_ids = [r["id"] for r in read_jsonl(run / "splits" / "test.jsonl")]
    runs: dict[str, dict[str, Any]] = {}
    validity: dict[str, Any] = {}
    for arm in arms:
        for seed in seeds:
            if not all((probes / f"test-{arm}-s{seed}-{w}" / "metrics.json").is_file() for w in ("last", "best")):
                continue
            runs.setdefault(arm, {})[str(seed)] = run_summary(run, arm, seed, question_ids)
            validity.setdefault(arm, {})[str(seed)] = verdict_counts(probes / f"test-{arm}-s{seed}-last")
    if (run / "eval" / "rft" / "predictions.jsonl").is_file():
        validity["pi_rft"] = verdict_counts(run / "eval" / "rft")
    compare = {
        step: compare_arms({a: str(probes / f"test-{a}-s{{seed}}-{step}") for a in arms}, seeds, reference, controls)
        for step in ("last", "best")
    }
    stream: dict[str, Any] = {}
    if stream_control is not None:
        control_files = {str(s): probes / f"{stream_control}-s{s}" / "metrics.jsonl" for s in seeds}
        control_rows = {s: list(read_jsonl(f)) for s, f in control_files.items() if f.is_file()}  # read once per seed
        for arm, by_seed in runs.items():
            for seed in by_seed:
                if seed in control_rows:
                    rows = list(read_jsonl(probes / f"{arm}-s{seed}" / "metrics.jsonl"))
                    stream.setdefault(arm, {})[seed] = stream_difference(rows, control_rows[seed])
    known = read_arms()
    return {
        "question_ids": question_ids,
        "arms": {arm: list(known[arm].assignments) for arm in arms if arm in known},
        "build": build_summary(run, question_ids),
        "seeds_by_arm": {arm: sorted(runs.get(arm, {}), key=int) for arm in arms},
        "runs": runs,
        "step_validity": validity,
        "compare": compare,
        **({"stream": {"control": stream_control, "key": "answer_em", "runs": stream}} if stream_control else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the pipeline run folder (its probes/ holds the RL runs)")
    parser.add_argument("--arms", nargs="+", required=True, help="arms: their probes/ARM-sS folder names")
    parser.add_argument("--seeds", required=True, help="0-4, 0,2,5 or 0-2,5")
    parser.add_argument("--control", action="append", default=[], help="ARM=CONTROL, repeated")
    parser.add_argument("--reference", default=None, help="the arm every other is tested against (default: the first)")
    parser.add_argument("--what", default="", help="what the study is, for the file's 'what' field")
    parser.add_argument(
        "--stream-control", default=None, help="the arm (frozen) whose runs each run's rollout batches are paired with"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    body = collect(
        args.run, args.arms, parse_seeds(args.seeds), parse_pairs(args.control, "--control"), args.reference, args.stream_control
    )
    run_commands = "bash research/drivers/rl_seed_runs.sh RUN ARM:SEED ... (one lane each, OMP_NUM_THREADS=1)"
    write_results(args.out, {"run_commands": run_commands, **body}, what=args.what)
    for step, result in body["compare"].items():
        for arm, control in result["controls"].items():
            pair = result["stats"][arm].get(f"vs_{control}_by_seed") or {}
            if pair:
                print(
                    f"test EM at the {step} step, {arm} over {control}: {100 * pair['mean_diff']:+.2f} ± "
                    f"{100 * pair['ci95']:.2f} (p {p_value_text(pair)}, seeds {', '.join(map(str, pair['seeds']))})"
                )
    for arm, by_seed in body.get("stream", {}).get("runs", {}).items():
        for seed, d in by_seed.items():
            print(
                f"training EM, {arm} seed {seed} against {args.stream_control} by quarter: {d['run_by_part']} vs "
                f"{d['control_by_part']}; second half {100 * d['second_half_diff']:+.1f} (p {d['second_half_p']})"
            )
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
