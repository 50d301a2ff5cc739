"""HiPRAG's hierarchical reward and step classification, the pure part (docs/METHOD.md §3).

A trajectory's reasoning is cut into *steps*: a **search step** is a search action, its retrieval
and the conclusion right after it (if the next action is one); a **non-search step** is a
conclusion with no search before it (the model's own knowledge). The final answer is not a step:
HiPRAG scores it through ``A``. A search step is *over-search* when the policy answers its
sub-query correctly with no documents; a non-search step is *under-search* when its conclusion is
wrong. Deciding those needs a model or a judge (:mod:`prorag.supervision.hiprag`; the judge's
settings are :class:`OverSearchJudgeConfig`); this module holds what does not: the cut into steps,
the reward formula (:func:`hiprag_value`) and the two rates (:class:`SearchCounts`).

    R = A * (1 - lambda_f) + lambda_f * F + lambda_p * A * F * N_opt / N
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prorag.agent.schema import Action, ActionKind
from prorag.core.config import setting
from prorag.models.endpoint_config import ServedConfig

StepCount = Literal["all", "search"]
STEP_COUNTS: tuple[str, ...] = ("all", "search")
EquivalenceJudgeKind = Literal["oracle", "llm"]
EQUIVALENCE_JUDGES: tuple[str, ...] = ("oracle", "llm")


@dataclass
class EquivalenceEndpointConfig(ServedConfig):
    """The LLM judge of over-search: an OpenAI-compatible endpoint (:class:`~prorag.models.endpoint_config.ServedConfig`:
    key from ``api_key_env``, retries, reply cache keyed by the hash of model and prompt), chat by default."""

    api: Literal["completions", "chat"] = setting(
        "chat", help="`chat` (default): the prompt is the user message; `completions`: sent as is."
    )
    cache_path: str | None = setting(
        None,
        help="Reply cache (JSONL) keyed by the SHA-256 of model and prompt: a rerun asks nothing twice. None: in memory only.",
    )
    max_tokens: int = setting(16, help='Tokens of the reply (`{"equivalent": "yes"}` is asked for).')
    prompt_file: str | None = setting(
        None, help="Judge prompt with `{question}`, `{answer}`, `{reference}` (default: the shipped prompts/over_search.txt)."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_tokens < 1:
            raise ValueError(f"{type(self).__name__}.max_tokens must be >= 1, got {self.max_tokens}")


@dataclass
class OverSearchJudgeConfig:
    """Who decides that a search step's sub-query, re-asked without documents, got an answer
    equivalent to the reference (the gold sub-answer, else the step's conclusion): the ``oracle``
    (exact match after normalisation, the default) or an ``llm`` judge on any OpenAI-compatible
    endpoint (the judge itself is :mod:`prorag.supervision.equivalence`)."""

    judge: EquivalenceJudgeKind = setting(
        "oracle",
        help='`"oracle"`: exact match after normalisation; `"llm"`: the endpoint in `llm` answers a strict yes/no JSON '
        "(an unparsable reply counts as not equivalent and is counted).",
    )
    llm: EquivalenceEndpointConfig | None = setting(
        None, help="The judge endpoint for `judge: llm`: base_url, model, api_key_env, cache_path, ... (ServedConfig fields)."
    )

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.judge not in EQUIVALENCE_JUDGES:
            raise ValueError(f"{name}.judge must be one of {EQUIVALENCE_JUDGES}, got {self.judge!r}")
        if self.judge == "llm" and self.llm is None:
            raise ValueError(f"{name}.llm must be set when judge is 'llm': give the judge endpoint (base_url, model, ...)")


@dataclass
class HiPRAGRewardConfig(OverSearchJudgeConfig):
    """The coefficients of HiPRAG's reward (the paper's values), what ``N`` counts, and the
    over-search judge (:class:`OverSearchJudgeConfig`: ``judge``, ``llm``)."""

    lambda_f: float = setting(0.2, help="Weight of the format term F (the paper's 0.2).")
    lambda_p: float = setting(0.4, help="Weight of the process bonus A * F * N_opt / N (the paper's 0.4).")
    n_steps: StepCount = setting(
        "all", help='What N counts: `"all"` steps (the paper) or `"search"` steps only (the public code).'
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_steps not in STEP_COUNTS:
            raise ValueError(f"HiPRAGRewardConfig.n_steps must be one of {STEP_COUNTS}, got {self.n_steps!r}")


@dataclass(frozen=True)
class ReasoningStep:
    """One HiPRAG step: whether it searched, its sub-query (``""`` without a search) and its
    conclusion (``""`` when a search is not followed by a conclusion)."""

    search: bool
    query: str
    conclusion: str


def reasoning_steps(actions: Sequence[Action]) -> list[ReasoningStep]:
    """Cut parsed actions into HiPRAG steps (module docstring). A search takes the conclusion
    that follows it; a conclusion after anything else is a non-search step; answers and actions
    with no kind are not steps (a malformed action is the format term's business)."""
    steps: list[ReasoningStep] = []
    i = 0
    while i < len(actions):
        action = actions[i]
        if action.kind is ActionKind.SEARCH:
            nxt = actions[i + 1] if i + 1 < len(actions) else None
            if nxt is not None and nxt.kind is ActionKind.CONCLUDE:
                steps.append(ReasoningStep(True, action.content, nxt.content))
                i += 2
                continue
            steps.append(ReasoningStep(True, action.content, ""))
        elif action.kind is ActionKind.CONCLUDE:
            steps.append(ReasoningStep(False, "", action.content))
        i += 1
    return steps


def hiprag_value(
    correct: bool, format_valid: bool, search: Sequence[bool], optimal: Sequence[bool], config: HiPRAGRewardConfig
) -> float:
    """HiPRAG's reward ``R = A * (1 - lambda_f) + lambda_f * F + lambda_p * A * F * N_opt / N`` from
    its ingredients: ``correct`` (A, cover exact match of the answer), ``format_valid`` (F, I_traj)
    and, per step, whether it searched and whether it was optimal (neither over- nor under-search).

    ``N`` is every step (the paper, default) or the search steps (the public code:
    ``n_steps="search"``, where ``N_opt`` then counts optimal search steps only, so the ratio stays
    in [0, 1]). Without any step to count (``N = 0``) the bonus is 0: answering with no reasoning
    earns no process bonus.

    >>> hiprag_value(True, True, [True, False], [True, False], HiPRAGRewardConfig())
    1.2
    """
    if len(search) != len(optimal):
        raise ValueError(f"{len(search)} search flags but {len(optimal)} optimality flags")
    a, f = float(correct), float(format_valid)
    counted = [o for s, o in zip(search, optimal, strict=True) if s or config.n_steps == "all"]
    ratio = sum(counted) / len(counted) if counted else 0.0
    return a * (1 - config.lambda_f) + config.lambda_f * f + config.lambda_p * a * f * ratio


@dataclass(frozen=True)
class SearchCounts:
    """Step counts of one or many trajectories: search steps and how many over-searched,
    non-search steps and how many under-searched."""

    search: int = 0
    over: int = 0
    non_search: int = 0
    under: int = 0

    def __add__(self, other: SearchCounts) -> SearchCounts:
        return SearchCounts(
            self.search + other.search, self.over + other.over, self.non_search + other.non_search, self.under + other.under
        )

    @property
    def over_search_rate(self) -> float | None:
        """Over-search steps / search steps (``None`` without a search step)."""
        return self.over / self.search if self.search else None

    @property
    def under_search_rate(self) -> float | None:
        """Under-search steps / non-search steps (``None`` without a non-search step)."""
        return self.under / self.non_search if self.non_search else None


def search_counts(search: Sequence[bool], over: Sequence[bool], under: Sequence[bool]) -> SearchCounts:
    """Count one trajectory's steps from per-step flags (``over`` read on search steps only,
    ``under`` on non-search steps only)."""
    flags = list(zip(search, over, under, strict=True))
    return SearchCounts(
        search=sum(s for s, _, _ in flags),
        over=sum(s and o for s, o, _ in flags),
        non_search=sum(not s for s, _, _ in flags),
        under=sum((not s) and u for s, _, u in flags),
    )


__all__ = [
    "EQUIVALENCE_JUDGES",
    "STEP_COUNTS",
    "EquivalenceEndpointConfig",
    "EquivalenceJudgeKind",
    "HiPRAGRewardConfig",
    "OverSearchJudgeConfig",
    "ReasoningStep",
    "SearchCounts",
    "StepCount",
    "hiprag_value",
    "reasoning_steps",
    "search_counts",
]
