"""A pipeline run folder's evaluations and training logs as the numbers a study's results file keeps.

An evaluation folder (``prorag eval``'s ``metrics.json`` and ``predictions.jsonl``) becomes its
scores plus ``em_by_question``, a string of 0s and 1s in a given question order, so later studies
pair runs per question without the run folder. Per-question lines missing from an evaluation are an
error naming the first one, never a shorter string. Pooling over runs (:func:`pooled`) is a t
interval over runs, descriptive when runs share questions or seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prorag.core.metrics import yes_no_scores
from prorag.core.statistics import mean_and_ci
from prorag.data.jsonl import read_json, read_jsonl

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


def percent(string: str) -> float:
    """EM in points from a per-question string of 0s and 1s."""
    return 100 * string.count("1") / len(string)


def pooled(values: list[float]) -> dict[str, Any] | None:
    """Mean ± 95% CI over runs (t), how many are above 0 and how many there are; None below two."""
    if len(values) < 2:
        return None
    mean, ci = mean_and_ci(values)
    return {"mean": round(mean, 2), "ci95": round(ci, 2), "positive": sum(v > 0 for v in values), "n": len(values)}
