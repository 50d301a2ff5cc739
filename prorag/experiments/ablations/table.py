"""The console table of an arms comparison (:func:`process_table`), as ``prorag ablate`` and ``prorag compare`` print it.

One line per arm (EM and F1 mean ± 95% CI, its tests against the reference), then each arm against its
control. Where the statistics carry Holm-adjusted p-values, each secondary test shows its ``Holm`` value
beside the nominal p, primary contrasts are marked, and a line above the table names them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prorag.core.statistics import p_value_text
from prorag.evaluation.step_errors import STEP_VALIDITY_RATES
from prorag.experiments.ablations.contrasts import contrast_name, p_with_holm, primary_note, shows_holm


def _versus_text(row: Mapping[str, Any], other: str, primary: bool = False, n_primary: int | None = None) -> str:
    """One arm's tests against ``other`` as console text ("" where none ran); with ``n_primary`` (the
    number of primary contrasts; None: none were declared, nominal p-values only) each p has its
    Holm-adjusted value beside it (:func:`~prorag.experiments.ablations.contrasts.p_with_holm`)."""
    holm = n_primary is not None

    def p_text(test: Mapping[str, Any], text: str) -> str:
        return p_with_holm(test, text, primary, n_primary or 0) if holm else text

    test, by_seed = row.get(f"vs_{other}"), row.get(f"vs_{other}_by_seed")
    runs, rest = row.get(f"vs_{other}_runs"), row.get(f"vs_{other}_non_yes_no_by_seed")
    text = f"dEM {100 * test['mean_diff']:+.1f}  p={p_text(test, p_value_text(test))}" if test else ""
    text += (
        f"  (over seeds {100 * by_seed['mean_diff']:+.1f} ± {100 * by_seed['ci95']:.1f}, p={p_text(by_seed, p_value_text(by_seed))})"
        if by_seed
        else ""
    )
    text += f"  (runs unpaired p={p_text(runs, format(runs['p_value'], '.3f'))})" if runs else ""
    text += f"  non-yes/no dEM {100 * rest['mean_diff']:+.1f} p={p_text(rest, p_value_text(rest))}" if rest else ""
    steps = [row[key] for rate in STEP_VALIDITY_RATES if (key := f"vs_{other}_{rate}_by_seed") in row]
    if len(steps) == len(STEP_VALIDITY_RATES):
        diffs = "/".join(f"{100 * test['mean_diff']:+.1f}" for test in steps)
        p_values = "/".join(f"{test['p_value']:.2f}" for test in steps)
        if holm and all(shows_holm(test, primary, n_primary or 0) for test in steps):
            p_values += ", Holm " + "/".join(f"{test['p_holm']:.2f}" for test in steps)
        text += f"  valid search/sub-answer/answer {diffs} pts (p={p_values}, {steps[0]['n']} seeds)"
    return text


def process_table(stats: Mapping[str, Any], reference: str = "grpo", primary: Sequence[str] | None = None) -> str:
    """The console table of :func:`process_statistics`: EM and F1 (%) mean ± 95% CI, and the
    paired test against ``reference``; then each arm against its control, where both ran.
    ``primary`` (the contrasts named primary; None for statistics from before they were) adds the line
    that names them above the table and marks their rows ``[primary]``."""
    chosen = list(primary or [])
    n_primary = None if primary is None else len(chosen)
    note = primary_note(primary)
    lines = [note] if note else []
    lines.append(f"{'arm':<16} {'seeds':>5}  {'EM (%)':>14}  {'F1 (%)':>14}  vs {reference} (seed-averaged per-question EM)")
    for arm, row in stats.items():
        is_primary = contrast_name(arm, reference) in chosen
        versus = _versus_text(row, reference, is_primary, n_primary) or "(reference)"
        lines.append(
            f"{arm:<16} {len(row['per_seed']):>5}  {100 * row['em']:>6.1f} ± {100 * row['em_ci95']:<5.1f}"
            f"  {100 * row['f1']:>6.1f} ± {100 * row['f1_ci95']:<5.1f}  {versus}{'  [primary]' if is_primary else ''}"
        )
    controlled = [(arm, row) for arm, row in stats.items() if "control" in row]
    if controlled:
        lines.append("against its control (built in: the same step rewards shuffled within each group):")
        for arm, row in controlled:
            is_primary = contrast_name(arm, row["control"]) in chosen
            versus = _versus_text(row, row["control"], is_primary, n_primary)
            lines.append(f"  {arm} vs {row['control']}{' [primary]' if is_primary else ''}: {versus}")
    return "\n".join(lines)
