"""HiPRAG's step judgements and its outcome reward ``"hiprag"`` (docs/METHOD.md §3).

The pure part (steps, formula, rates) is :mod:`prorag.method.rewards.hiprag`; this module decides
which steps are over- or under-search:

* **Over-search**: the policy is re-asked a search step's sub-query with no documents
  (:func:`reask`: one action through the rollout engine, greedy, every sub-query of the batch in
  one batched call, no retriever). On a record with a gold decomposition (the built-in world,
  MuSiQue) the oracle decides: the re-asked answer must match the gold sub-answer of the hop the
  sub-query targets (:func:`~prorag.supervision.judge.targets`). Otherwise, or when the
  sub-query targets no hop, the re-asked answer must equal the step's own conclusion after
  normalisation (the paper's "equivalent to the step's conclusion", decided by string match).
  A re-ask that searches or writes nothing answers nothing: not over-search.
* **Under-search**: a non-search step whose conclusion is wrong: on a record with a gold
  decomposition, a conclusion that is no hop's gold sub-answer and not the final answer. Without
  a decomposition it is undecided (counted as not under-search; an LLM judge would decide it).

``"hiprag"`` in :data:`~prorag.method.rewards.outcome.OUTCOME_REWARDS` is HiPRAG's reward used
in place of Eq. 6 (with ``advantage: grpo`` and ``process_reward: none``: no step term).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prorag.agent.rollout import RolloutConfig, RolloutEngine, Trajectory
from prorag.agent.schema import ActionKind, parse_trajectory
from prorag.core.metrics import cover_exact_match, exact_match, normalize_answer
from prorag.data.records import Record
from prorag.method.rewards.hiprag import ReasoningStep, SearchCounts, hiprag_value, reasoning_steps, search_counts
from prorag.method.rewards.outcome import (
    OUTCOME_REWARDS,
    OutcomeRewardConfig,
    completion_text,
    trajectory_answer,
    trajectory_format_valid,
)
from prorag.retrieval.base import Hit
from prorag.supervision.judge import GoldHop, oracle_hops, targets

#: The re-ask: one greedy action, short (a sub-answer is a few words), many sub-queries per batch.
REASK_ROLLOUT = RolloutConfig(max_actions=1, max_action_tokens=64, greedy=True, batch_size=64)


class NoDocuments:
    """A retriever that finds nothing: the re-ask runs with no documents (one action never searches)."""

    def search(self, queries: Sequence[str], k: int = 3, partitions: Sequence[str | None] | None = None) -> list[list[Hit]]:
        return [[] for _ in queries]


def reask(policy: Any, tokenizer: Any, queries: Sequence[str], config: RolloutConfig = REASK_ROLLOUT) -> dict[str, str | None]:
    """The policy's answer to each distinct sub-query asked as a question with no documents: the
    content of its one action when that is a well-formed answer or conclusion, else ``None``."""
    distinct = list(dict.fromkeys(q for q in queries if q))
    if not distinct:
        return {}
    engine = RolloutEngine(policy, tokenizer, NoDocuments(), config)
    records = [Record(f"reask-{i}", q, []) for i, q in enumerate(distinct)]
    trajs = engine.rollout(records, max_actions=[1] * len(records))
    return {q: first_answer(t) for q, t in zip(distinct, trajs, strict=True)}


def search_queries(text: str) -> list[str]:
    """The sub-queries of a trajectory's search steps (its text with tags), as :func:`step_labels` looks them up."""
    return [s.query for s in reasoning_steps(parse_trajectory(text).actions) if s.search]


def first_answer(traj: Trajectory) -> str | None:
    """What a one-action re-ask answered: its answer or sub-answer, ``None`` if it searched or failed."""
    actions = parse_trajectory(traj.text).actions
    if not actions or not actions[0].well_formed or actions[0].kind not in (ActionKind.ANSWER, ActionKind.CONCLUDE):
        return None
    return actions[0].content or None


def over_searched(step: ReasoningStep, hops: Sequence[GoldHop], answer: str | None) -> bool:
    """Whether a search step was unnecessary: the re-asked ``answer`` is right (module docstring)."""
    if not step.search or not answer:
        return False
    hop = next((h for h in hops if targets(step.query, h)), None)
    if hop is not None:
        return bool(exact_match(answer, [hop.answer]))
    said = normalize_answer(step.conclusion)
    return bool(said) and said == normalize_answer(answer)


