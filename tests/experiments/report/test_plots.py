"""The plots: the ones the run's data supports, as PNG files."""

from __future__ import annotations

from pathlib import Path


def test_plots_exist_and_missing_parts_are_left_out(run_dir: Path) -> None:
    names = sorted(p.name for p in (run_dir / "plots").iterdir())
    assert names == ["beta.png", "learning_curves.png", "results.png", "retrieval_steps.png"]  # no top-k sweep in this run
    for name in names:
        assert (run_dir / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
