"""The arms ablations (``prorag ablate --what process|family``): train and test every arm for each seed, then compare.

``process``: where the step rewards come from (the learned PRM, the oracle, the oracle up to the first
error, and the controls with their step rewards shuffled within each group) against outcome-only GRPO;
``family``: each method's rewards and advantage on the one trainer, offline DPO beside them. Every arm
starts from the same pi_rft with the same questions, budget and seeds (a seed gives the same rollout
streams in every arm). With ``stream_control`` each seed also runs pi_rft at learning rate 0 on its
question stream, to tell whether the schedule learns at all. ``train_only`` is a worker's share (:mod:`prorag.experiments.workers`): the runs,
no statistics. The results (``ablations/NAME.json``) name the primary contrasts (``primary``) and carry
a Holm-adjusted ``p_holm`` beside every test's ``p_value``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from prorag.data.jsonl import write_json
from prorag.experiments.ablations.arms import CONTROLS, REFERENCE, Arm, ablation_arms, arm_config, select_arms
from prorag.experiments.ablations.comparison import (
    FAMILY_METRICS,
    PROCESS_METRICS,
    process_statistics,
    read_evaluation,
    training_signals,
)
from prorag.experiments.ablations.contrasts import default_primary, parse_contrast, with_holm
from prorag.experiments.ablations.runs import evaluate_on_test, train_rl_policy
from prorag.experiments.pipeline import PipelineConfig, Run, resolve, rl_run_name, system_eval_config
from prorag.experiments.stream_control import FROZEN_ARM, FROZEN_ASSIGNMENTS, stream_statistics
from prorag.stages.rl import dev_selection


def arms_ablation(
    run: Run,
    arms: Mapping[str, Arm],
    progress: Callable[[str], None],
    seeds: Sequence[int] | None = None,
    metrics: Sequence[str] = (),
    label: str = "ablation",
    over_search: bool = False,
    offline: Mapping[str, Callable[[Run, int], str]] | None = None,
    only: Sequence[str] | None = None,
    controls: Mapping[str, str] = CONTROLS,
    train_only: bool = False,
    primary: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Train and evaluate every arm (those named in ``only``, when given) for each seed
    (``process_seeds`` unless given), then :func:`process_statistics` with the evaluation's
    ``metrics`` and the training log's :func:`training_signals` as extras; ``curves`` names each
    arm's ``metrics.jsonl`` per seed (held-out EM with ``eval_every``).
    ``over_search`` turns on the evaluation's re-asking of sub-queries (``over_search_rate``).
    ``offline`` arms are trained without RL (``fn(run, seed)`` -> policy folder) and tested alike;
    ``controls`` (arm -> control) are tested where both ran. ``primary``: the contrasts named primary
    (None: :func:`~prorag.experiments.ablations.contrasts.default_primary`); those whose two arms ran are
    the result's ``primary``, and every test gets its ``p_holm`` (:func:`with_holm`). ``train_only``: the runs and their
    evaluations, no statistics (a worker's share, :mod:`prorag.experiments.workers`; any number
    of seeds); returns ``{}``."""
    cfg = run.config
    seeds = list(seeds if seeds is not None else cfg.process_seeds)
    if len(seeds) < 2 and not train_only:
        raise ValueError(f"the {label} needs at least 2 seeds per arm (a 95% CI over seeds), got {seeds}")
    if only is not None:
        arms, offline = select_arms(arms, only, label, offline)
    ev = replace(system_eval_config(cfg, "prorag"), over_search=over_search or cfg.eval.over_search)
    # Every arm as ``train(seed) -> policy folder``: RL arms by their assignments, offline ones as given.
    trainers: dict[str, Callable[[int], str]] = {
        arm: lambda seed, arm=arm, a=assignments: train_rl_policy(run, rl_run_name(arm, seed), arm_config(run, a, seed))
        for arm, assignments in arms.items()
    } | {arm: lambda seed, train=train: train(run, seed) for arm, train in (offline or {}).items()}
    predictions: dict[str, dict[int, list[dict[str, Any]]]] = {}
    extras: dict[str, dict[int, dict[str, float | None]]] = {}
    for arm, train in trainers.items():
        predictions[arm], extras[arm] = {}, {}
        for seed in seeds:
            name = rl_run_name(arm, seed)
            ev_dir = evaluate_on_test(run, name, train(seed), ev)
            if train_only:
                continue
            predictions[arm][seed], extras[arm][seed] = read_evaluation(ev_dir, metrics)
            extras[arm][seed] |= training_signals(run.path("rl", name, "metrics.jsonl"))
            # The step whose weights were evaluated, for an arm that stops early on dev (select_policy).
            chosen = dev_selection(run.path("rl", name))
            extras[arm][seed]["selected_step"] = chosen["step"] if chosen else None
        progress(f"{label}: {arm} done ({len(seeds)} seeds)")
    if cfg.stream_control:  # pi_rft on each seed's stream: trained at learning rate 0, never evaluated on test
        for seed in seeds:
            train_rl_policy(run, rl_run_name(FROZEN_ARM, seed), arm_config(run, FROZEN_ASSIGNMENTS, seed))
        progress(f"{label}: {FROZEN_ARM} (stream control) done ({len(seeds)} seeds)")
    if train_only:
        return {}
    ran = [*predictions]
    declared = default_primary(ran, REFERENCE, controls) if primary is None else primary
    ran_primary = [c for c in declared if all(arm in ran for arm in parse_contrast(c))]
    result = {
        "arms": {arm: list(a) for arm, a in arms.items()} | {arm: ["offline"] for arm in offline or {}},
        "seeds": seeds,
        "primary": ran_primary,
        "stats": with_holm(process_statistics(predictions, extras=extras, controls=controls), ran_primary, REFERENCE),
        "curves": {arm: [f"rl/{rl_run_name(arm, s)}/metrics.jsonl" for s in seeds] for arm in arms},
    }
    if cfg.stream_control:
        metrics = {arm: {s: run.path("rl", rl_run_name(arm, s), "metrics.jsonl") for s in seeds} for arm in arms}
        frozen = {s: run.path("rl", rl_run_name(FROZEN_ARM, s), "metrics.jsonl") for s in seeds}
        result["stream"] = stream_statistics(metrics, frozen)
    return result


