"""``learning_curve.csv``: per logged step, the training reward and, with dev evaluations,
held-out EM (the paper's Figure 4), with the step's diagnostics beside them."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prorag.data.jsonl import atomic_writer

#: The columns of ``learning_curve.csv`` (a step's row leaves blank what it did not log).
CURVE_COLUMNS: tuple[str, ...] = (
    "step",
    "outcome_reward",
    "process_reward",
    "answer_f1",
    "format_valid_rate",
    "eval_em",
    "eval_f1",
    "clip_fraction",
    "entropy",
    "kl_to_init",
    "replay_nll",
    "groups_em_agree",
    "groups_reward_agree",
    "advantage_abs_mean",
    "advantage_process_share",
    "advantage_silent_share",
)


def write_learning_curve(log_history: Sequence[dict[str, Any]], path: str | Path) -> int:
    """Write :data:`CURVE_COLUMNS` per logged step (the paper's Figure 4: training reward and,
    with ``eval_every``, held-out EM) as CSV, atomically; returns the number of rows. Log rows of
    one step are merged (the dev evaluation before step 1 is step 0's row). On a resumed run the
    history is the checkpoint's plus the new steps, so the curve covers the whole run."""
    rows: dict[int, dict[str, Any]] = {}
    for entry in log_history:
        if any(c in entry for c in CURVE_COLUMNS[1:]):
            rows.setdefault(int(entry["step"]), {}).update({c: entry[c] for c in CURVE_COLUMNS if c in entry})
    with atomic_writer(path) as f:
        out = csv.writer(f)
        out.writerow(CURVE_COLUMNS)
        for step in sorted(rows):
            out.writerow([rows[step].get(c, "") for c in CURVE_COLUMNS])
    return len(rows)


__all__ = [
    "CURVE_COLUMNS",
    "write_learning_curve",
]
