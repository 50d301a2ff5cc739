"""The paper's figures on one run, as PNG bytes written to ``RUN/plots/``: EM and F1 per system
(Table 2), outcome reward per RL step (Figure 4), EM and F1 against beta (Table 3) and top-k
(Figure 5), F1 and data coverage by number of retrieval steps (Figure 6). Matplotlib
``Figure`` objects without pyplot (no global state, no GUI backend); a plot whose data is
missing is left out.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prorag.data.jsonl import atomic_writer
from prorag.experiments.report.curves import curves_by_system, learning_curves, moving_average, read_curve, seed_band
from prorag.experiments.report.table import (
    ARMS_SECTIONS,
    Cell,
    TableRow,
    sweep_rows,
)


def _png(fig: Any, dpi: int) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def _figure(width: float = 6.4, height: float = 3.8) -> Any:
    # Figure without pyplot: no global state, no GUI backend (Agg renders the PNG).
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def plot_results(rows: Sequence[TableRow], dpi: int) -> bytes | None:
    """Table 2 as bars: EM and F1 (%) per system, with the spread over seeds as error bars."""
    if not rows:
        return None
    fig = _figure(max(6.4, 1.1 * len(rows) + 2), 3.8)
    ax = fig.add_subplot()
    width = 0.38
    for j, col in enumerate(("EM", "F1")):
        means = [100 * (r.cells[col].mean or 0.0) for r in rows]
        errs = [100 * (r.cells[col].spread or 0.0) for r in rows]
        xs = [i + (j - 0.5) * width for i in range(len(rows))]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=f"{col} (%)")
    ax.set_xticks(range(len(rows)), [r.label for r in rows], rotation=20, ha="right")
    ax.set_ylabel("score (%)")
    ax.set_title("Test EM (normalised exact match) and F1 per system")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _png(fig, dpi)


#: Steps of the trailing mean drawn over the learning curves.
CURVE_WINDOW = 5


def plot_learning_curves(
    groups: Mapping[str, Sequence[Sequence[tuple[float, float]]]],
    labels: Mapping[str, str],
    dpi: int,
    ylabel: str = "mean outcome reward (Eq. 6)",
    window: int = CURVE_WINDOW,
) -> bytes | None:
    """Figure 4: outcome reward (or ``ylabel``'s quantity) per RL optimiser step, one line per
    system: the mean over its seeds, as a trailing mean over ``window`` points, in a band from the
    lowest to the highest seed (each also smoothed)."""
    bands = {name: seed_band(runs) for name, runs in groups.items()}
    bands = {name: band for name, band in bands.items() if band}
    if not bands:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for name, band in bands.items():
        steps = [b[0] for b in band]
        mean, lo, hi = (moving_average([b[j] for b in band], window) for j in (1, 2, 3))
        n = len(groups[name])
        (line,) = ax.plot(steps, mean, label=f"{labels.get(name, name)} ({n} seed{'s' if n > 1 else ''})")
        if n > 1:
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("RL step")
    ax.set_ylabel(ylabel)
    smoothing = f"trailing mean over {window} points; " if window > 1 else ""
    ax.set_title(f"Learning curves ({smoothing}band: seed range)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig, dpi)


def plot_sweep(rows: Sequence[tuple[float, Cell, Cell]], xlabel: str, title: str, dpi: int) -> bytes | None:
    """EM and F1 (%) against a swept setting (beta, top-k), with the spread over seeds."""
    if not rows:
        return None
    fig = _figure(5.6, 3.6)
    ax = fig.add_subplot()
    xs = [r[0] for r in rows]
    for j, name in ((1, "EM"), (2, "F1")):
        ys = [100 * (r[j].mean if r[j].mean is not None else math.nan) for r in rows]
        errs = [100 * (r[j].spread or 0.0) for r in rows]
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=f"{name} (%)")
    ax.set_xticks(xs)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("score (%)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return _png(fig, dpi)


def plot_steps(distributions: Mapping[str, Sequence[Mapping[str, Any]]], labels: Mapping[str, str], dpi: int) -> bytes | None:
    """Figure 6, one panel per system: bars of data coverage (share of questions answered within
    s retrieval steps) and lines of F1 at exactly s steps and cumulative F1 (within s steps)."""
    panels = {name: dist for name, dist in distributions.items() if dist}
    if not panels:
        return None
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig = _figure(4.2 * cols, 3.2 * nrows)
    for k, (name, dist) in enumerate(panels.items()):
        ax = fig.add_subplot(nrows, cols, k + 1)
        steps = [int(d["steps"]) for d in dist]
        ax.bar(steps, [100 * float(d["coverage"]) for d in dist], color="#c9d7ea", label="coverage (%)")
        ax.plot(steps, [100 * float(d["f1"]) for d in dist], "o-", color="#d6604d", label="F1 at s steps (%)")
        ax.plot(steps, [100 * float(d["cumulative_f1"]) for d in dist], "s--", color="#2166ac", label="cumulative F1 (%)")
        ax.set_xticks(steps)
        ax.set_ylim(0, 105)
        ax.set_xlabel("retrieval steps s")
        ax.set_title(labels.get(name, name), fontsize=10)
        if k == 0:
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("F1 and data coverage by number of retrieval steps")
    return _png(fig, dpi)


@dataclass
class Plot:
    """A written plot: file name under ``plots/``, caption, PNG bytes (embedded in the HTML)."""

    name: str
    caption: str
    png: bytes


def make_plots(run_dir: Path, results: Mapping[str, Any], rows: Sequence[TableRow], dpi: int) -> list[Plot]:
    """Every plot this run's data supports, written to ``RUN/plots/`` (atomically)."""
    labels = {name: str(s.get("label") or name) for name, s in results["systems"].items()}
    candidates = [
        ("results.png", "EM and F1 per system (Table 2); error bars: std over seeds.", plot_results(rows, dpi)),
        (
            "learning_curves.png",
            "Mean outcome reward per RL step (Figure 4), averaged over seeds.",
            plot_learning_curves(
                curves_by_system(learning_curves(run_dir, results), results.get("curve_groups") or {}), labels, dpi
            ),
        ),
        *(
            (
                plot,
                f"Held-out (dev) EM per RL step of each arm of the {key.split('_')[0]} ablation; band: seed range.",
                plot_learning_curves(
                    {
                        arm: [read_curve(Path(run_dir) / c, "eval_em") for c in curves]
                        for arm, curves in ((results.get(key) or {}).get("curves") or {}).items()
                    },
                    {},
                    dpi,
                    ylabel="dev EM (greedy)",
                    window=1,
                ),
            )
            for key, (_, plot) in ARMS_SECTIONS.items()
        ),
        (
            "beta.png",
            "EM and F1 against beta, the weight of the process advantage (Table 3).",
            plot_sweep(sweep_rows(results.get("beta_sweep") or {}), "beta", "Process-advantage weight beta", dpi),
        ),
        (
            "topk.png",
            "EM and F1 against the number of documents per search (Figure 5).",
            plot_sweep(sweep_rows(results.get("topk") or {}), "documents per search (top-k)", "Retrieved documents", dpi),
        ),
        (
            "retrieval_steps.png",
            "Data coverage (bars) and F1 (lines) by number of retrieval steps (Figure 6).",
            plot_steps(
                {n: results["systems"][n]["metrics"].get("retrieval_steps_distribution") or [] for n in results["order"]},
                labels,
                dpi,
            ),
        ),
    ]
    plots = [Plot(name, caption, png) for name, caption, png in candidates if png is not None]
    for plot in plots:
        with atomic_writer(Path(run_dir) / "plots" / plot.name, "wb") as f:
            f.write(plot.png)
    return plots
