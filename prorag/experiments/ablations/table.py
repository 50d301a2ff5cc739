"""The console table of an arms comparison (:func:`process_table`), as ``prorag ablate`` and ``prorag compare`` print it.

One line per arm (EM and F1 mean ± 95% CI, its tests against the reference), then each arm against its
control. Where the statistics carry Holm-adjusted p-values, each secondary test shows its ``Holm`` value
beside the nominal p, primary contrasts are marked, and a line above the table names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prorag.core.statistics import p_value_text
from prorag.evaluation.step_errors import STEP_VALIDITY_RATES


def _versus_text(row: Mapping[str, Any], other: str) -> str:
    """One arm's tests against ``other`` as console text ("" where none ran)."""
    test, by_seed = row.get(f"vs_{other}"), row.get(f"vs_{other}_by_seed")
    runs, rest = row.get(f"vs_{other}_runs"), row.get(f"vs_{other}_non_yes_no_by_seed")
    text = f"dEM {100 * test['mean_diff']:+.1f}  p={p_value_text(test)}" if test else ""
    text += (
        f"  (over seeds {100 * by_seed['mean_diff']:+.1f} ± {100 * by_seed['ci95']:.1f}, p={p_value_text(by_seed)})"
        if by_seed
        else ""
    )
    text += f"  (runs unpaired p={runs['p_value']:.3f})" if runs else ""
    text += f"  non-yes/no dEM {100 * rest['mean_diff']:+.1f} p={p_value_text(rest)}" if rest else ""
    steps = [row[key] for rate in STEP_VALIDITY_RATES if (key := f"vs_{other}_{rate}_by_seed") in row]
    if len(steps) == len(STEP_VALIDITY_RATES):
        diffs = "/".join(f"{100 * test['mean_diff']:+.1f}" for test in steps)
        p_values = "/".join(f"{test['p_value']:.2f}" for test in steps)
        text += f"  valid search/sub-answer/answer {diffs} pts (p={p_values}, {steps[0]['n']} seeds)"
    return text


def process_table(stats: Mapping[str, Any], reference: str = "grpo") -> str:
    """The console table of :func:`process_statistics`: EM and F1 (%) mean ± 95% CI, and the
    paired test against ``reference``; then each arm against its control, where both ran."""
    lines = [f"{'arm':<16} {'seeds':>5}  {'EM (%)':>14}  {'F1 (%)':>14}  vs {reference} (seed-averaged per-question EM)"]
    for arm, row in stats.items():
        lines.append(
            f"{arm:<16} {len(row['per_seed']):>5}  {100 * row['em']:>6.1f} ± {100 * row['em_ci95']:<5.1f}"
            f"  {100 * row['f1']:>6.1f} ± {100 * row['f1_ci95']:<5.1f}  {_versus_text(row, reference) or '(reference)'}"
        )
    controlled = [(arm, row) for arm, row in stats.items() if "control" in row]
    if controlled:
        lines.append("against its control (built in: the same step rewards shuffled within each group):")
        lines += [f"  {arm} vs {row['control']}: {_versus_text(row, row['control'])}" for arm, row in controlled]
    return "\n".join(lines)
