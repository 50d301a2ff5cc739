"""RL learning curves of a run: the outcome reward per step of each RL run, grouped by system
with the pipeline's ``curve_groups``, averaged over seeds (with a band) and smoothed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prorag.data.jsonl import read_jsonl


def read_curve(path: Path, key: str = "outcome_reward") -> list[tuple[float, float]]:
    """``(step, value)`` of every logged row of an RL ``metrics.jsonl`` that has ``key``.

    TRL also logs rows without rollout metrics (e.g. the final train summary); those are skipped.
    A missing file gives an empty curve (the stage may not have run yet).
    """
    if not Path(path).is_file():
        return []
    points = []
    for row in read_jsonl(path, tolerate_truncated_tail=True):
        step, value = row.get("step"), row.get(key)
        if isinstance(step, int | float) and isinstance(value, int | float) and math.isfinite(value):
            points.append((float(step), float(value)))
    return sorted(points)


def learning_curves(run_dir: Path, results: Mapping[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Outcome reward per RL step of each curve in ``results["curves"]`` (empty ones dropped)."""
    curves = {}
    for name, where in (results.get("curves") or {}).items():
        points = read_curve(Path(run_dir) / where)
        if points:
            curves[name] = points
    return curves


def curves_by_system(
    curves: Mapping[str, Sequence[tuple[float, float]]], groups: Mapping[str, Sequence[str]]
) -> dict[str, list[Sequence[tuple[float, float]]]]:
    """The curves of each system over its seeds, ``groups`` naming each system's curves (the
    pipeline's ``results["curve_groups"]``), in its order; a curve no group names stands alone."""
    grouped: dict[str, list[Sequence[tuple[float, float]]]] = {}
    for system, names in groups.items():
        runs = [curves[n] for n in names if n in curves]
        if runs:
            grouped[system] = runs
    claimed = {n for names in groups.values() for n in names}
    for name, points in curves.items():
        if name not in claimed:
            grouped[name] = [points]
    return grouped


def seed_band(runs: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float, float, float]]:
    """``(step, mean, min, max)`` over the runs, at the steps every run logged (a run cut short
    shortens the band rather than biasing its tail)."""
    if not runs:
        return []
    tables = [dict(r) for r in runs]
    steps = sorted(set.intersection(*(set(t) for t in tables)))
    out = []
    for step in steps:
        values = [t[step] for t in tables]
        out.append((step, sum(values) / len(values), min(values), max(values)))
    return out


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start). An RL step's mean
    reward swings with the difficulty of its 8 questions, the same questions for every system
    at a given step and seed, so a short window shows the trend without shifting it much."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
