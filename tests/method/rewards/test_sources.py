"""The step-reward sources: ``none`` and ``prm`` are registered (``prm`` by the supervision layer,
on first look-up), a scorer becomes a source with or without a batch size, an unknown name is
a clear error."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from prorag.method.rewards.sources import STEP_REWARD_SOURCES, ScorerSteps, as_step_source


class Bare:
    def score_trajectories(self, trajectories: Sequence[Any]) -> list[list[float]]:
        return [[1.0] for _ in trajectories]


class Batched:
    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def score_trajectories(self, trajectories: Sequence[Any], batch_size: int = 32) -> list[list[float]]:
        self.batch_sizes.append(batch_size)
        return [[2.0] for _ in trajectories]


def test_built_in_sources_and_errors() -> None:
    assert {"none", "prm"} <= set(STEP_REWARD_SOURCES.names())
    assert STEP_REWARD_SOURCES.get("none")(SimpleNamespace()) is None
    with pytest.raises(ValueError, match="needs a PRM"):
        STEP_REWARD_SOURCES.get("prm")(SimpleNamespace(prm=None, prm_batch_size=4))
    with pytest.raises(ValueError, match=r"unknown step reward source 'pmr'.*did you mean 'prm'"):
        STEP_REWARD_SOURCES.get("pmr")


def test_a_scorer_becomes_a_source() -> None:
    batched = Batched()
    assert as_step_source(batched, 4)(["t1", "t2"], None) == [[2.0], [2.0]] and batched.batch_sizes == [4]
    assert isinstance(as_step_source(Bare()), ScorerSteps) and as_step_source(Bare())(["t"]) == [[1.0]]

    def source(trajectories: Sequence[Any], records: Sequence[Any] | None = None) -> list[list[float]]:
        return [[0.0]]

    assert as_step_source(source) is source
    with pytest.raises(TypeError):
        as_step_source(3)
