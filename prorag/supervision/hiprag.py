"""HiPRAG's step judgements and its outcome reward ``"hiprag"`` (docs/METHOD.md §3).

The pure part (steps, formula, rates) is :mod:`prorag.method.rewards.hiprag`; this module decides
which steps are over- or under-search:

* **Over-search**: the policy is re-asked a search step's sub-query with no documents (:func:`reask`).
  The re-asked answer must match the gold sub-answer of the hop the sub-query targets, on a record
  with a gold decomposition (the oracle); otherwise the step's own conclusion (the paper's
  "equivalent to the step's conclusion"). "Match" is decided by a judge
  (:mod:`prorag.supervision.equivalence`: exact match after normalisation, or an LLM).
* **Under-search**: a non-search step whose conclusion is wrong (:func:`under_searched`).

``"hiprag"`` in :data:`~prorag.method.rewards.outcome.OUTCOME_REWARDS` is HiPRAG's reward used
in place of Eq. 6 (with ``advantage: grpo`` and ``process_reward: none``: no step term).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.schema import ActionKind, parse_trajectory
from prorag.agent.trajectory import Trajectory
from prorag.core.metrics import cover_exact_match, exact_match, normalize_answer
from prorag.data.records import Record
from prorag.method.rewards.hiprag import (
    HiPRAGRewardConfig,
    ReasoningStep,
    SearchCounts,
    hiprag_value,
    reasoning_steps,
    search_counts,
)
from prorag.method.rewards.outcome import (
    OUTCOME_REWARDS,
    OutcomeRewardConfig,
    RewardInputs,
    completion_text,
    trajectory_answer,
    trajectory_format_valid,
)
from prorag.retrieval.base import Hit
from prorag.supervision.equivalence import ORACLE, Equivalence, EquivalenceJudge, equivalence_judge
from prorag.supervision.judge import GoldHop, oracle_hops, targets

#: The re-ask: one greedy action, short (a sub-answer is a few words), many sub-queries per batch.
REASK_ROLLOUT = RolloutConfig(max_actions=1, max_action_tokens=64, greedy=True, batch_size=64)


class NoDocuments:
    """A retriever that finds nothing: the re-ask runs with no documents (one action never searches)."""

    def search(self, queries: Sequence[str], k: int = 3, partitions: Sequence[str | None] | None = None) -> list[list[Hit]]:
        return [[] for _ in queries]


def reask(policy: Any, tokenizer: Any, queries: Sequence[str], config: RolloutConfig = REASK_ROLLOUT) -> dict[str, str | None]:
    """The policy's answer to each distinct sub-query asked as a question with no documents: the
    content of its one action when that is a well-formed answer or conclusion, else ``None``.

    One action through the rollout engine, greedy (``REASK_ROLLOUT``), every sub-query of the batch
    in one batched call, no retriever."""
    distinct = list(dict.fromkeys(q for q in queries if q))
    if not distinct:
        return {}
    from prorag.agent.rollout import RolloutEngine  # the engine imports torch: not at import (--help)

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


def over_search_question(step: ReasoningStep, hops: Sequence[GoldHop], answer: str | None) -> Equivalence | None:
    """What a judge must decide for the step to be over-search (module docstring): the re-asked
    ``answer`` against the gold sub-answer of the hop the sub-query targets, else the step's
    conclusion; ``None`` when nothing is to decide (not a search, no answer, no reference). A
    re-ask that searched or wrote nothing answers nothing: the step is not over-search. The gold
    hop is found by :func:`~prorag.supervision.judge.targets`, on records with a decomposition
    (the built-in world, MuSiQue)."""
    if not step.search or not answer:
        return None
    hop = next((h for h in hops if targets(step.query, h)), None)
    reference = hop.answer if hop is not None else step.conclusion
    return Equivalence(step.query, answer, reference) if normalize_answer(reference) else None


def over_searched(step: ReasoningStep, hops: Sequence[GoldHop], answer: str | None, judge: EquivalenceJudge = ORACLE) -> bool:
    """Whether a search step was unnecessary: the re-asked ``answer`` is right (module docstring)."""
    question = over_search_question(step, hops, answer)
    return question is not None and judge([question])[0]


def record_hops(record: Record | None) -> list[GoldHop]:
    """The oracle's hops of a record with a gold decomposition, else none."""
    return oracle_hops(record) if record is not None and record.metadata.get("decomposition") else []


def over_search_flags(
    records: Sequence[Record | None],
    steps: Sequence[Sequence[ReasoningStep]],
    answers: Mapping[str, str | None],
    judge: EquivalenceJudge = ORACLE,
) -> list[list[bool]]:
    """Per trajectory, per step: over-search, every question of the batch put to ``judge`` in one
    call (one request round for an LLM judge, not one per trajectory)."""
    questions = [
        [over_search_question(s, hops, answers.get(s.query)) for s in ss]
        for ss, hops in zip(steps, [record_hops(r) for r in records], strict=True)
    ]
    asked = list(dict.fromkeys(q for qs in questions for q in qs if q is not None))
    verdicts = dict(zip(asked, judge(asked), strict=True)) if asked else {}
    return [[q is not None and verdicts[q] for q in qs] for qs in questions]


