"""``RUN/results.json`` and the terminal's results table (:func:`collect_results`, :func:`results_table`).

Every system's metrics (mean and spread over seeds for the RL systems, the first seed's other
fields as they are), paired tests against full ProRAG on the first seed, the RL learning curves,
the middle stages' summaries and the wall times. The one-shot baselines have no step format, so
their format-valid rate is left out rather than reported as 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prorag.core.statistics import mean_and_spread
from prorag.data.jsonl import read_json, read_jsonl
from prorag.evaluation.harness import compare_predictions
from prorag.experiments.pipeline.config import LABELS, RL_SYSTEMS
from prorag.experiments.pipeline.run_folder import Run, eval_dir_name, rl_run_name


def _mean_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-seed metrics averaged (numbers) with their spread (``NAME_std``); the first seed's
    other fields (distributions, by-type tables) are kept as they are."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            mean, spread = mean_and_spread(float(r[key]) for r in rows)
            out[key] = mean
            out[f"{key}_std"] = spread
    return out


def stage_summaries(run: Run) -> dict[str, Any]:
    """What the middle stages produced, for the report: the pairs' counts, the PRM's held-out
    pairwise accuracy and its audit on fresh samples, and what RFT's filters kept."""
    out: dict[str, Any] = {}
    if run.path("pairs", "summary.json").exists():
        out["pairs"] = read_json(run.path("pairs", "summary.json"))
    metrics = run.path("prm", "metrics.jsonl")
    if metrics.exists():
        final = [r for r in read_jsonl(metrics) if "eval_accuracy" in r]
        if final:
            out["prm_held_out"] = {k: v for k, v in final[-1].items() if k.startswith("eval_")}
    if run.path("prm", "audit.json").exists():
        out["prm_audit"] = read_json(run.path("prm", "audit.json"))
    if run.path("prm", "summary.json").exists():
        out["prm_verdict"] = read_json(run.path("prm", "summary.json"))
    if run.path("policies", "rft", "rft_counts.json").exists():
        out["rft"] = read_json(run.path("policies", "rft", "rft_counts.json"))
    return out


def collect_results(run: Run) -> dict[str, Any]:
    """``RUN/results.json``: every system's metrics (mean over seeds for RL systems), per-seed
    metrics, learning curves (``curve_groups``: each RL system's curves, one per seed), paired t-tests against full ProRAG, wall times."""
    cfg = run.config
    systems: dict[str, Any] = {}
    for system in cfg.systems:
        seeds: list[int | None] = list(cfg.seeds) if system in RL_SYSTEMS else [None]
        per_seed = {}
        for seed in seeds:
            name = eval_dir_name(system, seed)
            per_seed[str(seed) if seed is not None else "-"] = read_json(run.path("eval", name, "metrics.json"))
        first = eval_dir_name(system, seeds[0])
        entry: dict[str, Any] = {
            "label": LABELS[system],
            "eval_dir": f"eval/{first}",
            "per_question": f"eval/{first}/predictions.jsonl",
            "metrics": _mean_metrics(list(per_seed.values())) if len(per_seed) > 1 else next(iter(per_seed.values())),
        }
        if len(per_seed) > 1:
            entry["seeds"] = per_seed
        if system in ("naive", "standard-rag"):
            # One-shot answers have no step format: their format-valid rate does not apply.
            entry["metrics"] = {**entry["metrics"], "format_valid_rate": None}
        systems[system] = entry
    curve_groups = {s: [rl_run_name(s, seed) for seed in cfg.seeds] for s in RL_SYSTEMS if s in cfg.systems}
    curves = {name: f"rl/{name}/metrics.jsonl" for names in curve_groups.values() for name in names}
    significance: dict[str, Any] = {}
    if "prorag" in systems:
        ref = run.path("eval", eval_dir_name("prorag", cfg.seeds[0]), "predictions.jsonl")
        for system in systems:
            if system != "prorag":
                seed = cfg.seeds[0] if system in RL_SYSTEMS else None
                other = run.path("eval", eval_dir_name(system, seed), "predictions.jsonl")
                tests = compare_predictions(ref, other)
                significance[system] = {"metric": "em", **tests["em"], "f1": tests["f1"]}
    world = read_json(run.path("world", "world.json")).get("counts", {}) if run.path("world", "world.json").exists() else {}
    return {
        "stages": stage_summaries(run),
        "systems": systems,
        "order": list(cfg.systems),
        "curves": curves,
        "curve_groups": curve_groups,
        "significance": significance,
        "wall_seconds": dict(run.wall),
        "world": world,
        "seeds": list(cfg.seeds),
    }


def results_table(results: dict[str, Any]) -> str:
    """The report's results table (:func:`prorag.experiments.report.table.results_table`) as fixed-width text for
    the terminal: EM and F1 in percent (normalised exact match and token F1, SQuAD
    normalisation), the format-valid rate in percent, mean retrieval steps; mean ± std over
    seeds where a system ran with several."""
    from prorag.experiments.report.table import TABLE_METRICS, format_cell
    from prorag.experiments.report.table import results_table as table_rows

    header = f"{'system':<38}" + "".join(f"{col:>17}" for col, _, _ in TABLE_METRICS)
    lines = [header, "-" * len(header)]
    for row in table_rows(results):
        cells = "".join(f"{format_cell(row.cells[col], percent):>17}" for col, _, percent in TABLE_METRICS)
        lines.append(f"{row.label:<38}{cells}")
    return "\n".join(lines)
