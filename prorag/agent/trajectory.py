"""A rollout's record (:class:`Trajectory`, one :class:`ActionRecord` per action) and how its
completion reads as text (:func:`decode_completion`).

Token-in / token-out: ``completion_ids`` hold exactly the ids the model sampled, interleaved with
the environment's (``env_mask`` 0), with the log-probabilities of the sampled tokens beside them.
Torch-free, so that rewards, judges and configs can name trajectories without the engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prorag.agent.schema import TAGS, count_tags, defang_tags


@dataclass
class ActionRecord:
    """One action of a trajectory: its kind, token span (over the completion) and I_step."""

    kind: str | None
    span: tuple[int, int]
    well_formed: bool


@dataclass
class Trajectory:
    """One rollout, token-in/token-out, with the decoded text beside the ids."""

    id: str
    question: str
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]
    actions: list[ActionRecord]
    retrievals: list[dict[str, Any]]
    """One entry per search: ``{"query", "doc_ids", "action"}`` (action index)."""
    stop_reason: str
    """answer | eos | max_action_tokens | max_actions | max_completion_tokens"""
    text: str = ""
    """The completion decoded with special tokens kept (for people and text metrics)."""
    answer: str | None = None
    valid: bool = False
    """I_traj of the completion."""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_searches(self) -> int:
        return len(self.retrievals)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["actions"] = [{"kind": a.kind, "span": list(a.span), "well_formed": a.well_formed} for a in self.actions]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["actions"] = [ActionRecord(a["kind"], tuple(a["span"]), a["well_formed"]) for a in d["actions"]]
        return cls(**d)


def decode_completion(tokenizer: Any, ids: Sequence[int]) -> str:
    """A completion's text in which only tag *tokens* read as tags.

    A real tokenizer (SmolLM2's) can also spell a tag out of ordinary tokens (``<``, ``step``,
    ``>``), which decodes to the same text as the tag's own token: the text parser would call
    such an action well formed (and reward its answer) while the engine, which acts on tag
    ids only, and the token parser never saw a tag. So when the decoded text holds more tags
    than the ids have tag tokens, the runs between tag tokens are decoded one by one and the
    spelled tags in them defanged (``&lt;step>``); otherwise the plain decode is returned, so
    well-behaved completions keep their exact text. A tokenizer without the ten tags as tokens
    (a text-only stand-in) has nothing to tell apart: its plain decode is returned."""
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    tag_ids = set(convert(list(TAGS))) - {None, getattr(tokenizer, "unk_token_id", None)} if convert else set()
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if len(tag_ids) < len(TAGS) or count_tags(text) == sum(i in tag_ids for i in ids):
        return text
    pieces: list[str] = []
    start = 0
    for end in [*(k for k, i in enumerate(ids) if i in tag_ids), len(ids)]:
        if end > start:
            pieces.append(defang_tags(tokenizer.decode(ids[start:end], skip_special_tokens=False)))
        if end < len(ids):
            pieces.append(tokenizer.decode(ids[end : end + 1], skip_special_tokens=False))
        start = end + 1
    return "".join(pieces)


def perplexity(logprobs: Sequence[float], mask: Sequence[int]) -> float:
    """Perplexity of the model-written tokens (environment tokens excluded)."""
    own = [lp for lp, m in zip(logprobs, mask, strict=True) if m]
    return math.exp(-sum(own) / len(own)) if own else float("nan")
