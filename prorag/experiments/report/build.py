"""Writing the whole report of a run folder: ``report.md``, ``report.html`` and ``plots/``.

**Optional parts are optional.** No curves, no sweeps, no step scores, no trajectories, one
system only: the matching section says so instead of failing. Every file is replaced
atomically, so the report can be rebuilt at any time (e.g. after adding step scores).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from prorag.data.jsonl import atomic_writer
from prorag.experiments.report.html import render_html
from prorag.experiments.report.markdown import render_markdown
from prorag.experiments.report.plots import make_plots
from prorag.experiments.report.results import eval_dir_of, load_results, reference_system
from prorag.experiments.report.table import (
    results_table,
)
from prorag.experiments.report.viewer import QuestionView, load_questions

log = logging.getLogger(__name__)


@dataclass
class ReportConfig:
    """Settings of the report (every field has a default; ``prorag report`` uses them)."""

    viewer_limit: int = 100
    """Questions per system in the trajectory viewer (the first ones of predictions.jsonl); the
    page stays small enough to open quickly with seven systems and retrieved documents inline."""
    viewer_system: str | None = None
    """The system the viewer shows first; by default full ProRAG (:func:`reference_system`)."""
    dpi: int = 110
    """Resolution of the PNG plots."""


def write_report(run_dir: Path, config: ReportConfig | None = None) -> tuple[Path, Path]:
    """Write ``report.md``, ``report.html`` and ``plots/*.png`` into ``run_dir``; return the two reports.

    Reads ``run_dir/results.json`` and, for the viewer, each system's ``predictions.jsonl``,
    ``trajectories.jsonl`` and ``step_scores.jsonl`` when they exist. Safe to run again at any
    time (every file is replaced atomically), e.g. after adding step scores.
    """
    cfg = config or ReportConfig()
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    rows = results_table(results)
    plots = make_plots(run_dir, results, rows, cfg.dpi)
    viewers: dict[str, list[QuestionView]] = {}
    for name in results["order"]:
        where = eval_dir_of(run_dir, results["systems"][name])
        if where is not None and (where / "predictions.jsonl").is_file():
            viewers[name] = load_questions(where, cfg.viewer_limit)
    first = cfg.viewer_system or reference_system(results)
    md_path, html_path = run_dir / "report.md", run_dir / "report.html"
    with atomic_writer(md_path) as f:
        f.write(render_markdown(results, rows, plots))
    with atomic_writer(html_path) as f:
        f.write(render_html(results, rows, plots, viewers, first))
    log.info("wrote %s and %s (%d plots)", md_path, html_path, len(plots))
    return md_path, html_path
