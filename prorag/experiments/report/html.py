"""``report.html``: one self-contained page (inline CSS and JS, plots as base64 data URIs, no
network) with the tables, the plots and the trajectory viewer.

**Model output is untrusted.** Every piece of text that reaches the page goes through
:func:`html.escape`; the page has no external references, so it also opens offline. The CSS
and JS are module constants (not package data files), so the page needs nothing installed
beside this module.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from typing import Any

from prorag.experiments.report.plots import Plot
from prorag.experiments.report.results import reference_system
from prorag.experiments.report.table import (
    ARMS_SECTIONS,
    METRIC_DESCRIPTIONS,
    TableRow,
    arms_note,
    depth_tables,
    info_rows,
    process_tables,
    sweep_rows,
    sweep_table,
    table_cells,
    table_header,
)
from prorag.experiments.report.viewer import QuestionView, ViewerStep, score_colour, sigmoid

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
            body += [f"<h2>{_e(title)}</h2>", _html_table(*sweep_table(sweep_rows(results[key]), col))]
    for key, (section, plot) in ARMS_SECTIONS.items():
        if results.get(key):
            body += [f"<h2>{_e(section)}</h2>", f"<p>{_e(arms_note(plot, results[key].get('primary')))}</p>"]
            for title, header, cells in process_tables(results[key]):
                body += [f"<h3>{_e(title)}</h3>", _html_table(header, cells)]
    depth = depth_tables(results)
    if depth:
        body.append("<h2>Search depth by hop count</h2>")
        for title, header, cells in depth:
            body += [f"<h3>{_e(title)}</h3>", _html_table(header, cells)]
    if plots:
        body.append("<h2>Plots</h2>")
        for p in plots:
            data = base64.b64encode(p.png).decode("ascii")
            body.append(
                f'<figure><img alt="{_e(p.caption)}" src="data:image/png;base64,{data}"><figcaption>{_e(p.caption)}</figcaption></figure>'
            )
    walls, world = info_rows(results)
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
