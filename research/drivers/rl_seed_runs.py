"""One build's RL arms as a results file: every (arm, seed) run of `benchmarks/rl_seed_runs.sh`, its
dev curve and test scores at the last and the dev-chosen step, and the arms compared over seeds.

    python benchmarks/rl_seed_runs.py RUN --arms prmfesgn prmfesgnsh --control prmfesgn=prmfesgnsh \\
        --seeds 0-2 --out results/rl_build8_2026-11-28.json [--what "..."]

RUN is a pipeline run folder (`prorag pipeline --config configs/arms_demo.yaml`) whose ``probes/``
holds the runs (``ARM-sS/``) and their test evaluations (``test-ARM-sS-last/``, ``-best/``). Written:

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
`benchmarks/pool_studies_data.py` reads.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from prorag.core.metrics import p_value_text, yes_no_scores
from prorag.data.jsonl import read_json, read_jsonl, write_json
from prorag.experiments.compare import compare_arms, parse_pairs, parse_seeds
from prorag.experiments.stream_control import stream_difference

#: Test scores kept per evaluation (from its ``metrics.json``), beside the per-question EM string.
SCORES = ("em", "f1", "format_valid_rate", "mean_retrieval_steps", "valid_search_rate", "valid_subanswer_rate")
#: Training signals (``metrics.jsonl`` keys) averaged over a run's first and last five steps.
SIGNALS = (
    "reward",
    "answer_em",
    "process_reward",
    "kl_to_init",
    "groups_em_agree",
    "advantage_process_share",
    "advantage_silent_share",
    "clip_fraction",
    "searches_per_trajectory",
    "format_valid_rate",
    "replay_nll",
)
#: The oracle's verdict counts summed from the prediction lines (``step_validity_fields``).
VERDICTS = tuple(f"{p}_{k}" for k in ("searches", "subanswers", "answers") for p in ("judged", "valid"))


def evaluation(folder: Path, question_ids: list[str] | None = None) -> dict[str, Any]:
    """An evaluation folder's scores: :data:`SCORES`, EM on the yes/no questions and the rest, EM by
    hop count, and ``em_by_question`` in ``question_ids`` order (the folder's own order if None)."""
    metrics = read_json(folder / "metrics.json")
    rows = list(read_jsonl(folder / "predictions.jsonl"))
    by_id = {r["id"]: r for r in rows}
    ids = question_ids if question_ids is not None else [r["id"] for r in rows]
    missing = [q for q in ids if q not in by_id]
    if missing:
        raise ValueError(f"{folder}/predictions.jsonl: no line for {len(missing)} test questions (first: {missing[0]})")
    out: dict[str, Any] = {k: metrics[k] for k in SCORES if k in metrics}
    out |= yes_no_scores((r["prediction"], r["golden_answers"]) for r in rows) or {}
    hops: dict[str, list[float]] = {}
    for r in rows:
        hops.setdefault(str(r.get("hops", "?")), []).append(float(r["em"]))
    out["em_by_hops"] = {h: {"n": len(v), "em": sum(v) / len(v)} for h, v in sorted(hops.items())}
    out["em_by_question"] = "".join("1" if float(by_id[q]["em"]) >= 0.5 else "0" for q in ids)
    return out


def verdict_counts(folder: Path) -> dict[str, int]:
    """The oracle's verdicts on an evaluation's steps, summed over its prediction lines."""
    rows = list(read_jsonl(folder / "predictions.jsonl"))
    return {k: sum(int(r.get(k, 0)) for r in rows) for k in VERDICTS}


def first_last(rows: list[dict[str, Any]], key: str, n: int = 5) -> tuple[float | None, float | None]:
    """Means of ``key`` over the first and the last ``n`` training rows that log it (a step's dev
    evaluation shares that step's row, so rows carrying ``eval_em`` count like any other)."""
    values = [float(r[key]) for r in rows if key in r]
    if not values:
        return None, None
    return round(sum(values[:n]) / len(values[:n]), 4), round(sum(values[-n:]) / len(values[-n:]), 4)


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


def git_head() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    return done.stdout.strip() or "unknown"


def write_results(out: Path, body: dict[str, Any], **front: Any) -> None:
    """Write a benchmark's results file: the date, ``front`` (e.g. ``what``), the machine, the code's
    commit and the command that ran, then ``body``."""
    write_json(
        out,
        {
            "date": datetime.date.today().isoformat(),
            **front,
            "machine": f"{cpu_model()}, {platform.system()}",
            "libraries": library_versions(),
            "code": git_head(),
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            **body,
        },
    )


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU as ``/proc/cpuinfo`` names it, with its family, model and stepping and whether it has
    AVX-512: two CPUs that share a model name ("AMD EPYC") gave other floats from the same config and
    seed (docs/LOG.md, 2026-11-29 afternoon), so the name alone does not say which machine a build is
    reproducible on. ``cpuinfo``: that file's text (read when not given)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.is_file():
            return platform.processor() or platform.machine()
        cpuinfo = path.read_text()
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    ident = [f"{key} {fields[key]}" for key in ("cpu family", "model", "stepping") if key in fields]
    if "flags" in fields:
        ident.append("AVX-512" if "avx512f" in fields["flags"].split() else "no AVX-512")
    return f"{name} ({', '.join(ident)})" if ident else name


def library_versions(names: tuple[str, ...] = ("torch", "transformers", "trl", "accelerate", "peft")) -> str:
    """The installed versions of the libraries a build's floats depend on, e.g. ``torch 2.13.0+cpu``:
    pip resolves them afresh at every install, so a results file names the ones its runs had."""
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


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
    return {
        "question_ids": question_ids,
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
    parser.add_argument("--arms", nargs="+", required=True, help="arm names as in rl_seed_runs.sh")
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
    run_commands = "bash benchmarks/rl_seed_runs.sh RUN ARM:SEED ... (one lane each, OMP_NUM_THREADS=1)"
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
