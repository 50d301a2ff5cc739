"""An arms ablation in one process against the same ablation in N worker processes
(``prorag ablate --workers N``): wall time, and whether the runs agree.

    python benchmarks/ablate_workers.py [--workers 2] [--seeds 4] [--arms grpo,prorag-oracle-first-error]
        [--rl-steps 8] [--model tiny] [--out results.json]

It builds the tiny world's pipeline once (SFT, MCTS, the PRM, RFT: the ``rft`` system) in a temporary
folder, copies it twice, and runs ``--what process`` with the given arms and seeds in each copy: once
with ``--workers N`` (cores / N threads each), then in this process with all of its cores as torch
threads (``--workers 1``, what the command did before), which by then has the RL trainer's modules
imported. Printed: the wall time of each, their ratio, and the share of test predictions that are
the same in both (on the CPU a run's floats can depend on its thread count, so the two sides may
part on near-ties). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from machine import machine_name  # benchmarks/machine.py, beside this file

from prorag.core.config import load_config
from prorag.data.jsonl import read_jsonl
from prorag.experiments.ablations import run_ablation
from prorag.experiments.pipeline import PipelineConfig, rl_run_name, run_pipeline
from prorag.experiments.workers import available_cores


def tiny_config(rl_steps: int, model: str) -> dict[str, Any]:
    """The tiny world through every stage at a small budget with the built-in ``model``; RL ``rl_steps``
    steps of 4 questions x G 4."""
    short = {"max_action_tokens": 24, "max_completion_tokens": 96}
    return {
        "data": {"world": "tiny", "sft_fraction": 0.5, "mcts_questions": 4, "rft_questions": 8, "dev_questions": 4},
        "top_k": 2,
        "sft": {
            "model": model,
            "max_steps": 16,
            "per_device_batch_size": 4,
            "learning_rate": 3.0e-3,
            "save_steps": 16,
            "eval_samples": 2,
        },
        "mcts": {"simulations": 2, "num_candidates": 2, "max_depth": 3, "rollout": short},
        "pairs": {"judge": "oracle", "min_visits": 1, "pairs_per_set": "all"},
        "prm": {"kind": "likelihood", "epochs": 1, "per_device_batch_size": 4, "if_no_pairs": "untrained"},
        "rft": {"samples_per_question": 2, "if_nothing_kept": "copy_policy", "train": {"epochs": 1, "per_device_batch_size": 4}},
        "rl": {
            "group_size": 4,
            "per_device_batch_size": 16,
            "max_steps": rl_steps,
            "save_steps": 100,
            "learning_rate": 1.0e-3,
            "num_iterations": 2,
            "rollout": {**short, "max_actions": 4},
        },
        "eval": {"rollout": {**short, "batch_size": 16}},
        "systems": ["rft"],
        "report": False,
    }


def timed_ablation(config: PipelineConfig, run_dir: Path, seeds: list[int], arms: list[str], workers: int) -> float:
    start = time.perf_counter()
    run_ablation(config, run_dir, "process", progress=lambda _: None, seeds=seeds, arms=arms, workers=workers)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--arms", default="grpo,prorag-oracle-first-error")
    parser.add_argument("--rl-steps", type=int, default=8)
    parser.add_argument("--model", default="tiny", help="built-in model size (tiny, small, ...)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cores = available_cores()
    seeds, arms = list(range(args.seeds)), args.arms.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "tiny.yaml").write_text(yaml.safe_dump(tiny_config(args.rl_steps, args.model)), encoding="utf-8")
        config = load_config(root / "tiny.yaml", PipelineConfig)
        torch.set_num_threads(cores)
        t0 = time.perf_counter()
        run_pipeline(config, root / "base", progress=lambda _: None)
        pipeline_seconds = time.perf_counter() - t0
        for side in ("one", "split"):
            shutil.copytree(root / "base", root / side)
        # The workers first: the one-process side then runs with the RL trainer's modules already
        # imported, as a second ablation in one session would; the workers always pay their imports.
        split = timed_ablation(config, root / "split", seeds, arms, args.workers)
        one = timed_ablation(config, root / "one", seeds, arms, 1)
        same = total = 0
        for arm in arms:
            for seed in seeds:
                name = rl_run_name(arm, seed)
                a = [r["prediction"] for r in read_jsonl(root / "one" / "eval" / name / "predictions.jsonl")]
                b = [r["prediction"] for r in read_jsonl(root / "split" / "eval" / name / "predictions.jsonl")]
                same, total = same + sum(x == y for x, y in zip(a, b, strict=True)), total + len(a)
    result = {
        "machine": machine_name(),
        "cores": cores,
        "torch": torch.__version__,
        "runs": len(arms) * len(seeds),
        "arms": arms,
        "seeds": seeds,
        "rl_steps": args.rl_steps,
        "model": args.model,
        "pipeline_seconds": round(pipeline_seconds, 1),
        "one_process_seconds": round(one, 1),
        "workers": args.workers,
        "workers_seconds": round(split, 1),
        "speedup": round(one / split, 2),
        "same_predictions": round(same / total, 3),
    }
    threads = max(1, cores // args.workers)
    print(
        f"{result['machine']}: {result['runs']} RL runs with their test evaluations, one process ({cores} threads) "
        f"{one:.1f} s; {args.workers} workers ({threads} thread{'s' if threads > 1 else ''} each) {split:.1f} s: "
        f"{one / split:.2f}x; predictions the same in both: {same / total:.1%}"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
