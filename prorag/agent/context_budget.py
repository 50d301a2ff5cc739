"""The context budget: every prompt is checked against the policy's maximum length before a rollout.

The maximum length is the policy's ``max_position_embeddings`` (of its text config), else the
tokenizer's ``model_max_length`` when it is a real bound (not transformers' 1e30 placeholder);
with neither there is no check. A prompt fits when it leaves room for one whole action:
``prompt tokens + max_action_tokens <= maximum length``. The rest of the trajectory is the
rollout caps' side of the budget (``max_completion_tokens``, ``max_actions``): asking for the whole
completion's room would refuse every prompt of a model whose positions equal that cap (the tiny
policies: 2048 and 2048), while a prompt with no room for an action is a question the policy
cannot answer, and a very long one exhausts memory in its first forward pass.

An over-long question gets one rule (:data:`OVER_LONG_RULES`): ``skip`` (not rolled out) or
``cut`` (the question's text cut to fit, keeping its end, where a long question usually asks;
the prompt's template is never cut; a question that cannot fit even empty is skipped).
Evaluation applies the configured rule and counts both; the samplers (RFT, MCTS, RL, the PRM
audit) skip with a counted warning, since a cut question may no longer lead to its gold answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from prorag.agent.prompts import PromptStyle, prompt_token_ids
from prorag.data.records import Record

log = logging.getLogger(__name__)

OverLongRule = Literal["skip", "cut"]
#: What happens to a question whose prompt leaves no room for an action.
OVER_LONG_RULES: tuple[OverLongRule, ...] = ("skip", "cut")

#: Above this, a tokenizer's ``model_max_length`` is transformers' "unknown" placeholder (int(1e30)).
_NO_BOUND = 10**12


@dataclass(frozen=True)
class ContextBudget:
    """The policy's maximum length and the room a rollout needs after its prompt."""

    max_length: int
    room: int

    @property
    def prompt_limit(self) -> int:
        """The longest prompt that fits, in tokens (negative when nothing fits)."""
        return self.max_length - self.room

    def describe(self) -> str:
        return f"a prompt must leave {self.room} of the policy's {self.max_length} positions for an action"


@dataclass
class BudgetSplit:
    """Records sorted by the budget: ``rollout`` (in input order; a cut question's record holds the
    cut text), ``skipped`` (not rolled out), and the ids of the cut ones."""

    rollout: list[Record] = field(default_factory=list)
    skipped: list[Record] = field(default_factory=list)
    cut: set[str] = field(default_factory=set)


def policy_max_length(model: Any, tokenizer: Any) -> int | None:
    """The policy's maximum length: ``max_position_embeddings`` of the model's (text) config, else
    a real ``tokenizer.model_max_length``; ``None`` when neither says (no budget)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        return positions
    length = getattr(tokenizer, "model_max_length", None)
    if isinstance(length, int) and 0 < length < _NO_BOUND:
        return length
    return None


def context_budget(model: Any, tokenizer: Any, config: Any) -> ContextBudget | None:
    """The budget of a rollout engine's ``config`` on this policy: room for one action of
    ``max_action_tokens`` (at most ``max_completion_tokens``); ``None`` without a known maximum length."""
    max_length = policy_max_length(model, tokenizer)
    if max_length is None:
        return None
    return ContextBudget(max_length, min(config.max_action_tokens, config.max_completion_tokens))


def cut_question(tokenizer: Any, question: str, limit: int, style: PromptStyle | None = None) -> str | None:
    """The longest end of ``question`` whose prompt is at most ``limit`` tokens, ``None`` if even
    an empty question does not fit. Cut on the question's own tokens, then checked on the whole
    prompt (decoding and re-encoding at a cut may shift a token), shrinking until it fits."""
    ids = tokenizer(question, add_special_tokens=False, verbose=False)["input_ids"]
    keep = min(len(ids), limit - len(prompt_token_ids(tokenizer, "", style)))
    while keep > 0:
        text = tokenizer.decode(ids[len(ids) - keep :], skip_special_tokens=True).strip()
        over = len(prompt_token_ids(tokenizer, text, style)) - limit
        if over <= 0 and text:
            return text
        keep -= max(1, over)
    return None


def apply_budget(
    records: Sequence[Record], tokenizer: Any, budget: ContextBudget | None, rule: OverLongRule, style: PromptStyle | None = None
) -> BudgetSplit:
    """Sort ``records`` by ``budget`` under ``rule`` (see the module docstring); with no budget,
    every record is rolled out as it is."""
    if rule not in OVER_LONG_RULES:
        raise ValueError(f"over_long must be one of {OVER_LONG_RULES}, got {rule!r}")
    split = BudgetSplit()
    for record in records:
        if budget is None or len(prompt_token_ids(tokenizer, record.question, style)) <= budget.prompt_limit:
            split.rollout.append(record)
            continue
        cut = cut_question(tokenizer, record.question, budget.prompt_limit, style) if rule == "cut" else None
        if cut is None:
            split.skipped.append(record)
        else:
            split.rollout.append(replace(record, question=cut))
            split.cut.add(record.id)
    return split


def warn_over_long(what: str, split: BudgetSplit, total: int, budget: ContextBudget | None) -> None:
    """One warning line with the counts, when anything was skipped or cut."""
    if budget is None or not (split.skipped or split.cut):
        return
    log.warning(
        "%s: %d of %d questions over the context budget (%s): %d skipped, %d cut",
        what,
        len(split.skipped) + len(split.cut),
        total,
        budget.describe(),
        len(split.skipped),
        len(split.cut),
    )


def drop_over_long(records: Sequence[Record], model: Any, tokenizer: Any, config: Any, what: str) -> list[Record]:
    """``records`` without the questions whose prompt leaves no room for an action under the
    rollout ``config`` (``prompt_style``, ``max_action_tokens``), with a counted warning: the
    samplers' rule (they learn from what they sample, so nothing is cut)."""
    records = list(records)
    budget = context_budget(model, tokenizer, config)
    split = apply_budget(records, tokenizer, budget, "skip", getattr(config, "prompt_style", None))
    warn_over_long(what, split, len(records), budget)
    return split.rollout


__all__ = [
    "OVER_LONG_RULES",
    "BudgetSplit",
    "ContextBudget",
    "OverLongRule",
    "apply_budget",
    "context_budget",
    "cut_question",
    "drop_over_long",
    "policy_max_length",
    "warn_over_long",
]
