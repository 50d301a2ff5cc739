"""The results table and the sweep tables as cells and text rows, shared by the Markdown and HTML
renderers.

**Every number is named by its metric.** EM is normalised exact match (SQuAD normalisation,
:func:`prorag.core.metrics.exact_match`), never a containment metric; rates and scores are shown
in percent (as in the paper), retrieval steps as a mean count. With several seeds a cell is
mean ± std over seeds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from prorag.core.statistics import mean_and_spread, p_value_text
from prorag.experiments.ablations.contrasts import contrast_name, p_with_holm, primary_note

#: What each number of the results table means (shown in both reports, next to the table).
METRIC_DESCRIPTIONS: Mapping[str, str] = {
    "EM": "normalised exact match (%): the prediction equals a gold answer after lower-casing and removing "
    "punctuation, articles and extra spaces",
    "F1": "token F1 (%) between the normalised prediction and the best-matching gold answer",
    "Format-valid": "share of trajectories (%) that follow the ProRAG grammar and end in exactly one answer (I_traj)",
    "Retrieval steps": "mean number of searches per question",
    "Valid searches": "share of searches (%) the oracle judges valid: the sub-query targets an open hop of the gold "
    "decomposition (questions with one; – elsewhere)",
    "Valid sub-answers": "share of sub-answers (%) the oracle judges supported and correct",
    "p": "two-sided paired t-test p-value of the per-question scores against full ProRAG (metric named in the cell)",
}

#: Metrics of the results table: (column name, key in metrics.json, shown in percent).
TABLE_METRICS: tuple[tuple[str, str, bool], ...] = (
    ("EM", "em", True),
    ("F1", "f1", True),
    ("Format-valid", "format_valid_rate", True),
    ("Retrieval steps", "mean_retrieval_steps", False),
    ("Valid searches", "valid_search_rate", True),
    ("Valid sub-answers", "valid_subanswer_rate", True),
)


@dataclass(frozen=True)
class Cell:
    """One number of the table: a mean, its spread over seeds (``None`` without seeds)."""

    mean: float | None
    spread: float | None = None


@dataclass(frozen=True)
class TableRow:
    """One system of the results table (the paper's Table 2 on this run)."""

    name: str
    label: str
    cells: dict[str, Cell]
    """Keyed by the column names of :data:`TABLE_METRICS`."""
    seeds: int
    """How many seeds the cells average (1: a single run, no spread)."""
    n: int | None
    """Test questions per run."""
    significance: dict[str, Any] | None
    """``{"metric", "t", "p_value", "n"}`` of the paired t-test against full ProRAG, if run."""


def table_cell(metrics: Mapping[str, Any], per_seed: Sequence[Mapping[str, Any]], key: str) -> Cell:
    """A metric's mean and spread over seeds when per-seed results exist, else the run's value.

    The spread is the sample standard deviation over seeds (:func:`prorag.core.statistics.mean_and_spread`),
    so a table with seeds reads "mean ± std"; a missing metric gives an empty cell.
    """
    values = [float(m[key]) for m in per_seed if m.get(key) is not None]
    if values:
        mean, spread = mean_and_spread(values)
        return Cell(mean, spread if len(values) > 1 else None)
    value = metrics.get(key)
    return Cell(None if value is None else float(value))


def results_table(results: Mapping[str, Any]) -> list[TableRow]:
    """The rows of the results table, in ``results["order"]``."""
    rows = []
    significance = results.get("significance") or {}
    for name in results["order"]:
        system = results["systems"][name]
        per_seed = list((system.get("seeds") or {}).values())
        metrics = system["metrics"]
        rows.append(
            TableRow(
                name=name,
                label=str(system.get("label") or name),
                cells={col: table_cell(metrics, per_seed, key) for col, key, _ in TABLE_METRICS},
                seeds=max(len(per_seed), 1),
                n=metrics.get("n"),
                significance=significance.get(name),
            )
        )
    return rows


def format_cell(cell: Cell, percent: bool) -> str:
    """``47.2`` or ``47.2 ± 1.3`` (percent metrics scaled by 100, counts with two decimals)."""
    if cell.mean is None:
        return "–"
    scale, digits = (100.0, 1) if percent else (1.0, 2)
    text = f"{cell.mean * scale:.{digits}f}"
    return text if cell.spread is None else f"{text} ± {cell.spread * scale:.{digits}f}"


def format_significance(test: Mapping[str, Any] | None, is_reference: bool) -> str:
    """``p=0.031 (EM, n=200)``: the p-value with the metric it tested; ``reference`` for full ProRAG."""
    if is_reference:
        return "reference"
    if not test or test.get("p_value") is None:
        return "–"
    p = float(test["p_value"])
    p_text = "<0.001" if p < 0.001 else f"{p:.3f}"
    metric = str(test.get("metric", "?")).upper()
    n = f", n={test['n']}" if test.get("n") is not None else ""
    return f"p={p_text} ({metric}{n})"


def table_header() -> list[str]:
    return ["System", *(col for col, _, _ in TABLE_METRICS), "Seeds", "Questions", "p vs ProRAG"]


def table_cells(row: TableRow, reference: str | None) -> list[str]:
    """The text of one table row, shared by the markdown and the HTML report."""
    return [
        row.label,
        *(format_cell(row.cells[col], percent) for col, _, percent in TABLE_METRICS),
        str(row.seeds),
        "–" if row.n is None else str(row.n),
        format_significance(row.significance, row.name == reference),
    ]


def sweep_rows(sweep: Mapping[str, Mapping[str, Any]]) -> list[tuple[float, Cell, Cell]]:
    """``(x, EM, F1)`` of a beta or top-k sweep, sorted by x (keys are numbers written as strings)."""
    out = []
    for key, m in sweep.items():
        em = Cell(m.get("em"), m.get("em_std")) if m.get("em") is not None else Cell(None)
        f1 = Cell(m.get("f1"), m.get("f1_std")) if m.get("f1") is not None else Cell(None)
        out.append((float(key), em, f1))
    return sorted(out, key=lambda r: r[0])


def sweep_table(rows: Sequence[tuple[float, Cell, Cell]], name: str) -> tuple[list[str], list[list[str]]]:
    return [name, "EM", "F1"], [[f"{x:g}", format_cell(em, True), format_cell(f1, True)] for x, em, f1 in rows]


#: What the process ablation's tables mean (report.md and report.html).
#: The arms ablations the report shows: results key -> (section title, plot file).
ARMS_SECTIONS: dict[str, tuple[str, str]] = {
    "process_ablation": ("Where step rewards come from (process ablation)", "process_curves.png"),
    "family_ablation": ("The process-reward family on one trainer (family comparison)", "family_curves.png"),
}

#: Extra per-seed columns of an arms table: stats key -> (header, scale to percent?).
ARMS_EXTRAS: dict[str, tuple[str, bool]] = {
    "cover_em": ("Cover-EM (%)", True),
    "format_valid_rate": ("Format-valid (%)", True),
    "mean_retrieval_steps": ("Searches", False),
    # Questions answered after fewer searches than they have hops (evaluation.harness.search_depth).
    "searches_below_hops_rate": ("Fewer searches than hops (%)", True),
    "over_search_rate": ("Over-search (%)", True),
    "under_search_rate": ("Under-search (%)", True),
    # The oracle's verdicts on the test trajectories' steps (evaluation.step_errors).
    "valid_search_rate": ("Valid searches (%)", True),
    "valid_subanswer_rate": ("Valid sub-answers (%)", True),
    "valid_answer_rate": ("Answers worked out (%)", True),
    "seconds_per_rl_step": ("s / RL step", False),
    # The step whose weights were tested, for an arm that stops early on dev (rl.select_policy best_dev).
    "selected_step": ("Dev-chosen RL step", False),
    # How much outcome signal training had: groups whose samples all agree on EM, or on the outcome reward.
    "groups_em_agree": ("Groups agreeing on EM (%)", True),
    "groups_reward_agree": ("Groups with one outcome reward (%)", True),
    # What the advantages were made of: the step rewards' share of their size, and the share on
    # groups outcome GRPO is silent on (0 for GRPO; the shuffled control tells if that share is what helps).
    "advantage_process_share": ("Step rewards' share of |A| (%)", True),
    "advantage_silent_share": ("|A| on silent groups (%)", True),
    # The yes/no questions: EM there beside the constant guess's, and how the arm answers them;
    # and EM on the others, where the answer has to be found.
    "non_yes_no_em": ("Non-yes/no EM (%)", True),
    "yes_no_em": ("Yes/no EM (%)", True),
    "yes_no_constant_em": ("Constant guess (%)", True),
    "yes_no_answered_rate": ("Yes/no answered (%)", True),
    "yes_no_no_rate": ("'no' share (%)", True),
}


def arms_note(plot: str, primary: Sequence[str] | None = None) -> str:
    """The paragraph under an arms ablation's title; with ``primary`` (the ablation's primary contrasts;
    None for results from before they were declared), the sentence that names them and says how the
    other p-values were adjusted (:func:`~prorag.experiments.ablations.contrasts.primary_note`)."""
    note = (
        "Same starting policy, RL questions and budget in every arm; a seed gives every arm the same rollout "
        "streams. CI: t distribution over seeds; the paired t-test is on seed-averaged per-question EM against "
        f"GRPO. Held-out EM curves: plots/{plot}."
    )
    return f"{note} {primary_note(primary)}".rstrip()


def _mean_ci(row: Mapping[str, Any], key: str, percent: bool) -> str:
    scale, digits = (100.0, 1) if percent else (1.0, 2)
    return f"{scale * row[key]:.{digits}f} ± {scale * row.get(f'{key}_ci95', 0.0):.{digits}f}"


def _test_cell(test: Mapping[str, Any] | None, primary: bool = False, n_primary: int | None = None) -> str:
    """A test as "+x.x (p=...)", with the difference's 95% CI ("+x.x ± y.y") where the test has one
    (those over seeds). Where the ablation named its primary contrasts (``n_primary``, their number; None:
    results from before they were declared), the Holm-adjusted p is beside the nominal one ("p=0.044,
    Holm 0.131") and a primary contrast's test says so ("p=0.044, primary"; with several primaries,
    then their Holm among themselves)."""
    if not test:
        return ""
    spread = f" ± {100 * test['ci95']:.1f}" if "ci95" in test else ""
    p_text = f"{p_value_text(test)}, primary" if primary else p_value_text(test)
    shown = p_text if n_primary is None else p_with_holm(test, p_text, primary, n_primary)
    return f"{100 * test['mean_diff']:+.1f}{spread} (p={shown})"


def _controls_table(
    controlled: Mapping[str, Mapping[str, Any]], primary: Sequence[str] | None = None
) -> tuple[str, list[str], list[list[str]]]:
    """Each arm against its control (the same step rewards shuffled within each group): what the
    rewards' information adds, with the bare extra term in both arms' advantages."""
    header = ["Arm", "Control", "ΔEM (paired t, per question)", "ΔEM over seeds (paired t)"]
    header += ["ΔEM, runs unpaired (permutation)", "ΔEM on non-yes/no (t over seeds)"]
    suffixes = ("", "_by_seed", "_runs", "_non_yes_no_by_seed")
    rows = []
    for arm, row in controlled.items():
        control = row["control"]
        chosen = contrast_name(arm, control) in (primary or ())
        n_primary = None if primary is None else len(primary)
        cells = (_test_cell(row.get(f"vs_{control}{suffix}"), chosen, n_primary) for suffix in suffixes)
        rows.append([arm, control, *cells])
    return ("Each arm against its control (built in: its step rewards shuffled within each group)", header, rows)


def _stream_table(stream: Mapping[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """The stream control (:mod:`prorag.experiments.stream_control`): each RL arm's training answer
    EM minus pi_rft's on the same rollout batches, over the second half of the pass (points)."""
    rows = []
    for arm, row in stream["arms"].items():
        overall = (
            f"{100 * row['second_half_diff']:+.1f} ± {100 * row['second_half_ci95']:.1f} (p {row['second_half_p']:.3f})"
            if "second_half_diff" in row
            else ""
        )
        seeds = ", ".join(f"{100 * d['second_half_diff']:+.1f}" for d in row["per_seed"].values())
        rows.append([arm, overall, seeds])
    title = "Does RL learn? Training EM against pi_rft sampled on the same questions (learning rate 0), second half of the pass"
    return (title, ["Arm", "ΔEM (points) ± 95% CI over seeds", "Per seed"], rows)


def process_tables(ablation: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """``(title, header, rows)`` of an arms ablation (process or family): EM/F1 (%) mean ± 95% CI
    over seeds with the paired test against GRPO, the runs' unpaired permutation test (and the test on
    the non-yes/no questions over seeds, where measured), each arm against its control where both
    ran (:data:`prorag.experiments.ablations.CONTROLS` and the config's ``arm_controls``), each RL
    arm against pi_rft on its own question stream (with ``stream_control``), then the
    extra per-seed metrics measured (:data:`ARMS_EXTRAS`), then EM (%) by question type and by hop
    count, and the mean searches by hop count (where the rows record them). Where the ablation names its
    primary contrasts (``primary``), their tests are marked and every other test shows its Holm-adjusted p."""
    stats = ablation["stats"]
    primary = ablation.get("primary")
    n_primary = None if primary is None else len(primary)
    others = any("vs_grpo_non_yes_no_by_seed" in row for row in stats.values())
    unpaired = any("vs_grpo_runs" in row for row in stats.values())
    rows = []
    for arm, row in stats.items():
        test = row.get("vs_grpo")
        rest = row.get("vs_grpo_non_yes_no_by_seed")
        runs = row.get("vs_grpo_runs")
        assignments = ablation["arms"].get(arm, "")
        chosen = contrast_name(arm, "grpo") in (primary or ())
        rows.append(
            [
                arm,
                " ".join(assignments) if isinstance(assignments, list | tuple) else str(assignments),
                str(len(row["per_seed"])),
                _mean_ci(row, "em", True),
                _mean_ci(row, "f1", True),
                _test_cell(test, chosen, n_primary) or "reference",
            ]
            + ([_test_cell(runs, chosen, n_primary) or "reference"] if unpaired else [])
            + ([_test_cell(rest, chosen, n_primary) or "reference"] if others else [])
        )
    header = ["Arm", "RL settings", "Seeds", "EM (%) ± 95% CI", "F1 (%) ± 95% CI", "ΔEM vs GRPO (paired t)"]
    header += ["ΔEM vs GRPO, runs unpaired (permutation)"] if unpaired else []
    header += ["ΔEM on non-yes/no vs GRPO (t over seeds)"] if others else []
    out = [("Test EM and F1 per arm", header, rows)]
    controlled = {arm: row for arm, row in stats.items() if "control" in row}
    if controlled:
        out.append(_controls_table(controlled, primary))
    if "stream" in ablation:
        out.append(_stream_table(ablation["stream"]))
    extras = [k for k in ARMS_EXTRAS if any(k in row for row in stats.values())]
    if extras:
        cells = [[arm, *(_mean_ci(row, k, ARMS_EXTRAS[k][1]) if k in row else "" for k in extras)] for arm, row in stats.items()]
        out.append(
            ("Behaviour and cost per arm (mean ± 95% CI over seeds)", ["Arm", *(ARMS_EXTRAS[k][0] for k in extras)], cells)
        )
    for key, title in (("by_type", "question type"), ("by_hops", "hops")):
        groups = sorted({g for row in stats.values() for g in row.get(key, {})})
        if groups:
            cells = [
                [arm, *(f"{100 * row[key][g]['em']:.1f}" if g in row.get(key, {}) else "" for g in groups)]
                for arm, row in stats.items()
            ]
            out.append((f"Test EM (%) by {title}", ["Arm", *groups], cells))
    searches = {
        arm: {g: v["searches"] for g, v in row.get("by_hops", {}).items() if "searches" in v} for arm, row in stats.items()
    }
    groups = sorted({g for by_hops in searches.values() for g in by_hops})
    if groups:
        cells = [[arm, *(f"{by_hops[g]:.2f}" if g in by_hops else "" for g in groups)] for arm, by_hops in searches.items()]
        out.append(("Searches per test question by hops (a question needs one per hop)", ["Arm", *groups], cells))
    return out


def depth_tables(results: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """``(title, header, rows)`` of how deep each system searched against how deep the questions are
    (:func:`prorag.evaluation.harness.search_depth`; none where no evaluation has hop counts): per
    system, the share answered after fewer searches than hops and, per hop count, EM (%) and mean
    searches, averaged over an RL system's seeds; then RFT's samples per hop count (the share of
    samples right and of the kept trajectories), where RFT counted them. A policy that stops
    searching long chains shows here while its EM on them is near zero either way."""
    out: list[tuple[str, list[str], list[list[str]]]] = []
    systems = []
    for name in results.get("order", []):
        entry = results["systems"][name]
        runs = [m for m in (entry.get("seeds") or {"-": entry["metrics"]}).values() if m.get("by_hops")]
        if runs:
            systems.append((str(entry.get("label") or name), runs))
    hops = sorted({h for _, runs in systems for m in runs for h in m["by_hops"]}, key=int)
    if systems:
        rows = []
        for label, runs in systems:
            cells = [label, f"{100 * fmean(m['searches_below_hops_rate'] for m in runs):.1f}"]
            for h in hops:
                at = [m["by_hops"][h] for m in runs if h in m["by_hops"]]
                cells.append(
                    f"{100 * fmean(v['em'] for v in at):.1f} / {fmean(v['mean_retrieval_steps'] for v in at):.2f}" if at else ""
                )
            rows.append(cells)
        header = [
            "System",
            "Fewer searches than hops (%)",
            *(f"{h} hop{'' if h == '1' else 's'}: EM (%) / searches" for h in hops),
        ]
        out.append(("Search depth by the questions' hop count", header, rows))
    rft = (results.get("stages") or {}).get("rft", {}).get("by_hops") or {}
    if rft:
        kept = sum(c["trajectories_kept"] for c in rft.values()) or 1
        rows = [
            [
                h,
                str(c["questions"]),
                f"{100 * c['correct'] / max(c['samples'], 1):.1f}",
                f"{c['trajectories_kept']} ({100 * c['trajectories_kept'] / kept:.1f}%)",
            ]
            for h, c in rft.items()
        ]
        out.append(("RFT's samples by hop count", ["Hops", "Questions", "Samples right (%)", "Kept trajectories"], rows))
    return out


def info_rows(results: Mapping[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """(wall time per stage, world counts) as text rows."""
    walls = [
        [str(k), format_duration(float(v))] for k, v in (results.get("wall_seconds") or {}).items() if isinstance(v, int | float)
    ]
    world = [[str(k), v if isinstance(v, str) else json.dumps(v)] for k, v in (results.get("world") or {}).items()]
    return walls, world


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(seconds, 60)
    return f"{int(minutes)} min {sec:.0f} s" if minutes < 60 else f"{int(minutes // 60)} h {int(minutes % 60)} min"
