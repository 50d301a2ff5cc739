"""The whole method in one run folder: :func:`run_pipeline` runs or resumes every stage.

data -> index -> SFT -> MCTS -> pairs -> PRM -> RFT -> RL -> evaluation -> step scores -> report.
A device that cannot be used is refused before anything is written; stages no listed system needs
are left out. A rerun keeps what the ablations added to ``results.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prorag.data.jsonl import read_json, write_json
from prorag.experiments.pipeline.config import RL_SYSTEMS, PipelineConfig, resolve, stage_device, write_resolved_config
from prorag.experiments.pipeline.results import collect_results
from prorag.experiments.pipeline.run_folder import Run, eval_dir_name
from prorag.experiments.pipeline.stages import (
    _data_files,
    stage_eval,
    stage_index,
    stage_prm,
    stage_rft,
    stage_rl,
    stage_sft,
    stage_splits,
    stage_world,
)


def run_pipeline(config: PipelineConfig, run_dir: str | Path, *, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or resume) every stage in ``run_dir``; return the results (also in ``results.json``)."""
    config = resolve(config)
    stage_device(config.device)  # a device that cannot be used is refused before anything is written
    run = Run(Path(run_dir), config, progress)
    run.dir.mkdir(parents=True, exist_ok=True)
    write_resolved_config(config, run.path("pipeline_config.yaml"))
    files = _data_files(run)
    stage_world(run)
    stage_index(run, files)
    stage_splits(run, files)
    stage_sft(run, files)
    if {"rft", "grpo", "prorag", "rl-from-sft", "dpo"} & set(config.systems):
        stage_prm(run)
    stage_rft(run)
    stage_rl(run)
    stage_eval(run)
    if "prorag" in config.systems and config.report:
        from prorag.experiments.report.step_scores import score_eval_trajectories
        from prorag.supervision.reward_model import ProcessRewardModel

        def score() -> None:
            prm = ProcessRewardModel.load(run.path("prm", "prm"), device=run.device)
            for system in config.systems:
                seed = config.seeds[0] if system in RL_SYSTEMS else None
                score_eval_trajectories(prm, run.path("eval", eval_dir_name(system, seed)))

        run.stage("step-scores", {"systems": config.systems}, score)
    results = collect_results(run)
    if run.path("results.json").exists():  # keep what the ablations added
        before = read_json(run.path("results.json"))
        results.update({k: before[k] for k in ("beta_sweep", "topk", "process_ablation", "family_ablation") if k in before})
    write_json(run.path("results.json"), results)
    if config.report:
        from prorag.experiments.report.build import write_report

        write_report(run.dir)
    return results
