"""The step-reward sources: ``none`` and ``prm`` are registered (``prm`` by the supervision layer,
when its module is imported, as the RL stage does), a scorer becomes a source with or without a
batch size, an unknown name is a clear error."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

import prorag.supervision.step_rewards  # noqa: F401  (registers prm, oracle, shuffled and the first-error sources)
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
    assert {"none", "prm", "oracle", "oracle-first-error", "shuffled", "oracle-first-error-shuffled", "prm-first-error"} <= set(
        STEP_REWARD_SOURCES.names()
    )
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


def _chain_trajectory(actions: int = 5) -> Any:
    """The judge tests' chain trajectory (valid search and conclusion, redundant search,
    unsupported conclusion, guessed answer) with ``actions`` stand-ins for its token-level actions."""
    from tests.supervision.test_judge import chain_trajectory_text

    return SimpleNamespace(text=chain_trajectory_text(), actions=[None] * actions)


def test_oracle_source_gives_the_judges_verdict_on_every_step() -> None:
    from prorag.data.records import Record
    from tests.supervision.test_judge import CHAIN

    oracle = STEP_REWARD_SOURCES.get("oracle")(SimpleNamespace())
    # Valid search and conclusion; a redundant search, an unsupported conclusion, a guessed answer.
    assert oracle([_chain_trajectory()], [CHAIN]) == [[1.0, 1.0, -1.0, -1.0, -1.0]]
    # Token-level actions that do not match the text's: undecided, 0 on each.
    assert oracle([_chain_trajectory(actions=4)], [CHAIN], group_ids=[0]) == [[0.0] * 4]
    with pytest.raises(ValueError, match="needs the record"):
        oracle([_chain_trajectory()], None)
    with pytest.raises(ValueError, match="record 'r1' has no gold decomposition"):
        oracle([_chain_trajectory()], [Record("r1", "q?", ["a"], {})])


def test_oracle_first_error_labels_up_to_the_first_wrong_step() -> None:
    from prorag.supervision.step_rewards import up_to_first_error
    from tests.supervision.test_judge import CHAIN

    source = STEP_REWARD_SOURCES.get("oracle-first-error")(SimpleNamespace())
    # The chain trajectory's verdicts are +1 +1 -1 -1 -1: the redundant search (step 3) is the
    # first error; the unsupported conclusion and the guessed answer after it get no step reward.
    (scores,) = source([_chain_trajectory()], [CHAIN])
    assert scores[:3] == [1.0, 1.0, -1.0] and all(math.isnan(x) for x in scores[3:])
    assert up_to_first_error([1.0, 1.0]) == [1.0, 1.0]
    first = up_to_first_error([-1.0, 1.0, -1.0])
    assert first[0] == -1.0 and math.isnan(first[1]) and math.isnan(first[2])
    assert up_to_first_error([0.0, -1.0, 1.0])[:2] == [0.0, -1.0], "undecided (0) is not an error"
    # undecided trajectories stay undecided
    assert source([_chain_trajectory(actions=4)], [CHAIN]) == [[0.0] * 4]


def test_prm_first_error_cuts_the_learned_prms_scores_at_its_first_logit_below_zero() -> None:
    """PRM logits 2.0, 0.5, -0.3, 1.2, -2.0: the first below 0 (step 3) keeps its logit, the two
    after it get no step reward; a trajectory the PRM never scores below 0 keeps every logit, and
    one whose first step is below 0 keeps that step only. Without a PRM the factory says so."""
    from prorag.supervision.step_rewards import FirstErrorSteps, up_to_first_error

    logits = [[2.0, 0.5, -0.3, 1.2, -2.0], [0.1, 0.0, 3.0], [-1.5, 4.0]]
    seen: list[Any] = []

    def prm(trajectories: Sequence[Any], records: Any = None, group_ids: Any = None) -> list[list[float]]:
        seen.append((len(trajectories), records, group_ids))
        return [list(row) for row in logits]

    cut = FirstErrorSteps(prm)(["t"] * 3, None, group_ids=[0, 0, 1])
    assert seen == [(3, None, [0, 0, 1])]  # the inner source gets the call's arguments
    assert _comparable(cut) == [[2.0, 0.5, -0.3, "nan", "nan"], [0.1, 0.0, 3.0], [-1.5, "nan"]]
    assert _comparable([up_to_first_error([0.4, 0.2, 0.9], threshold=0.5)]) == [[0.4, "nan", "nan"]]
    for name in ("prm-first-error", "prm-first-error-shuffled"):
        with pytest.raises(ValueError, match=f"'{name}' needs a PRM"):
            STEP_REWARD_SOURCES.get(name)(SimpleNamespace(prm=None, prm_batch_size=4, seed=0))


def test_shuffled_source_permutes_scores_within_groups_only() -> None:
    from prorag.method.rewards.sources import ShuffledSteps

    scores = [[1.0, 2.0, 3.0], [4.0], [5.0, 6.0], [10.0, 20.0], [30.0]]
    groups = [7, 7, 7, 8, 8]

    def inner(trajectories: Sequence[Any], records: Sequence[Any] | None = None) -> list[list[float]]:
        return [list(s) for s in scores]

    source = ShuffledSteps(inner, seed=3)
    first = source(["t"] * 5, None, group_ids=groups)
    assert [len(r) for r in first] == [3, 1, 2, 2, 1]  # every trajectory keeps its number of actions
    assert sorted(x for r in first[:3] for x in r) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # group 7's values, permuted
    assert sorted(x for r in first[3:] for x in r) == [10.0, 20.0, 30.0]
    second = source(["t"] * 5, None, group_ids=groups)
    assert first != scores and second != first  # each batch its own permutation
    assert ShuffledSteps(inner, seed=3)(["t"] * 5, None, group_ids=groups) == first  # same seed, same permutations
    with pytest.raises(ValueError, match="group_ids"):
        source(["t"] * 5, None)
    with pytest.raises(ValueError, match="'shuffled' needs a PRM"):
        STEP_REWARD_SOURCES.get("shuffled")(SimpleNamespace(prm=None, prm_batch_size=4, seed=0))


def _comparable(scores: Sequence[Sequence[float]]) -> list[list[object]]:
    """``scores`` with NaN written as the string ``"nan"``, so that lists compare equal (NaN != NaN)."""
    return [["nan" if math.isnan(x) else x for x in row] for row in scores]


def test_shuffled_oracle_permutes_the_first_error_verdicts_within_groups() -> None:
    """The oracle's control: the group's pooled verdicts (NaN after a first error counted as a
    value) are dealt back to its steps at random; lengths and the multiset stay, the order goes."""
    from prorag.method.rewards.sources import shuffle_within_groups
    from tests.supervision.test_judge import CHAIN

    trajectories = [_chain_trajectory(), _chain_trajectory(), _chain_trajectory(actions=4)]
    records, groups = [CHAIN] * 3, [0, 0, 1]
    plain = STEP_REWARD_SOURCES.get("oracle-first-error")(SimpleNamespace())(trajectories, records)
    control = STEP_REWARD_SOURCES.get("oracle-first-error-shuffled")(SimpleNamespace(seed=5))

    first = _comparable(control(trajectories, records, group_ids=groups))
    assert [len(r) for r in first] == [5, 5, 4]
    # group 0 pools +1 +1 -1 nan nan twice: four +1, two -1, four NaN, in some order
    assert sorted(str(x) for r in first[:2] for x in r) == sorted(["1.0"] * 4 + ["-1.0"] * 2 + ["nan"] * 4)
    assert first[:2] != _comparable(plain[:2]), "the order goes"
    assert first[2] == [0.0] * 4  # an undecided trajectory alone in its group keeps its zeros
    # the permutation is the seeded stream's, batch by batch
    for call, scores in enumerate([first, _comparable(control(trajectories, records, group_ids=groups))]):
        rng = random.Random(f"prorag-shuffled-steps/5/{call}")
        assert scores == _comparable(shuffle_within_groups(plain, groups, rng))
    with pytest.raises(ValueError, match="group_ids"):
        control(trajectories, records)