def under_searched(step: ReasoningStep, record: Record | None, hops: Sequence[GoldHop]) -> bool:
    """Whether a non-search step concluded wrongly: no hop's gold sub-answer nor the final answer
    (decided only with a gold decomposition; otherwise undecided, counted as ``False``: an LLM
    judge would decide it)."""
    if step.search or record is None or not hops:
        return False
    return not exact_match(step.conclusion, [h.answer for h in hops] + list(record.golden_answers))


def step_labels(
    record: Record | None, steps: Sequence[ReasoningStep], over: Sequence[bool] | None
) -> tuple[list[bool], list[bool], list[bool]]:
    """Per step: searched, over-search (``over`` from :func:`over_search_flags`; ``False``
    everywhere when ``None``: no re-ask), under-search."""
    hops = record_hops(record)
    over_flags = list(over) if over is not None else [False] * len(steps)
    return [s.search for s in steps], over_flags, [under_searched(s, record, hops) for s in steps]


def batch_search_counts(
    records: Sequence[Record],
    texts: Sequence[str],
    answers: Mapping[str, str | None] | None = None,
    judge: EquivalenceJudge = ORACLE,
) -> list[SearchCounts]:
    """The search-step counts of trajectories (their texts with tags): over-search counted only
    when the re-asked ``answers`` (sub-query -> answer, :func:`reask`) are given, decided by
    ``judge`` in one call for the batch."""
    steps = [reasoning_steps(parse_trajectory(t).actions) for t in texts]
    over: Sequence[Sequence[bool] | None] = (
        over_search_flags(records, steps, answers, judge) if answers is not None else [None] * len(steps)
    )
    return [search_counts(*step_labels(r, ss, o)) for r, ss, o in zip(records, steps, over, strict=True)]


def trajectory_search_counts(
    record: Record, text: str, answers: Mapping[str, str | None] | None = None, judge: EquivalenceJudge = ORACLE
) -> SearchCounts:
    """:func:`batch_search_counts` of one trajectory."""
    return batch_search_counts([record], [text], answers, judge)[0]


@OUTCOME_REWARDS.register(  # the class is the factory: HiPRAGReward(config)
    "hiprag",
    config=HiPRAGRewardConfig,
    help="HiPRAG's `A (1 - lambda_f) + lambda_f F + lambda_p A F N_opt / N`, its over-search judged by re-asking "
    "the policy (`hiprag.judge`: `oracle` or `llm`)",
)
class HiPRAGReward:
    """HiPRAG's reward as an :class:`~prorag.method.rewards.outcome.OutcomeReward`: ``A`` is cover
    EM of the answer, ``F`` I_traj (the config's grammar); the batch's search steps are re-asked
    with ``policy`` in one call (without a policy, no step is over-search) and judged in one call
    by ``config.hiprag``'s judge."""

    def __init__(self, config: OutcomeRewardConfig, reask_config: RolloutConfig = REASK_ROLLOUT) -> None:
        self.config = config
        self.reask_config = reask_config
        self.judge = equivalence_judge(config.hiprag)
        self.last_ratios: dict[str, tuple[float, float]] = {}
        """The last batch's over- and under-search rates as (count, steps) sums, which the RL
        trainer logs (``over_search_rate``: over-searched / search steps; ``under_search_rate``:
        under-searched / non-search steps): HiPRAG's own signal, beside its scalar reward."""

    def __call__(self, batch: RewardInputs) -> list[float]:
        trajectories, golds, tokenizer, records, policy = (
            batch.trajectories,
            batch.golds,
            batch.tokenizer,
            batch.records,
            batch.policy,
        )
        steps = [reasoning_steps(parse_trajectory(completion_text(t, tokenizer)).actions) for t in trajectories]
        queries = [s.query for ss in steps for s in ss if s.search]
        answers = reask(policy, tokenizer, queries, self.reask_config) if policy is not None else {}
        recs: Sequence[Record | None] = records if records is not None else [None] * len(trajectories)
        flags = over_search_flags(recs, steps, answers, self.judge)
        out, counts = [], SearchCounts()
        for traj, gold, record, ss, over_flags in zip(trajectories, golds, recs, steps, flags, strict=True):
            searched, over, under = step_labels(record, ss, over_flags)
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
    "batch_search_counts",
    "first_answer",
    "over_search_flags",
    "over_search_question",
    "over_searched",
    "reask",
    "record_hops",
    "search_queries",
    "step_labels",
    "trajectory_search_counts",
    "under_searched",
]
