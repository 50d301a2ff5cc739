"""The whole report: a minimal run without optional parts, and ``prorag report``."""

from __future__ import annotations

import shutil
from pathlib import Path

from prorag.data.jsonl import write_json
from prorag.experiments.report.build import ReportConfig, write_report
from tests.experiments.report.hand_run import md_row


def test_minimal_run_without_optional_parts(tmp_path: Path) -> None:
    metrics = {"em": 0.5, "f1": 0.625, "format_valid_rate": 0.75, "mean_retrieval_steps": 1.5, "n": 4}
    write_json(tmp_path / "results.json", {"systems": {"only": {"label": "Only", "metrics": metrics}}, "order": ["only"]})
    md_path, html_path = write_report(tmp_path, ReportConfig(viewer_limit=5))
    assert md_row(md_path.read_text(), "Only")[1:5] == ["50.0", "62.5", "75.0", "1.50"]
    assert "no trajectories to show" in html_path.read_text()
    assert [p.name for p in (tmp_path / "plots").iterdir()] == ["results.png"]


def test_report_cli(run_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prorag.cli import app

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "report.md").unlink()
    result = CliRunner().invoke(app, ["report", "--run-dir", str(copy)])
    assert result.exit_code == 0, result.output
    assert (copy / "report.md").read_text() == (run_dir / "report.md").read_text()
    assert CliRunner().invoke(app, ["report", "--run-dir", str(tmp_path / "nowhere")]).exit_code == 2
