"""The PRM's inputs: step pairs and pointwise labels, read and checked, split by question, made into examples.

Each pair of the pairs file (``prorag pairs``, checked line by line by :func:`read_step_pairs`)
becomes ``{"chosen_ids", "rejected_ids"}`` built by the scorer's own ``build_input`` (cut from the
left so the step survives), so training and scoring see the same ids; TRL's ``max_length`` would
drop long pairs, so examples are cut here instead. Whole questions are held out
(:func:`split_by_question`): pairs of one question share prefixes, a per-pair split overstates
accuracy. Pairs and pointwise labels share one dataset; :class:`PairCollator` tells them apart.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prorag.core.errors import DataError
from prorag.data.jsonl import read_jsonl_numbered
from prorag.supervision.reward_model import ProcessRewardModel, pad_batch


@dataclass
class StepPair:
    """One judged pair of sibling steps (a row of the step-pairs file), as the PRM needs it."""

    id: str
    question_id: str
    context_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    judge: str | None = None
    depth: int | None = None


def _token_ids(row: dict[str, Any], key: str, where: str, *, non_empty: bool) -> list[int]:
    value = row.get(key)
    if not isinstance(value, list):
        raise DataError(where, f"field '{key}': expected a list of token ids, got {type(value).__name__}")
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise DataError(where, f"field '{key}': item {i} is {t!r}, expected a non-negative integer token id")
    if non_empty and not value:
        raise DataError(where, f"field '{key}': empty, a step has at least one token")
    return value


def _text_field(row: dict[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value) == "":
        raise DataError(where, f"field '{key}': expected a non-empty string, got {value!r}")
    return str(value)


def parse_step_pair(row: dict[str, Any], where: str) -> StepPair:
    """Check one row of the step-pairs file and keep what training needs; :class:`DataError`
    naming ``where`` and the field otherwise. Identical chosen and rejected steps are refused:
    such a pair carries no preference."""
    pair = StepPair(
        id=_text_field(row, "id", where),
        question_id=_text_field(row, "question_id", where),
        context_ids=_token_ids(row, "context_ids", where, non_empty=False),
        chosen_ids=_token_ids(row, "chosen_ids", where, non_empty=True),
        rejected_ids=_token_ids(row, "rejected_ids", where, non_empty=True),
        judge=row.get("judge") if isinstance(row.get("judge"), str) else None,
        depth=row.get("depth") if isinstance(row.get("depth"), int) else None,
    )
    if pair.chosen_ids == pair.rejected_ids:
        raise DataError(where, "fields 'chosen_ids' and 'rejected_ids' are identical; a pair needs two different steps")
    return pair


def read_step_pairs(path: str | Path, *, allow_empty: bool = False) -> list[StepPair]:
    """All pairs of a step-pairs JSONL file, each checked (:func:`parse_step_pair`); ids must be
    unique. :class:`DataError` names ``file:line`` and the field of the first bad row, and an
    empty file unless ``allow_empty``."""
    pairs: list[StepPair] = []
    seen: dict[str, int] = {}
    for lineno, row in read_jsonl_numbered(path):
        where = f"{path}:{lineno}"
        pair = parse_step_pair(row, where)
        if pair.id in seen:
            raise DataError(where, f"field 'id': {pair.id!r} already used on line {seen[pair.id]}")
        seen[pair.id] = lineno
        pairs.append(pair)
    if not pairs and not allow_empty:
        raise DataError(str(path), "no step pairs")
    return pairs


@dataclass
class PointStep:
    """One judged step with its label (a row of the pointwise file, ``prorag pairs``)."""

    id: str
    question_id: str
    context_ids: list[int]
    step_ids: list[int]
    label: int


def read_pointwise(path: str | Path) -> list[PointStep]:
    """All rows of a pointwise-labels JSONL file, checked like the pairs (ids, token ids, and
    ``label`` 0 or 1); :class:`DataError` names ``file:line`` and the field of the first bad row."""
    points: list[PointStep] = []
    seen: dict[str, int] = {}
    for lineno, row in read_jsonl_numbered(path):
        where = f"{path}:{lineno}"
        label = row.get("label")
        if label not in (0, 1) or isinstance(label, bool):
            raise DataError(where, f"field 'label': expected 0 or 1, got {label!r}")
        point = PointStep(
            id=_text_field(row, "id", where),
            question_id=_text_field(row, "question_id", where),
            context_ids=_token_ids(row, "context_ids", where, non_empty=False),
            step_ids=_token_ids(row, "step_ids", where, non_empty=True),
            label=int(label),
        )
        if point.id in seen:
            raise DataError(where, f"field 'id': {point.id!r} already used on line {seen[point.id]}")
        seen[point.id] = lineno
        points.append(point)
    return points


def split_by_question(pairs: Sequence[StepPair], fraction: float, seed: int) -> tuple[list[StepPair], list[StepPair]]:
    """``(train, held_out)``: the pairs of a seeded ``fraction`` of the question ids held out
    whole, so no question has pairs on both sides (at least one question is held out when
    ``fraction > 0``, and at least one is kept for training). The order of the pairs is kept.

    Why by question: pairs of one question share their context and often a step, so a split
    by pair would evaluate on near-copies of training pairs."""
    questions = sorted({p.question_id for p in pairs})
    if fraction <= 0 or len(questions) < 2:
        return list(pairs), []
    random.Random(seed).shuffle(questions)
    n_held = min(len(questions) - 1, max(1, round(fraction * len(questions))))
    held = set(questions[:n_held])
    return [p for p in pairs if p.question_id not in held], [p for p in pairs if p.question_id in held]


def check_vocabulary(item_id: str, ids: Sequence[int], vocab: int, owner: str = "PRM") -> None:
    """``ValueError`` when a token id of item ``item_id`` (a pair or a pointwise label) is outside a
    tokenizer of ``vocab`` ids (``owner`` names it in the message): items made with another
    policy's tokenizer would train on wrong tokens."""
    top = max(ids)
    if top >= vocab:
        raise ValueError(
            f"pair {item_id!r}: token id {top} is outside the {owner} tokenizer's {vocab} ids; "
            "were the pairs made with another policy's tokenizer?"
        )


