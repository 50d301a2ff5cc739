"""``prorag ablate``: one ablation on a pipeline run folder, the pipeline first (skipping what is done).

``table2`` (every system over its seeds, tested against full ProRAG), ``beta`` and ``topk``
(:mod:`~prorag.experiments.ablations.sweeps`), ``process`` and ``family``
(:mod:`~prorag.experiments.ablations.arms_runner`). The arms, their controls and the primary contrasts
are checked before the pipeline runs, not after hours of it. The numbers are merged into the run's
``results.json`` (``beta_sweep``, ``topk``, ``process_ablation``, ``family_ablation``) for the report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from prorag.core.config import used_settings
from prorag.data.jsonl import write_json
from prorag.experiments.ablations.arms import ablation_arms, select_arms
from prorag.experiments.ablations.arms_runner import family_ablation, process_ablation, write_arms_results
from prorag.experiments.ablations.sweeps import beta_sweep, topk_sweep
from prorag.experiments.ablations.table import process_table
from prorag.experiments.pipeline import PipelineConfig, Run, fingerprint, resolve, results_table, run_pipeline
from prorag.experiments.stream_control import stream_table

ABLATIONS: tuple[str, ...] = ("table2", "beta", "topk", "process", "family")
Ablation = Literal["table2", "beta", "topk", "process", "family"]


def run_ablation(
    config: PipelineConfig,
    run_dir: str | Path,
    what: Ablation | str,
    *,
    progress: Callable[[str], None] = print,
    seeds: Sequence[int] | None = None,
    results_dir: Path | None = None,
    command: str = "",
    arms: Sequence[str] | None = None,
    workers: int = 1,
) -> str:
    """Run one ablation in ``run_dir`` (the pipeline first, skipping what is done) and merge its
    numbers into ``results.json``; returns a table for the terminal. ``seeds``, ``results_dir``,
    ``command``, ``arms`` (a subset, :func:`select_arms`) and ``workers`` (the seeds spread over
    that many processes, :func:`~prorag.experiments.workers.run_in_workers`) are the arms
    ablations' (:func:`process_ablation`, :func:`family_ablation`, :func:`write_arms_results`)."""
    # The arms are checked before the pipeline runs, not after hours of it.
    if what in ("process", "family"):
        known = ablation_arms(config, what)
        rl_arms, offline_arms = (
            (known.rl, known.offline) if arms is None else select_arms(known.rl, arms, f"{what} ablation", known.offline)
        )
    elif arms is not None:
        raise ValueError(f"--arms applies to --what process or family, not {what!r}")
    if workers < 1 or (workers > 1 and what not in ("process", "family")):
        raise ValueError(f"--workers must be 1, or more with --what process or family; got {workers} with {what!r}")
    results = run_pipeline(config, run_dir, progress=progress)
    if what == "table2":
        lines = [results_table(results), "", "paired t-test against full ProRAG (per-question EM / F1):"]
        for name, row in results.get("significance", {}).items():
            lines.append(f"  {name:<14} EM p={row['p_value']:.4f} (t={row['t']:.2f})  F1 p={row['f1']['p_value']:.4f}")
        return "\n".join(lines)
    run = Run(Path(run_dir), resolve(config), progress)
    if what == "beta":
        results["beta_sweep"] = beta_sweep(run, progress)
        rows = results["beta_sweep"]
        text = "\n".join(
            f"beta {b:>4}: EM {r['em']:.3f}±{r['em_std']:.3f}  F1 {r['f1']:.3f}±{r['f1_std']:.3f}" for b, r in rows.items()
        )
    elif what == "topk":
        results["topk"] = topk_sweep(run, progress)
        text = "\n".join(f"top-{k}: EM {r['em']:.3f}  F1 {r['f1']:.3f}" for k, r in results["topk"].items())
    elif what in ("process", "family"):
        ablation = process_ablation if what == "process" else family_ablation
        if workers > 1:
            from prorag.experiments.workers import run_in_workers

            # The workers train and evaluate every run; the pass below finds them done and reads them.
            todo = seeds if seeds is not None else run.config.process_seeds
            run_in_workers(run, what, todo, [*rl_arms, *offline_arms], workers, progress)
        result = results[f"{what}_ablation"] = ablation(run, progress, seeds, arms)
        where = write_arms_results(Path(run_dir), result, fingerprint(used_settings(run.config)), command, results_dir, what)
        text = process_table(result["stats"], primary=result["primary"])
        if "stream" in result:
            text += "\n" + stream_table(result["stream"])
        text += f"\n-> {where}"
    else:
        raise ValueError(f"unknown ablation {what!r}; expected one of {', '.join(ABLATIONS)}")
    # Merge with what earlier ablations wrote.
    path = Path(run_dir) / "results.json"
    write_json(path, results)
    if config.report:
        from prorag.experiments.report.build import write_report

        write_report(Path(run_dir))
    return text
