"""``report.md``: the tables, what each number means, and links to the plots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prorag.experiments.report import table
from prorag.experiments.report.plots import Plot
from prorag.experiments.report.results import reference_system
from prorag.experiments.report.table import TableRow


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_md(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(results: Mapping[str, Any], rows: Sequence[TableRow], plots: Sequence[Plot]) -> str:
    """``report.md``: the tables, what each number means, and links to the plots."""
    reference = reference_system(results)
    out = [
        "# ProRAG run report",
        "",
        "Test-set results of every system of this run (the paper's Table 2 on this data). "
        "Scores are in percent; with several seeds a cell reads mean ± std over seeds.",
        "",
        *(f"- **{name}**: {what}" for name, what in table.METRIC_DESCRIPTIONS.items()),
        "",
        *_md_table(table.table_header(), [table.table_cells(r, reference) for r in rows]),
        "",
    ]
    for key, title, col in (("beta_sweep", "Beta sweep (Table 3)", "beta"), ("topk", "Documents per search (Figure 5)", "top-k")):
        if results.get(key):
            out += [f"## {title}", "", *_md_table(*table.sweep_table(table.sweep_rows(results[key]), col)), ""]
    for key, (section, plot) in table.ARMS_SECTIONS.items():
        if results.get(key):
            out += [f"## {section}", "", table.arms_note(plot, results[key].get("primary")), ""]
            for title, header, cells in table.process_tables(results[key]):
                out += [f"{title}:", "", *_md_table(header, cells), ""]
    steps_rows = []
    for name in results["order"]:
        for d in results["systems"][name]["metrics"].get("retrieval_steps_distribution") or []:
            steps_rows.append(
                [
                    str(results["systems"][name].get("label") or name),
                    str(d["steps"]),
                    str(d["count"]),
                    f"{100 * d['coverage']:.1f}",
                    f"{100 * d['f1']:.1f}",
                    f"{100 * d['cumulative_f1']:.1f}",
                ]
            )
    if steps_rows:
        header = ["System", "Retrieval steps", "Questions", "Coverage (%)", "F1 (%)", "Cumulative F1 (%)"]
        out += ["## F1 by number of retrieval steps (Figure 6)", "", *_md_table(header, steps_rows), ""]
    depth = table.depth_tables(results)
    if depth:
        out += ["## Search depth by hop count", ""]
        for title, header, cells in depth:
            out += [f"{title}:", "", *_md_table(header, cells), ""]
    if plots:
        out += ["## Plots", ""]
        out += [f"![{_md(p.caption)}](plots/{p.name})  \n{p.caption}\n" for p in plots]
    walls, world = table.info_rows(results)
    if walls:
        out += ["## Wall time per stage", "", *_md_table(["Stage", "Wall time"], walls), ""]
    if world:
        out += ["## Data", "", *_md_table(["Item", "Count"], world), ""]
    out += ["Trajectories, with the PRM score of every step, are in `report.html` (open it in a browser; it works offline).", ""]
    return "\n".join(out)