def point_examples(points: Sequence[PointStep], scorer: ProcessRewardModel) -> list[dict[str, Any]]:
    """Training examples of pointwise labels, in the pair examples' columns (one dataset holds
    both; :class:`PairCollator` tells them apart): ``chosen_ids`` is the input, ``rejected_ids``
    None and ``point_label`` the label (None on a pair)."""
    vocab = len(scorer.tokenizer)
    out = []
    for point in points:
        check_vocabulary(point.id, [*point.context_ids, *point.step_ids], vocab)
        out.append(
            {
                "chosen_ids": scorer.build_input(point.context_ids, point.step_ids),
                "rejected_ids": None,
                "chosen_step_length": len(point.step_ids),
                "rejected_step_length": None,
                "point_label": float(point.label),
            }
        )
    return out


def pair_examples(pairs: Sequence[StepPair], scorer: ProcessRewardModel) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """TRL preference examples ``{"chosen_ids", "rejected_ids"}`` (each ``context + step`` as
    :meth:`~prorag.supervision.reward_model.ProcessRewardModel.build_input` builds it) and counts
    (``pairs``, ``truncated``: pairs with a side cut from the left). ``ValueError`` for a token
    id outside the tokenizer's vocabulary (pairs made with another tokenizer)."""
    vocab = len(scorer.tokenizer)
    out: list[dict[str, Any]] = []
    truncated = 0
    for pair in pairs:
        check_vocabulary(pair.id, [*pair.context_ids, *pair.chosen_ids, *pair.rejected_ids], vocab)
        chosen = scorer.build_input(pair.context_ids, pair.chosen_ids)
        rejected = scorer.build_input(pair.context_ids, pair.rejected_ids)
        full = len(pair.context_ids) + max(len(pair.chosen_ids), len(pair.rejected_ids)) + int(scorer.append_eos)
        truncated += full > scorer.max_length
        out.append(
            {
                "chosen_ids": chosen,
                "rejected_ids": rejected,
                "chosen_step_length": len(pair.chosen_ids),
                "rejected_step_length": len(pair.rejected_ids),
                "point_label": None,
            }
        )
    return out, {"pairs": len(out), "truncated": truncated}


@dataclass
class PairCollator:
    """A batch of pairs for :class:`~prorag.stages.prm.trainer.PairwiseRewardTrainer`: the chosen inputs then the rejected
    ones (``2B`` rows, right padding, as TRL's preference collator lays them out), and
    ``step_lengths``, each row's step length in tokens (the likelihood kind reads the step's
    tokens, the last ones of the row). Pointwise examples (:func:`point_examples`) follow as one
    row each, with their labels in ``point_labels`` (empty when the batch has none)."""

    pad_token_id: int

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        pairs = [e for e in examples if e.get("point_label") is None]
        points = [e for e in examples if e.get("point_label") is not None]
        rows = [e["chosen_ids"] for e in pairs] + [e["rejected_ids"] for e in pairs] + [e["chosen_ids"] for e in points]
        ids, mask = pad_batch(rows, int(self.pad_token_id))
        steps = [e["chosen_step_length"] for e in pairs] + [e["rejected_step_length"] for e in pairs]
        steps += [e["chosen_step_length"] for e in points]
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "step_lengths": torch.tensor(steps, dtype=torch.long),
            "point_labels": torch.tensor([e["point_label"] for e in points], dtype=torch.float32),
        }


def pair_stage_inputs(
    config: Any, init: str | Path | None, pairs: Sequence[StepPair] | None, *, allow_empty: bool
) -> tuple[str | Path, Sequence[StepPair]]:
    """The policy and the pairs a stage trained on step pairs (the PRM, offline DPO) starts from:
    the arguments, else the config's ``init`` and ``pairs_file`` (read and checked); ``ValueError``
    naming the option when one is missing. Checked before the stage writes anything."""
    init = init if init is not None else config.init
    if init is None:
        raise ValueError("no policy to start from: pass `init` (--init) or set `init` in the config")
    if pairs is None:
        if not config.pairs_file:
            raise ValueError("no step pairs: pass `pairs` (--pairs) or set `pairs_file` in the config")
        pairs = read_step_pairs(config.pairs_file, allow_empty=allow_empty)
    return init, pairs
