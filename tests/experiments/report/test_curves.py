"""Learning curves: grouped by system, averaged over seeds, smoothed."""

from __future__ import annotations

import pytest

from prorag.experiments.report.curves import curves_by_system, moving_average, seed_band


def test_learning_curves_average_seeds_and_smooth() -> None:
    curves = {
        "grpo-seed0": [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)],
        "grpo-seed1": [(1.0, 3.0), (2.0, 0.0)],  # cut short: the band stops at step 2
        "prorag-seed0": [(1.0, 5.0)],
        "extra": [(1.0, 7.0)],
    }
    named = {"grpo": ["grpo-seed0", "grpo-seed1"], "prorag": ["prorag-seed0", "prorag-seed1"], "rl-from-sft": ["x"]}
    groups = curves_by_system(curves, named)
    assert list(groups) == ["grpo", "prorag", "extra"]
    assert [len(v) for v in groups.values()] == [2, 1, 1]
    assert seed_band(groups["grpo"]) == [(1.0, 2.0, 1.0, 3.0), (2.0, 1.0, 0.0, 2.0)]
    assert seed_band([]) == []
    # trailing mean over 2: 1, (1+3)/2, (3+5)/2, (5+7)/2
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([1.0, 3.0], 5) == [1.0, 2.0]
    with pytest.raises(ValueError, match="window"):
        moving_average([1.0], 0)
