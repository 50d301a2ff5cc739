"""P2S's pure reward (docs/METHOD.md §4): sigmoid step weights and Eq. 8 on hand-computed values,
Eq. 9's three cases, the two step cuts, and the config picked by name with ``--set``."""

from __future__ import annotations

import math

import pytest

from prorag.core.config import apply_overrides
from prorag.method.rewards.p2s import (
    P2SConfig,
    best_gain,
    chunk_ends,
    hierarchical_rewards,
    needs_path_reward,
    path_faithfulness,
    step_ends,
    step_weights,
    tag_ends,
    warmup_rewards,
)


def sig(i: int) -> float:
    return 1 / (1 + math.exp(-i))


def test_weights_increase_and_weigh_the_path_reward() -> None:
    assert step_weights(4) == pytest.approx([0.731059, 0.880797, 0.952574, 0.982014], abs=1e-6)
    # Three steps: r = (-3, -1, -0.5): (0.731*-3 + 0.881*-1 + 0.953*-0.5) / (0.731 + 0.881 + 0.953)
    assert path_faithfulness([-3.0, -1.0, -0.5]) == pytest.approx(
        (-3 * sig(1) - sig(2) - 0.5 * sig(3)) / (sig(1) + sig(2) + sig(3))
    )
    assert path_faithfulness([-3.0, -1.0, -0.5]) == pytest.approx(-3.550261 / 2.564430, abs=1e-5)
    # Later steps weigh more: the same rewards reversed give a lower mean than uniform weights would.
    assert path_faithfulness([-0.5, -1.0, -3.0]) < sum([-0.5, -1.0, -3.0]) / 3 < path_faithfulness([-3.0, -1.0, -0.5])
    # A step without a gold path keeps its index's weight: only step 3 (last) and step 1 count.
    assert path_faithfulness([2.0, None, -1.0]) == pytest.approx((2 * sig(1) - sig(3)) / (sig(1) + sig(3)))
    assert path_faithfulness([-4.0]) == -4.0
    with pytest.raises(ValueError, match="at least one"):
        path_faithfulness([None])


def test_best_gain_is_the_max_over_suffixes() -> None:
    # Suffix 1: -3 - (-4) = 1; suffix 2: -1 - (-0.5) = -0.5.
    assert best_gain([-3.0, -1.0], [-4.0, -0.5]) == 1.0
    assert best_gain([-2.0], [-1.0]) == -1.0
    with pytest.raises(ValueError):
        best_gain([-1.0], [])


def test_hierarchical_integration_cases() -> None:
    fmt = [True, False, True, True, False, True]
    correct = [True, False, False, False, False, False]
    groups = ["a", "a", "a", "b", "b", "c"]
    path = [None, None, None, -2.5, None, 0.75]
    # a: solved -> outcome 1 / 0, malformed -1; b: unsolved -> path reward, malformed -1; c: path.
    assert hierarchical_rewards(fmt, correct, path, groups) == [1.0, -1.0, 0.0, -2.5, -1.0, 0.75]
    assert needs_path_reward(fmt, correct, groups) == [False, False, False, True, False, True]
    assert hierarchical_rewards([False], [False], [None], [0], malformed_reward=-2.0) == [-2.0]
    with pytest.raises(ValueError, match="needs its path reward"):
        hierarchical_rewards([True], [False], [None], [0])
    assert warmup_rewards([True, False], P2SConfig()) == [1.0, -1.0]


def test_step_cuts_tags_and_chunks() -> None:
    assert chunk_ends(10, 3) == [4, 7, 10]
    assert chunk_ends(9, 3) == [3, 6, 9]
    assert chunk_ends(3, 8) == [1, 2, 3] and chunk_ends(0, 4) == []
    assert tag_ends([0, 5, 9, 12], 12) == [5, 9, 12]
    assert tag_ends([2, 5], 8) == [2, 5, 8]  # tokens before the first action are step 1
    assert step_ends("tags", [0, 5], 10, 2) == [5, 10]
    assert step_ends("chunks", [0, 5], 10, 4) == [3, 6, 8, 10]


def test_config_by_name_with_set_overrides() -> None:
    from prorag.stages.rl import RLConfig

    sets = ["outcome_reward.form=p2s", "outcome_reward.p2s.steps=chunks", "outcome_reward.p2s.k=2", "advantage=grpo"]
    cfg = apply_overrides(RLConfig(process_reward="none"), sets)
    assert cfg.outcome_reward.form == "p2s" and cfg.outcome_reward.p2s.steps == "chunks" and cfg.outcome_reward.p2s.k == 2
    assert cfg.outcome_reward.p2s.max_steps == 8 and cfg.outcome_reward.p2s.malformed_reward == -1.0
    with pytest.raises(ValueError, match=r"--set outcome_reward.p2s.steps=words: field 'steps': expected 'tags' or 'chunks'"):
        apply_overrides(RLConfig(), ["outcome_reward.p2s.steps=words"])
    with pytest.raises(ValueError, match=r"P2SConfig.steps must be one of \('tags', 'chunks'\), got 'words'"):
        P2SConfig(steps="words")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="P2SConfig.k must be >= 1"):
        P2SConfig(k=0)
