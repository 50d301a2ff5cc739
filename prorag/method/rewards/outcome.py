"""The outcome reward of ProRAG's RL stage (docs/METHOD.md §2, Eq. 6): one number per trajectory.

    paper (Eq. 6):   r_out = F1(answer, gold) + nu2 * I_traj(y)
    reference code:  r_out = (2 * F1 if F1 >= 0.2 else 0) + (+1 if I_traj(y) else -1)

The paper's form is the default (``OutcomeRewardConfig(form="reference")`` for the other). The
reference form ignores weak partial answers and *penalises* bad format. The paper gives no value
for ``nu2``; 1.0 is the reference code's bonus, so format and correctness trade one for one.

Everything is read from the trajectory's token ids with tags kept, never from TRL's decoded
completions (special tokens stripped: no ``<answer>``, no format). The answer is read by
:func:`prorag.agent.schema.extract_answer` and the format judged by :func:`~prorag.agent.schema.i_traj`,
so the reward agrees with ``prorag eval``. A malformed trajectory is never an error: F1 0 without
an answer, plus the format penalty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prorag.agent.schema import extract_answer, i_traj
from prorag.agent.trajectory import Trajectory, decode_completion
from prorag.core.config import method_settings, setting
from prorag.core.metrics import exact_match, f1_score
from prorag.core.registry import Registry
from prorag.data.records import Record

#: A form's name (``OutcomeRewardConfig.form``): a name in :data:`OUTCOME_REWARDS`.
OutcomeForm = str

#: The forms computed by :func:`outcome_value` (the others are registered by layers above):
#: Eq. 6 (``paper``, ``reference``) and CP-Search's Phi (``f1_if_valid``, METHOD.md §5).
OUTCOME_FORMS: tuple[str, ...] = ("paper", "reference", "f1_if_valid")
#: What each of :data:`OUTCOME_FORMS` computes (their descriptions in help texts).
_FORM_HELP: dict[str, str] = {
    "paper": "`F1 + nu2 * I_traj` (Eq. 6)",
    "reference": "`(2 F1 if F1 >= 0.2 else 0) + (1 if I_traj else -1)` (the reference code)",
    "f1_if_valid": "CP-Search's `F1 if I_traj else 0`",
}

#: Outcome rewards by name (``OutcomeRewardConfig.form``). The supervision layer's (``hiprag``,
#: ``p2s``) register when their modules are imported (the RL stage imports them).
OUTCOME_REWARDS: Registry[OutcomeRewardFactory] = Registry("outcome reward")

#: Reference code: the answer term is ``REFERENCE_F1_SCALE * F1`` when F1 reaches ``REFERENCE_F1_FLOOR``, else 0.
REFERENCE_F1_SCALE = 2.0
REFERENCE_F1_FLOOR = 0.2
#: Reference code: the format term, for a well-formed and for a malformed trajectory.
REFERENCE_FORMAT_BONUS = 1.0
REFERENCE_FORMAT_PENALTY = -1.0

#: Stop reasons of a trajectory that ended by itself (the others are caps: never well formed).
FINISHED_STOP_REASONS = frozenset({"answer", "eos"})


@method_settings(form=OUTCOME_REWARDS)
@dataclass
class OutcomeRewardConfig:
    """Which outcome reward to compute (Eq. 6 or another registered form) and its settings; a form
    registered with its own settings class has them in the section of its name (``hiprag``, ``p2s``)."""

    form: OutcomeForm = setting(
        "paper",
        choices=OUTCOME_REWARDS,
        help="The outcome reward, a name in OUTCOME_REWARDS (a form's own settings sit in its section, e.g. `p2s.k`):",
    )
    nu2: float = setting(
        1.0, help="The paper's format coefficient; the paper gives no value, 1.0 is the reference code's +1 bonus."
    )
    # `None`: strict for the reference form, the project's grammar (two searches in a row and conclusions without a search
    # allowed, prorag.agent.schema) for the paper's form, whose text only asks for "the complete reasoning-action workflow".
    strict_grammar: bool | None = setting(
        None,
        help="Judge I_traj with the reference code's grammar `(S Q R S A)* S F` (searches and conclusions alternate); "
        "`None`: strict for the reference form only.",
    )

    def __post_init__(self) -> None:
        OUTCOME_REWARDS.check(self.form, "OutcomeRewardConfig.form")

    @property
    def strict(self) -> bool:
        """The grammar I_traj is judged with (see :attr:`strict_grammar`)."""
        return self.form == "reference" if self.strict_grammar is None else self.strict_grammar


def completion_text(traj: Trajectory, tokenizer: Any) -> str:
    """The completion decoded from its token ids with every tag kept.

    Trailing end-of-sequence ids are dropped first (an EOS is the end of the text, not stray
    text after the answer); nothing else is removed, so the tags, which are special tokens,
    stay where the model and the environment wrote them, and a tag spelled out of ordinary
    tokens is defanged (:func:`~prorag.agent.trajectory.decode_completion`): it is no tag.
    """
    ids = list(traj.completion_ids)
    eos = tokenizer.eos_token_id
    while ids and eos is not None and ids[-1] == eos:
        ids.pop()
    return decode_completion(tokenizer, ids)


def trajectory_answer(traj: Trajectory, tokenizer: Any) -> str | None:
    """The final answer â of a trajectory, read from its ids: the stripped text inside the last
    ``<answer> … </answer>`` pair (:func:`~prorag.agent.schema.extract_answer`), ``None`` without one."""
    return extract_answer(completion_text(traj, tokenizer))


def trajectory_em(traj: Trajectory, golds: Sequence[str], tokenizer: Any) -> float:
    """Exact match of a trajectory's answer (:func:`trajectory_answer`) with any gold alias; 0
    for a trajectory without an answer."""
    answer = trajectory_answer(traj, tokenizer)
    return exact_match(answer, list(golds)) if answer is not None else 0.0


def trajectory_format_valid(traj: Trajectory, tokenizer: Any, *, strict: bool = False) -> bool:
    """I_traj of a trajectory, read from its ids: the completion follows the grammar and ends in
    exactly one answer (:func:`~prorag.agent.schema.i_traj`), and the trajectory ended by itself
    rather than being cut by a cap."""
    if traj.stop_reason not in FINISHED_STOP_REASONS:
        return False
    return bool(i_traj(completion_text(traj, tokenizer), strict=strict))


def outcome_value(f1: float, format_valid: bool, config: OutcomeRewardConfig) -> float:
    """Eq. 6 from its two ingredients, in the configured form (the pure formula).

    >>> outcome_value(0.4, True, OutcomeRewardConfig())
    1.4
    >>> outcome_value(0.5, False, OutcomeRewardConfig(form="reference"))
    0.0
    >>> cp = OutcomeRewardConfig(form="f1_if_valid")
    >>> outcome_value(0.5, True, cp), outcome_value(0.5, False, cp)
    (0.5, 0.0)
    """
    if config.form == "paper":
        return float(f1) + config.nu2 * float(format_valid)
    if config.form == "f1_if_valid":  # CP-Search's Phi: the format gates the answer, it earns nothing by itself
        return float(f1) if format_valid else 0.0
    if config.form != "reference":
        raise ValueError(f"outcome form {config.form!r} is not Eq. 6: compute it with OUTCOME_REWARDS.get({config.form!r})")
    answer_term = REFERENCE_F1_SCALE * f1 if f1 >= REFERENCE_F1_FLOOR else 0.0
    return answer_term + (REFERENCE_FORMAT_BONUS if format_valid else REFERENCE_FORMAT_PENALTY)


def outcome_reward(traj: Trajectory, golds: Sequence[str], tokenizer: Any, config: OutcomeRewardConfig | None = None) -> float:
    """r_out of one trajectory against its gold answers (all aliases; F1 is the best alias's).

    ``tokenizer`` decodes the trajectory's ids (tags kept). A trajectory without an answer
    scores F1 = 0; with the reference form it then gets -1, never an exception.
    """
    cfg = config or OutcomeRewardConfig()
    answer = trajectory_answer(traj, tokenizer)
    f1 = f1_score(answer, list(golds)) if answer is not None else 0.0
    return outcome_value(f1, trajectory_format_valid(traj, tokenizer, strict=cfg.strict), cfg)


def outcome_rewards(
    trajectories: Sequence[Trajectory], golds: Sequence[Sequence[str]], tokenizer: Any, config: OutcomeRewardConfig | None = None
) -> list[float]:
    """:func:`outcome_reward` of each trajectory with the gold answers of its question."""
    if len(trajectories) != len(golds):
        raise ValueError(f"{len(trajectories)} trajectories but {len(golds)} gold answer lists")
    return [outcome_reward(t, g, tokenizer, config) for t, g in zip(trajectories, golds, strict=True)]


@dataclass(frozen=True)
class RewardInputs:
    """What an outcome reward is given: one batch of trajectories with the gold answers of each
    one's question. ``records`` (one per trajectory), ``policy`` (the model being trained,
    unwrapped) and ``retriever`` (the rollouts' search engine) are given by the trainer for the
    rewards that need them (HiPRAG re-asks sub-queries, P2S samples gold-conditioned searches);
    the others ignore them; ``seed`` and ``step`` name a sampling reward's streams. One object
    rather than eight arguments, so a reward that needs one more input from the trainer adds a
    field here and no signature changes."""

    trajectories: Sequence[Trajectory]
    golds: Sequence[Sequence[str]]
    tokenizer: Any
    records: Sequence[Record] | None = None
    policy: Any = None
    retriever: Any = None
    seed: int = 0
    """The RL run's seed (a reward that samples, P2S, names its streams with it)."""
    step: int | None = None
    """The trainer's step when the batch was generated (``None`` outside a trainer: a reward that
    samples then counts its own calls)."""

    def __post_init__(self) -> None:
        if len(self.trajectories) != len(self.golds):
            raise ValueError(f"{len(self.trajectories)} trajectories but {len(self.golds)} gold answer lists")


class OutcomeReward(Protocol):
    """One outcome reward per trajectory of a :class:`RewardInputs` batch."""

    def __call__(self, batch: RewardInputs) -> list[float]: ...


#: ``factory(config: OutcomeRewardConfig)`` -> an :class:`OutcomeReward`.
OutcomeRewardFactory = Callable[[OutcomeRewardConfig], OutcomeReward]


def formula_outcome(config: OutcomeRewardConfig) -> OutcomeReward:
    """Eq. 6 in one of :data:`OUTCOME_FORMS` as an :class:`OutcomeReward` (records, policy, retriever unused)."""
    return lambda batch: outcome_rewards(batch.trajectories, batch.golds, batch.tokenizer, config)


for _form in OUTCOME_FORMS:
    OUTCOME_REWARDS.register(_form, help=_FORM_HELP[_form])(formula_outcome)


__all__ = [
    "FINISHED_STOP_REASONS",
    "OUTCOME_REWARDS",
    "OUTCOME_FORMS",
    "REFERENCE_F1_FLOOR",
    "REFERENCE_F1_SCALE",
    "RewardInputs",
    "REFERENCE_FORMAT_BONUS",
    "REFERENCE_FORMAT_PENALTY",
    "OutcomeForm",
    "OutcomeReward",
    "OutcomeRewardConfig",
    "OutcomeRewardFactory",
    "completion_text",
    "formula_outcome",
    "outcome_reward",
    "outcome_rewards",
    "outcome_value",
    "trajectory_answer",
    "trajectory_em",
    "trajectory_format_valid",
]
