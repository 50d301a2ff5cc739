"""The report a person reads after a pipeline run: ``report.md``, ``report.html`` and ``plots/``.

Input: a pipeline run folder (DESIGN.md contract 5): ``results.json`` names every evaluated
system (its metrics, its evaluation folder, per-seed metrics and a paired t-test against full
ProRAG when there are any), the RL learning curves, and the optional beta and top-k sweeps.
Output, in the same folder:

* ``plots/*.png``: the paper's figures on this run: EM and F1 per system (Table 2), outcome reward
  per RL step (Figure 4), EM and F1 against beta (Table 3) and against top-k (Figure 5), and F1 by
  number of retrieval steps with data coverage (Figure 6);
* ``report.md``: the tables, with the plots linked;
* ``report.html``: one self-contained page (inline CSS and JS, plots as base64 data URIs, no
  network) with the same tables and plots and a trajectory viewer: each test question with its
  steps in order, the PRM score of each step as a number and as a colour, the documents each
  search retrieved, the gold answers, the prediction and its EM/F1.

Choices a reader should know:

* **Every number is named by its metric.** EM is normalised exact match (SQuAD normalisation,
  :func:`prorag.core.metrics.exact_match`), never a containment metric; rates and scores are shown in
  percent (as in the paper), retrieval steps as a mean count.
* **Model output is untrusted.** Every piece of text that reaches the HTML goes through
  :func:`html.escape`; the page has no external references, so it also opens offline.
* **Steps come from the schema's parser.** The viewer cuts a completion into actions with
  :func:`prorag.agent.schema.parse_trajectory`, the parser every stage uses, and pairs the i-th action
  with the i-th PRM logit of ``step_scores.jsonl`` (the PRM scores the token-level actions, which
  the same state machine cuts identically).
* **Optional parts are optional.** No curves, no sweeps, no step scores, no trajectories, one
  system only: the matching section says so instead of failing.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from prorag.agent.rollout import Trajectory
from prorag.agent.schema import parse_trajectory
from prorag.core.errors import DataError
from prorag.core.metrics import mean_and_spread
from prorag.data.jsonl import atomic_writer, read_json, read_jsonl, read_jsonl_numbered, write_jsonl
from prorag.supervision.reward_model import StepScorer

log = logging.getLogger(__name__)

#: What each number of the results table means (shown in both reports, next to the table).
METRIC_DESCRIPTIONS: Mapping[str, str] = {
    "EM": "normalised exact match (%): the prediction equals a gold answer after lower-casing and removing "
    "punctuation, articles and extra spaces",
    "F1": "token F1 (%) between the normalised prediction and the best-matching gold answer",
    "Format-valid": "share of trajectories (%) that follow the ProRAG grammar and end in exactly one answer (I_traj)",
    "Retrieval steps": "mean number of searches per question",
    "p": "two-sided paired t-test p-value of the per-question scores against full ProRAG (metric named in the cell)",
}

#: Metrics of the results table: (column name, key in metrics.json, shown in percent).
TABLE_METRICS: tuple[tuple[str, str, bool], ...] = (
    ("EM", "em", True),
    ("F1", "f1", True),
    ("Format-valid", "format_valid_rate", True),
    ("Retrieval steps", "mean_retrieval_steps", False),
)


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


# ----------------------------------------------------------------------------- the run folder


def load_results(run_dir: Path) -> dict[str, Any]:
    """``RUN/results.json``, checked for the fields the report needs (``systems`` and ``order``)."""
    path = Path(run_dir) / "results.json"
    results = read_json(path)
    if not isinstance(results, dict):
        raise DataError(str(path), f"expected a JSON object, got {type(results).__name__}")
    systems = results.get("systems")
    if not isinstance(systems, dict):
        raise DataError(str(path), "field 'systems' must be an object {NAME: {label, eval_dir, metrics, ...}}")
    order = results.get("order") or list(systems)
    unknown = [name for name in order if name not in systems]
    if unknown:
        raise DataError(str(path), f"field 'order' names systems not in 'systems': {', '.join(unknown)}")
    for name in order:
        if not isinstance(systems[name].get("metrics"), dict):
            raise DataError(str(path), f"systems.{name}.metrics must be an object (the system's metrics.json)")
    return results | {"order": list(order)}


def reference_system(results: Mapping[str, Any]) -> str | None:
    """The full ProRAG system, which the p-values compare against and the viewer shows first.

    ``results["reference"]`` when the pipeline names it; else a system called ``prorag``; else
    the first system whose label starts with "ProRAG"; else the first system of the table.
    """
    systems, order = results["systems"], results["order"]
    if results.get("reference") in systems:
        return str(results["reference"])
    if "prorag" in systems:
        return "prorag"
    for name in order:
        if str(systems[name].get("label", "")).lower().startswith("prorag"):
            return name
    return order[0] if order else None


def eval_dir_of(run_dir: Path, system: Mapping[str, Any]) -> Path | None:
    """The evaluation folder of a system (relative paths are relative to the run folder)."""
    where = system.get("eval_dir")
    return None if not where else Path(run_dir) / where


# ----------------------------------------------------------------------------- step scores


def score_eval_trajectories(scorer: StepScorer, eval_dir: Path, batch_size: int = 32) -> Path:
    """Score every action of ``eval_dir/trajectories.jsonl`` with the PRM; write ``step_scores.jsonl``.

    One row per trajectory, ``{"id": question id, "logits": [one float per action]}``, in the
    order of the trajectories file, written atomically (a crash leaves no partial file that the
    report would take for a finished one). ``batch_size`` trajectories go to the scorer at a
    time: any :class:`~prorag.supervision.reward_model.StepScorer` works (its ``score_trajectories`` takes
    the trajectories only), and the progress bar moves per batch.
    """
    eval_dir = Path(eval_dir)
    source = eval_dir / "trajectories.jsonl"
    trajectories = []
    for lineno, row in _numbered(source):
        try:
            trajectories.append(Trajectory.from_dict(row))
        except (KeyError, TypeError) as e:
            raise DataError(f"{source}:{lineno}", f"not a trajectory ({e})") from None
    rows: list[dict[str, Any]] = []
    for start in tqdm(range(0, len(trajectories), batch_size), desc=f"PRM scores {eval_dir.name}", unit="batch"):
        batch = trajectories[start : start + batch_size]
        logits = scorer.score_trajectories(batch)
        if len(logits) != len(batch):
            raise ValueError(f"the scorer returned {len(logits)} score lists for {len(batch)} trajectories")
        for traj, row in zip(batch, logits, strict=True):
            if len(row) != len(traj.actions):
                raise ValueError(f"the scorer returned {len(row)} logits for the {len(traj.actions)} actions of {traj.id}")
            rows.append({"id": traj.id, "logits": [float(x) for x in row]})
    out = eval_dir / "step_scores.jsonl"
    write_jsonl(out, rows)
    return out


def _numbered(path: Path) -> list[tuple[int, dict[str, Any]]]:
    return list(read_jsonl_numbered(path, tolerate_truncated_tail=True))


# ----------------------------------------------------------------------------- the results table


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

    The spread is the sample standard deviation over seeds (:func:`prorag.core.metrics.mean_and_spread`),
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


# ----------------------------------------------------------------------------- learning curves


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


# ----------------------------------------------------------------------------- the trajectory viewer


@dataclass(frozen=True)
class ViewerStep:
    """One action of a trajectory as the viewer shows it."""

    kind: str
    """search | conclude | answer | malformed (an action with no action tag)."""
    thought: str
    content: str
    """The sub-query, sub-answer or answer."""
    well_formed: bool
    errors: tuple[str, ...]
    logit: float | None
    """The PRM's logit of this step, ``None`` when the system was not scored."""
    documents: tuple[str, ...] = ()
    """The retrieved documents after a search, one per entry (``Doc i(Title: t) text``)."""
    doc_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuestionView:
    """One test question of one system: the prediction, its scores and the trajectory's steps."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    prediction: str | None
    em: float | None
    f1: float | None
    format_valid: bool | None
    stop_reason: str | None
    steps: tuple[ViewerStep, ...] = ()
    prior_doc_ids: tuple[str, ...] = ()
    """Documents retrieved before generation (standard RAG puts them in the prompt)."""


_DOC_START = re.compile(r"(?m)^(?=Doc \d+\(Title: )")


def split_documents(retrieval: str | None) -> tuple[str, ...]:
    """A retrieval block's documents, one per entry (they start ``Doc i(Title: …)`` on a new line,
    the layout of :func:`prorag.retrieval.base.format_documents`)."""
    if not retrieval:
        return ()
    return tuple(part.strip() for part in _DOC_START.split(retrieval) if part.strip())


def trajectory_steps(traj: Trajectory, logits: Sequence[float] | None = None) -> list[ViewerStep]:
    """The steps of a trajectory, parsed from its text by :func:`prorag.agent.schema.parse_trajectory`.

    The i-th parsed action gets the i-th PRM logit (both parsers cut a completion into the same
    actions); if the counts differ (a text decoded lossily) the extra actions show no score rather
    than a wrong one. A search's document ids come from ``traj.retrievals`` (matched by action index).
    """
    parsed = parse_trajectory(traj.text)
    ids_of = {int(r.get("action", -1)): tuple(str(d) for d in r.get("doc_ids") or ()) for r in traj.retrievals}
    scores = list(logits or [])
    if logits is not None and len(scores) != len(parsed.actions):
        log.warning("%s: %d PRM scores for %d parsed actions", traj.id, len(scores), len(parsed.actions))
    steps = []
    for i, action in enumerate(parsed.actions):
        steps.append(
            ViewerStep(
                kind=action.kind.value if action.kind else "malformed",
                thought=action.thought,
                content=action.content,
                well_formed=action.well_formed,
                errors=action.errors,
                logit=float(scores[i]) if i < len(scores) and len(scores) == len(parsed.actions) else None,
                documents=split_documents(action.retrieval),
                doc_ids=ids_of.get(i, ()),
            )
        )
    return steps


def load_questions(eval_dir: Path, limit: int | None = None) -> list[QuestionView]:
    """The viewer's questions of one system: predictions joined with trajectories and step scores.

    ``predictions.jsonl`` sets the questions and their order; ``trajectories.jsonl`` and
    ``step_scores.jsonl`` are optional (a question without a trajectory shows its prediction only).
    """
    eval_dir = Path(eval_dir)
    pred_path = eval_dir / "predictions.jsonl"
    if not pred_path.is_file():
        return []
    predictions = list(read_jsonl(pred_path, tolerate_truncated_tail=True))[:limit]
    wanted = {str(p.get("id")) for p in predictions}
    trajectories: dict[str, Trajectory] = {}
    traj_path = eval_dir / "trajectories.jsonl"
    if traj_path.is_file():
        for lineno, row in _numbered(traj_path):
            if str(row.get("id")) in wanted:
                try:
                    trajectories[str(row["id"])] = Trajectory.from_dict(row)
                except (KeyError, TypeError) as e:
                    raise DataError(f"{traj_path}:{lineno}", f"not a trajectory ({e})") from None
    scores: dict[str, list[float]] = {}
    score_path = eval_dir / "step_scores.jsonl"
    if score_path.is_file():
        scores = {
            str(r["id"]): [float(x) for x in r.get("logits", [])] for r in read_jsonl(score_path, tolerate_truncated_tail=True)
        }
    out = []
    for p in predictions:
        qid = str(p.get("id"))
        traj = trajectories.get(qid)
        out.append(
            QuestionView(
                id=qid,
                question=str(p.get("question", traj.question if traj else "")),
                golden_answers=tuple(str(g) for g in p.get("golden_answers") or ()),
                prediction=None if p.get("prediction") is None else str(p["prediction"]),
                em=p.get("em"),
                f1=p.get("f1"),
                format_valid=p.get("format_valid"),
                stop_reason=p.get("stop_reason", traj.stop_reason if traj else None),
                steps=tuple(trajectory_steps(traj, scores.get(qid))) if traj else (),
                prior_doc_ids=tuple(
                    d for r in (traj.retrievals if traj else []) if r.get("action", -1) < 0 for d in r["doc_ids"]
                ),
            )
        )
    return out


def sigmoid(x: float) -> float:
    """The logistic function, safe for any float (no overflow for large |x|)."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def score_colour(logit: float) -> str:
    """A step's colour: red (sigmoid 0) through yellow (0.5) to green (1), as an HSL hue."""
    return f"hsl({120.0 * sigmoid(logit):.0f}, 75%, 82%)"


