"""`research/drivers/rl_numerics.py check` at its smallest settings: the single forward repeats bit for
bit, and the other ways of scoring the same batch differ by rounding only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research.tests.drivers import run_driver


@pytest.mark.slow
def test_rl_numerics_check_runs_small_and_writes_its_numbers(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = run_driver("rl_numerics", ["check", "--rows", "8", "--prompt", "20", "--completion", "40", "--out", str(out)])
    assert done.returncode == 0, f"rl_numerics exited {done.returncode}:\n{done.stderr[-3000:]}"
    result = json.loads(out.read_text())
    control, *variants = result["variants"]
    assert control["max_abs_logp_diff"] == 0.0 and control["adam_sign_flips"] == 0, "the single forward is not repeatable"
    assert len(variants) == 2 and result["scored_tokens"] > 0
    for row in variants:  # the same function: rounding only
        assert row["max_abs_logp_diff"] < 1e-4 and row["grad_rel_diff"] < 1e-4, row