def under_searched(step: ReasoningStep, record: Record | None, hops: Sequence[GoldHop]) -> bool:
    """Whether a non-search step concluded wrongly: no hop's gold sub-answer nor the final answer
    (decided only with a gold decomposition; otherwise ``False``)."""
    if step.search or record is None or not hops:
        return False
    return not exact_match(step.conclusion, [h.answer for h in hops] + list(record.golden_answers))


def step_labels(
    record: Record | None, steps: Sequence[ReasoningStep], answers: Mapping[str, str | None] | None
) -> tuple[list[bool], list[bool], list[bool]]:
    """Per step: searched, over-search (``False`` everywhere when ``answers`` is ``None``: no
    re-ask), under-search."""
    hops = oracle_hops(record) if record is not None and record.metadata.get("decomposition") else []
    over = [over_searched(s, hops, answers.get(s.query)) if answers is not None else False for s in steps]
    return [s.search for s in steps], over, [under_searched(s, record, hops) for s in steps]


def trajectory_search_counts(record: Record, text: str, answers: Mapping[str, str | None] | None = None) -> SearchCounts:
    """The search-step counts of one trajectory (its text with tags): over-search counted only
    when the re-asked ``answers`` (sub-query -> answer, :func:`reask`) are given."""
    return search_counts(*step_labels(record, reasoning_steps(parse_trajectory(text).actions), answers))


@OUTCOME_REWARDS.register("hiprag")  # the class is the factory: HiPRAGReward(config)
class HiPRAGReward:
    """HiPRAG's reward as an :class:`~prorag.method.rewards.outcome.OutcomeReward`: ``A`` is cover
    EM of the answer, ``F`` I_traj (the config's grammar); the batch's search steps are re-asked
    with ``policy`` in one call (without a policy, no step is over-search)."""

    def __init__(self, config: OutcomeRewardConfig, reask_config: RolloutConfig = REASK_ROLLOUT) -> None:
        self.config = config
        self.reask_config = reask_config
        self.last_ratios: dict[str, tuple[float, float]] = {}
        """The last batch's over- and under-search rates as (count, steps) sums, which the RL
        trainer logs (``over_search_rate``: over-searched / search steps; ``under_search_rate``:
        under-searched / non-search steps): HiPRAG's own signal, beside its scalar reward."""

    def __call__(
        self,
        trajectories: Sequence[Trajectory],
        golds: Sequence[Sequence[str]],
        tokenizer: Any,
        records: Sequence[Record] | None = None,
        policy: Any = None,
        retriever: Any = None,
    ) -> list[float]:
        if len(trajectories) != len(golds):
            raise ValueError(f"{len(trajectories)} trajectories but {len(golds)} gold answer lists")
        steps = [reasoning_steps(parse_trajectory(completion_text(t, tokenizer)).actions) for t in trajectories]
        queries = [s.query for ss in steps for s in ss if s.search]
        answers = reask(policy, tokenizer, queries, self.reask_config) if policy is not None else {}
        recs: Sequence[Record | None] = records if records is not None else [None] * len(trajectories)
        out, counts = [], SearchCounts()
        for traj, gold, record, ss in zip(trajectories, golds, recs, steps, strict=True):
            searched, over, under = step_labels(record, ss, answers)
            counts += search_counts(searched, over, under)
            optimal = [not (o or u) for o, u in zip(over, under, strict=True)]
            answer = trajectory_answer(traj, tokenizer)
            correct = answer is not None and bool(cover_exact_match(answer, list(gold)))
            valid = trajectory_format_valid(traj, tokenizer, strict=self.config.strict)
            out.append(hiprag_value(correct, valid, searched, optimal, self.config.hiprag))
        self.last_ratios = {
            "over_search_rate": (float(counts.over), float(counts.search)),
            "under_search_rate": (float(counts.under), float(counts.non_search)),
        }
        return out


__all__ = [
    "REASK_ROLLOUT",
    "HiPRAGReward",
    "NoDocuments",
    "first_answer",
    "over_searched",
    "reask",
    "search_queries",
    "step_labels",
    "trajectory_search_counts",
    "under_searched",
]
