"""``report.md``: the table holds the measured numbers, each named by its metric."""

from __future__ import annotations

import json
from pathlib import Path

from tests.experiments.report.hand_run import md_row


def test_markdown_table_holds_the_measured_numbers(run_dir: Path) -> None:
    md = (run_dir / "report.md").read_text()
    full = json.loads((run_dir / "eval" / "prorag" / "metrics.json").read_text())
    row = md_row(md, "ProRAG (full)")
    assert row[1:5] == [
        f"{100 * full['em']:.1f}",
        f"{100 * full['f1']:.1f}",
        f"{100 * full['format_valid_rate']:.1f}",
        f"{full['mean_retrieval_steps']:.2f}",
    ]
    assert row[-1] == "reference"
    # Two seeds with EM 0.2 and 0.4: mean 30.0, sample std 14.1 (hand-computed).
    grpo = md_row(md, "GRPO baseline")
    assert grpo[1] == "30.0 ± 14.1" and grpo[5] == "2"
    assert grpo[-1] == "p=0.041 (EM, n=6)", "a p-value names the metric it tested"
    assert md_row(md, "Naive generation")[1:3] == ["12.5", "25.0"]
    assert "normalised exact match" in md and "containment" not in md.lower()
    assert "| 0.3 | 50.0 | 60.0 |" in md and "| 0 | 30.0 ± 5.0 | 40.0 ± 2.0 |" in md  # beta sweep
    assert "| rl | 2 min 5 s |" in md and "| passages | 42 |" in md
    dist = full["retrieval_steps_distribution"][0]
    assert f"| ProRAG (full) | {dist['steps']} | {dist['count']} | {100 * dist['coverage']:.1f} |" in md