# ----------------------------------------------------------------------------- plots


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
    groups: Mapping[str, Sequence[Sequence[tuple[float, float]]]], labels: Mapping[str, str], dpi: int
) -> bytes | None:
    """Figure 4: outcome reward per RL optimiser step, one line per system: the mean over its
    seeds, as a trailing mean over :data:`CURVE_WINDOW` steps, in a band from the lowest to the
    highest seed (each also smoothed)."""
    bands = {name: seed_band(runs) for name, runs in groups.items()}
    bands = {name: band for name, band in bands.items() if band}
    if not bands:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for name, band in bands.items():
        steps = [b[0] for b in band]
        mean, lo, hi = (moving_average([b[j] for b in band], CURVE_WINDOW) for j in (1, 2, 3))
        n = len(groups[name])
        (line,) = ax.plot(steps, mean, label=f"{labels.get(name, name)} ({n} seed{'s' if n > 1 else ''})")
        if n > 1:
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean outcome reward (Eq. 6)")
    ax.set_title(f"Learning curves (trailing mean over {CURVE_WINDOW} steps; band: seed range)")
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


# ----------------------------------------------------------------------------- markdown


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_md(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return lines


def _sweep_table(rows: Sequence[tuple[float, Cell, Cell]], name: str) -> tuple[list[str], list[list[str]]]:
    return [name, "EM", "F1"], [[f"{x:g}", format_cell(em, True), format_cell(f1, True)] for x, em, f1 in rows]


def _info_rows(results: Mapping[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """(wall time per stage, world counts) as text rows."""
    walls = [[str(k), _duration(float(v))] for k, v in (results.get("wall_seconds") or {}).items() if isinstance(v, int | float)]
    world = [[str(k), v if isinstance(v, str) else json.dumps(v)] for k, v in (results.get("world") or {}).items()]
    return walls, world


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(seconds, 60)
    return f"{int(minutes)} min {sec:.0f} s" if minutes < 60 else f"{int(minutes // 60)} h {int(minutes % 60)} min"


def render_markdown(results: Mapping[str, Any], rows: Sequence[TableRow], plots: Sequence[Plot]) -> str:
    """``report.md``: the tables, what each number means, and links to the plots."""
    reference = reference_system(results)
    out = [
        "# ProRAG run report",
        "",
        "Test-set results of every system of this run (the paper's Table 2 on this data). "
        "Scores are in percent; with several seeds a cell reads mean ± std over seeds.",
        "",
        *(f"- **{name}**: {what}" for name, what in METRIC_DESCRIPTIONS.items()),
        "",
        *_md_table(table_header(), [table_cells(r, reference) for r in rows]),
        "",
    ]
    for key, title, col in (("beta_sweep", "Beta sweep (Table 3)", "beta"), ("topk", "Documents per search (Figure 5)", "top-k")):
        if results.get(key):
            out += [f"## {title}", "", *_md_table(*_sweep_table(sweep_rows(results[key]), col)), ""]
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
    if plots:
        out += ["## Plots", ""]
        out += [f"![{_md(p.caption)}](plots/{p.name})  \n{p.caption}\n" for p in plots]
    walls, world = _info_rows(results)
    if walls:
        out += ["## Wall time per stage", "", *_md_table(["Stage", "Wall time"], walls), ""]
    if world:
        out += ["## Data", "", *_md_table(["Item", "Count"], world), ""]
    out += ["Trajectories, with the PRM score of every step, are in `report.html` (open it in a browser; it works offline).", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- HTML

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
h1,h2{border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}
th{background:#f3f3f3}
figure{margin:1em 0}
figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.9em;color:#555}
dl.metrics dt{font-weight:bold;float:left;clear:left;width:9em}
dl.metrics dd{margin-left:10em}
.question{border:1px solid #ccc;border-radius:6px;margin:.5em 0;padding:.3em .7em}
.question>summary{cursor:pointer}
.tag{display:inline-block;border-radius:4px;padding:0 .4em;font-size:.85em;margin-left:.4em}
.ok{background:#cdeccd}.bad{background:#f6d0d0}
ol.steps{padding-left:0;list-style:none}
li.step{border-left:6px solid #bbb;margin:.4em 0;padding:.3em .6em;background:#fafafa}
li.step .kind{font-weight:bold;text-transform:uppercase;font-size:.8em}
.step-score{float:right;font-family:monospace;padding:0 .4em;border-radius:4px}
.thought{color:#555;font-style:italic}
.errors{color:#a00;font-size:.85em}
.docs ol{font-size:.9em}
.answers{margin:.4em 0}
.legend span{display:inline-block;padding:0 .5em;border-radius:4px}
"""

_JS = """
function showSystem(name){
  document.querySelectorAll('.viewer').forEach(function(v){v.hidden = v.dataset.system !== name;});
}
document.addEventListener('DOMContentLoaded', function(){
  var s = document.getElementById('system-select');
  if (s) { s.addEventListener('change', function(){ showSystem(s.value); }); showSystem(s.value); }
});
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], css: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{_e(css)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * float(x):.1f}"


def render_step(step: ViewerStep, index: int) -> str:
    """One step: kind, PRM score (number and colour), thought, content, and a search's documents."""
    if step.logit is None:
        score, colour = '<span class="step-score">PRM: not scored</span>', "#bbb"
    else:
        colour = score_colour(step.logit)
        score = (
            f'<span class="step-score" style="background:{colour}" title="PRM logit; sigmoid = '
            f'{sigmoid(step.logit):.3f}">PRM {step.logit:+.2f} (σ {sigmoid(step.logit):.2f})</span>'
        )
    label = {"search": "sub-query", "conclude": "sub-answer", "answer": "answer"}.get(step.kind, "content")
    parts = [
        f'<li class="step step-{_e(step.kind)}" style="border-left-color:{colour}">',
        score,
        f'<span class="kind">{index}. {_e(step.kind)}</span>',
        "" if step.well_formed else '<span class="tag bad">malformed</span>',
        f'<div class="thought">thought: {_e(step.thought) or "–"}</div>',
        f'<div class="content"><b>{label}:</b> {_e(step.content) or "–"}</div>',
    ]
    if step.errors:
        parts.append(f'<div class="errors">{_e("; ".join(step.errors))}</div>')
    if step.documents or step.doc_ids:
        docs = "".join(f"<li>{_e(d)}</li>" for d in step.documents)
        ids = f" ({_e(', '.join(step.doc_ids))})" if step.doc_ids else ""
        n = len(step.documents) or len(step.doc_ids)
        parts.append(f'<details class="docs"><summary>{n} retrieved documents{ids}</summary><ol>{docs}</ol></details>')
    parts.append("</li>")
    return "".join(parts)


def render_question(q: QuestionView) -> str:
    """One question as a collapsible block: summary line (question, EM, F1), then details."""
    em_tag = "" if q.em is None else f'<span class="tag {"ok" if q.em else "bad"}">EM {_pct(q.em)}</span>'
    f1_tag = "" if q.f1 is None else f'<span class="tag">F1 {_pct(q.f1)}</span>'
    steps = "".join(render_step(s, i) for i, s in enumerate(q.steps, start=1))
    prior = (
        f'<div class="docs">documents retrieved before generation: {_e(", ".join(q.prior_doc_ids))}</div>'
        if q.prior_doc_ids
        else ""
    )
    valid = "" if q.format_valid is None else ("valid format" if q.format_valid else "invalid format")
    return (
        f'<details class="question" data-id="{_e(q.id)}"><summary><b>{_e(q.id)}</b> {_e(q.question)}{em_tag}{f1_tag}</summary>'
        f'<div class="answers"><b>gold:</b> {_e(" | ".join(q.golden_answers)) or "–"}'
        f' &nbsp; <b>prediction:</b> <span class="prediction">{_e(q.prediction) if q.prediction is not None else "(no answer)"}</span>'
        f" &nbsp; <b>EM:</b> {_pct(q.em)} &nbsp; <b>F1:</b> {_pct(q.f1)}"
        f" &nbsp; <small>{_e(valid)}; stopped by {_e(q.stop_reason or '?')}</small></div>"
        f"{prior}"
        + (f'<ol class="steps">{steps}</ol>' if steps else "<p>No trajectory recorded for this question.</p>")
        + "</details>"
    )


def render_viewer(viewers: Mapping[str, list[QuestionView]], labels: Mapping[str, str], first: str | None) -> str:
    """The trajectory viewer: a system selector and one block of questions per system."""
    if not viewers:
        return "<p>No evaluation folder with predictions was found, so there are no trajectories to show.</p>"
    first = first if first in viewers else next(iter(viewers))
    options = "".join(
        f'<option value="{_e(n)}"{" selected" if n == first else ""}>{_e(labels.get(n, n))}</option>' for n in viewers
    )
    blocks = []
    for name, questions in viewers.items():
        items = "".join(render_question(q) for q in questions) or "<p>No predictions.</p>"
        hidden = "" if name == first else " hidden"
        blocks.append(f'<div class="viewer" data-system="{_e(name)}"{hidden}><h3>{_e(labels.get(name, name))}</h3>{items}</div>')
    legend = "".join(
        f'<span style="background:{score_colour(x)}">σ={sigmoid(x):.2f}</span> ' for x in (-4.0, -1.0, 0.0, 1.0, 4.0)
    )
    return (
        "<p>Click a question to see its trajectory. Each step shows the PRM's logit for it and the sigmoid of that "
        "logit (the PRM's probability that the step is a good one); the colour runs from red (σ near 0) to green "
        f'(σ near 1): <span class="legend">{legend}</span>. Click "retrieved documents" under a search to see what it found.</p>'
        f'<label>System: <select id="system-select">{options}</select></label>' + "".join(blocks)
    )


def render_html(
    results: Mapping[str, Any],
    rows: Sequence[TableRow],
    plots: Sequence[Plot],
    viewers: Mapping[str, list[QuestionView]],
    first: str | None,
) -> str:
    """``report.html``: one self-contained page (inline CSS/JS, plots as data URIs)."""
    reference = reference_system(results)
    labels = {name: str(s.get("label") or name) for name, s in results["systems"].items()}
    meanings = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in METRIC_DESCRIPTIONS.items())
    body = [
        "<h1>ProRAG run report</h1>",
        "<p>Test-set results of every system of this run (the paper's Table 2 on this data). Scores are in percent; "
        "with several seeds a cell reads mean ± standard deviation over seeds. The p column tests each system's "
        "per-question scores against full ProRAG.</p>",
        f'<dl class="metrics">{meanings}</dl>',
        "<h2>Results</h2>",
        _html_table(table_header(), [table_cells(r, reference) for r in rows], "results"),
    ]
    for key, title, col in (("beta_sweep", "Beta sweep (Table 3)", "beta"), ("topk", "Documents per search (Figure 5)", "top-k")):
        if results.get(key):
            body += [f"<h2>{_e(title)}</h2>", _html_table(*_sweep_table(sweep_rows(results[key]), col))]
    if plots:
        body.append("<h2>Plots</h2>")
        for p in plots:
            data = base64.b64encode(p.png).decode("ascii")
            body.append(
                f'<figure><img alt="{_e(p.caption)}" src="data:image/png;base64,{data}"><figcaption>{_e(p.caption)}</figcaption></figure>'
            )
    walls, world = _info_rows(results)
    if walls:
        body += ["<h2>Wall time per stage</h2>", _html_table(["Stage", "Wall time"], walls)]
    if world:
        body += ["<h2>Data</h2>", _html_table(["Item", "Count"], world)]
    body += ["<h2>Trajectories</h2>", render_viewer(viewers, labels, first)]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>ProRAG run report</title><style>{_CSS}</style><script>{_JS}</script></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


# ----------------------------------------------------------------------------- the report


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


__all__ = [
    "METRIC_DESCRIPTIONS",
    "QuestionView",
    "ReportConfig",
    "ViewerStep",
    "TableRow",
    "curves_by_system",
    "load_questions",
    "load_results",
    "moving_average",
    "reference_system",
    "results_table",
    "score_colour",
    "score_eval_trajectories",
    "seed_band",
    "sigmoid",
    "trajectory_steps",
    "write_report",
]
