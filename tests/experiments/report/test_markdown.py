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
    # The oracle's step validity (this tiny run's policy may write no judged step: an empty cell).
    for cell, key in zip(row[5:7], ("valid_search_rate", "valid_subanswer_rate"), strict=True):
        assert cell == ("–" if full[key] is None else f"{100 * full[key]:.1f}")
    assert row[-1] == "reference"
    # Two seeds with EM 0.2 and 0.4: mean 30.0, sample std 14.1 (hand-computed).
    grpo = md_row(md, "GRPO baseline")
    assert grpo[1] == "30.0 ± 14.1" and grpo[7] == "2"
    assert grpo[-1] == "p=0.041 (EM, n=6)", "a p-value names the metric it tested"
    assert md_row(md, "Naive generation")[1:3] == ["12.5", "25.0"]
    assert "normalised exact match" in md and "containment" not in md.lower()
    assert "| 0.3 | 50.0 | 60.0 |" in md and "| 0 | 30.0 ± 5.0 | 40.0 ± 2.0 |" in md  # beta sweep
    assert "| rl | 2 min 5 s |" in md and "| passages | 42 |" in md
    dist = full["retrieval_steps_distribution"][0]
    assert f"| ProRAG (full) | {dist['steps']} | {dist['count']} | {100 * dist['coverage']:.1f} |" in md


def test_search_depth_tables(run_dir: Path) -> None:
    md = (run_dir / "report.md").read_text()
    full = json.loads((run_dir / "eval" / "prorag" / "metrics.json").read_text())
    assert "## Search depth by hop count" in md
    hops = sorted(full["by_hops"], key=int)
    header = next(ln for ln in md.splitlines() if ln.startswith("| System | Fewer searches than hops (%) |"))
    assert header.count(": EM (%) / searches") == len(hops) and ("1 hop:" in header) == ("1" in hops)
    row = next(
        r for r in md.split("Search depth by the questions' hop count")[1].splitlines() if r.startswith("| ProRAG (full) |")
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == f"{100 * full['searches_below_hops_rate']:.1f}"
    first = full["by_hops"][hops[0]]
    assert f"{100 * first['em']:.1f} / {first['mean_retrieval_steps']:.2f}" in cells[2:]
    # RFT's counts: 3 of the 4 kept trajectories have one hop; 6 of 8 samples right
    assert "| 1 | 2 | 75.0 | 3 (75.0%) |" in md and "| 2 | 2 | 12.5 | 1 (25.0%) |" in md


def test_search_depth_averages_the_seeds_by_hand() -> None:
    from prorag.experiments.report.table import depth_tables

    def m(em: float, steps: float, below: float) -> dict[str, object]:
        return {"by_hops": {"2": {"n": 2, "em": em, "f1": em, "mean_retrieval_steps": steps}}, "searches_below_hops_rate": below}

    results = {
        "order": ["naive", "grpo"],
        "systems": {
            "naive": {"label": "Naive", "metrics": {"em": 0.1}},  # no hop counts: not listed
            "grpo": {"label": "GRPO", "metrics": m(0.75, 2.0, 0.25), "seeds": {"0": m(0.5, 1.5, 0.5), "1": m(1.0, 2.5, 0.0)}},
        },
    }
    [(title, header, rows)] = depth_tables(results)
    assert header == ["System", "Fewer searches than hops (%)", "2 hops: EM (%) / searches"]
    assert rows == [["GRPO", "25.0", "75.0 / 2.00"]]
    assert depth_tables({"order": ["naive"], "systems": {"naive": results["systems"]["naive"]}}) == []