def process_ablation(
    run: Run,
    progress: Callable[[str], None],
    seeds: Sequence[int] | None = None,
    only: Sequence[str] | None = None,
    train_only: bool = False,
) -> dict[str, Any]:
    """:func:`arms_ablation` over :data:`PROCESS_ARMS` (where the step rewards come from) and the
    config's extra arms (:func:`ablation_arms`) with :data:`PROCESS_METRICS`."""
    arms = ablation_arms(run.config, "process")
    return arms_ablation(
        run,
        arms.rl,
        progress,
        seeds,
        PROCESS_METRICS,
        label="process ablation",
        only=only,
        controls=arms.controls,
        train_only=train_only,
        primary=arms.primary,
    )


def family_ablation(
    run: Run,
    progress: Callable[[str], None],
    seeds: Sequence[int] | None = None,
    only: Sequence[str] | None = None,
    train_only: bool = False,
) -> dict[str, Any]:
    """:func:`arms_ablation` over :data:`FAMILY_ARMS` and the config's extra arms
    (:func:`ablation_arms`) with :data:`FAMILY_METRICS` (the methods compared)."""
    arms = ablation_arms(run.config, "family")
    return arms_ablation(
        run,
        arms.rl,
        progress,
        seeds,
        FAMILY_METRICS,
        label="family comparison",
        over_search=True,
        offline=arms.offline,
        only=only,
        controls=arms.controls,
        train_only=train_only,
        primary=arms.primary,
    )


def worker_main(argv: Sequence[str] | None = None) -> None:
    """One worker of ``prorag ablate --workers N`` (:mod:`prorag.experiments.workers` starts it):
    the runs and evaluations of some seeds of an ablation, no statistics."""
    import argparse

    import torch

    from prorag.core.config import load_config

    parser = argparse.ArgumentParser(
        prog="prorag-ablation-worker",
        description="One worker of `prorag ablate --workers N` (started by it; see prorag.experiments.workers).",
    )
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True, help="the run's resolved PipelineConfig (YAML)")
    parser.add_argument("--what", choices=("process", "family"), required=True)
    parser.add_argument("--seeds", required=True, help="comma-separated")
    parser.add_argument("--threads", type=int, required=True, help="torch CPU threads")
    parser.add_argument("--arms", default=None, help="comma-separated; default all")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    def say(message: str) -> None:
        print(message, flush=True)

    run = Run(args.run_dir, resolve(load_config(args.config, PipelineConfig)), say)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    arms = [a for a in args.arms.split(",") if a] if args.arms else None
    ablation = process_ablation if args.what == "process" else family_ablation
    ablation(run, say, seeds, arms, train_only=True)


def write_arms_results(
    run_dir: Path,
    result: Mapping[str, Any],
    digest: str,
    command: str,
    results_dir: Path | None = None,
    name: str = "process",
) -> Path:
    """``RUN/ablations/NAME.json`` (the ablation, the pipeline config's fingerprint, the command
    line), copied to ``results_dir/NAME_DATE.json`` when given; returns the run folder's file."""
    path = Path(run_dir) / "ablations" / f"{name}.json"
    payload = {**result, "config_fingerprint": digest, "command": command}
    write_json(path, payload)
    if results_dir is not None:
        write_json(Path(results_dir) / f"{name}_{datetime.date.today().isoformat()}.json", payload)
    return path
