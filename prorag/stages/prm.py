"""Stage 2's last step: train the process reward model R_phi on judged step pairs (docs/METHOD.md §2, Eq. 4).

Each pair of the pairs file (``prorag pairs``, checked line by line by :func:`read_step_pairs`)
becomes ``{"chosen_ids", "rejected_ids"}`` built by the scorer's own ``build_input`` (cut from the
left so the step survives), so training and scoring see the same ids. Whole questions are held out
(:func:`split_by_question`): pairs of one question share prefixes, a per-pair split overstates accuracy.

:class:`PairwiseRewardTrainer` subclasses TRL's ``RewardTrainer`` (trl==1.16.0) with one override,
``compute_loss``: the reward is read at the last attention-mask position (TRL's read-out is one token
early when pad is EOS), Eq. 4 is applied, and accuracy and margin are kept per pair (TRL's per-batch
means weigh a short last batch like a full one). TRL's ``max_length`` drops long pairs, so examples
are cut here instead. The likelihood kind (``PRMConfig.kind``) trains the
policy's LM head through the same path; its zero point is fitted on the *training* pairs.
Writes ``prm_config.json``, ``split.json``, ``checkpoints/``, ``metrics.jsonl`` (with held-out
``eval_auc`` and the init policy's likelihood baseline, the number to beat), ``prm/`` and
``summary.json`` (:func:`likelihood_verdict`: does the PRM beat that baseline).

Two additions to the paper, both off by the settings that reproduce it: pointwise labels (the
judge's verdict on every judged node, ``pairs.pointwise.jsonl``) add a binary cross-entropy term
(:func:`prm_loss`, ``pointwise_weight``), and ``backbone_size`` gives the PRM a fresh built-in
backbone of another size than the policy's (:func:`~prorag.supervision.reward_model.reward_model_of_size`).
"""

from __future__ import annotations

import logging
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from transformers import TrainerCallback
from trl import RewardConfig, RewardTrainer

from prorag.agent.rollout import Trajectory
from prorag.core.config import setting
from prorag.core.errors import DataError
from prorag.core.metrics import grouped_ranking_auc, ranking_auc
from prorag.data.jsonl import JsonlAppender, read_json, read_jsonl, read_jsonl_numbered, write_json
from prorag.data.records import Record
from prorag.method.rewards.process import StepScorer
from prorag.models.tiny import TINY_SIZES
from prorag.stages.training import MetricsFile, TrainerKernels, TrainingConfig, resume_training
from prorag.supervision.reward_model import (
    DEFAULT_MAX_LENGTH,
    PRM_KINDS,
    ProcessRewardModel,
    length_batches,
    pad_batch,
    reward_model_from_policy,
    reward_model_of_size,
    separating_threshold,
    span_means,
    step_token_count,
    token_logprobs,
    truncate_left,
)

log = logging.getLogger(__name__)


@dataclass
class PRMConfig(TrainingConfig):
    """Settings of the PRM stage. The paper gives the epochs (3, from the SFT checkpoint); the
    reference code gives the rest (lr 2e-5, batch 8 x 4 accumulation, 4096 tokens); else TRL's.
    ``learning_rate`` 2e-5 is for real pretrained models; a tiny built-in model needs a higher one.
    The shared training fields are :class:`~prorag.stages.training.TrainingConfig`'s.
    """

    # --- model and data
    init: str | None = setting(
        None,
        help="The policy the PRM starts from (`pi_sft`): a checkpoint folder, a training run folder (its "
        "`policy/`) or a hub id. `train_prm`'s `init` argument replaces it.",
    )
    pairs_file: str | None = setting(
        None, help="The step-pairs JSONL (`prorag pairs`); `train_prm`'s `pairs` argument replaces it."
    )
    max_length: int = setting(
        DEFAULT_MAX_LENGTH,
        help="Longest input (context + step) in tokens; longer ones are cut from the left. Capped by the model's "
        "`max_position_embeddings`.",
    )
    append_eos: bool = setting(
        False,
        help="Append EOS after the step and read the score there (the reference code); default: read it on the "
        "step's closing tag.",
    )
    held_out_fraction: float = setting(
        0.05,
        help="Fraction of the *questions* whose pairs are held out for the pairwise accuracy (at least one "
        "question when > 0; the reference code held out 2% of pairs at random).",
    )
    # With one, the model is scored on the validation pairs before training and every `eval_steps`, and the weights with the
    # best validation pairwise accuracy (then AUC) are the ones saved, the initial weights included (earliest on ties): a run
    # that only overfits keeps what it started from. The held-out pairs are never used to choose anything.
    validation_fraction: float = setting(
        0.0, help="Fraction of the *training* questions set aside as a validation set (0: none, the paper)."
    )

    # --- optimisation (the shared fields are TrainingConfig's; these defaults differ)
    epochs: float = setting(3.0, help="Paper: three epochs.")
    per_device_batch_size: int = setting(8, help="Pairs per device and micro-batch (each is two sequences).")
    gradient_accumulation_steps: int = setting(4, help="Micro-batches per optimiser step (the reference code's 4).")
    save_steps: int = setting(200, help="Checkpoint every this many optimiser steps.")
    # `False` trains only the scalar head on frozen features; the paper's "train the scalar regression head from the SFT
    # checkpoint" can be read either way.
    train_backbone: bool = setting(True, help="Fine-tune the whole model (default).")
    center_rewards_coefficient: float | None = setting(
        None, help="TRL's auxiliary `coef * mean(r^2)` that keeps rewards near 0 (off, as in the paper)."
    )

    # --- run
    eval_steps: int | None = setting(
        None, help="Held-out evaluation every this many steps (default: `save_steps`); always once at the end."
    )
    eval_batch_size: int = setting(16, help="Pairs per batch of the held-out and validation scoring.")
    if_no_pairs: Literal["error", "untrained"] = setting(
        "error",
        help="When the judge found no pair (a policy too weak for any valid sibling step, as in a quick demo): "
        '`"error"` stops; `"untrained"` logs a warning and saves the reward model as built from the policy (a'
        " random head: its scores carry no process signal), so a pipeline with small budgets goes on, as "
        "RFT's `if_nothing_kept: copy_policy` does.",
    )
    # `"likelihood"`: the policy's causal LM itself, scoring a step by `likelihood_beta` times its mean token log-probability
    # (SimPO's length-normalised implicit reward), trained with the same Eq. 4; its zero point is fitted on the training pairs
    # after training (separating_threshold). See prorag.supervision.reward_model for why it exists.
    kind: str = setting(
        "head",
        help="A name in PRM_KINDS. `head` (the paper): the policy's backbone with a new scalar head on the step's last token; `likelihood`: "
        "the policy's LM scoring a step by its mean token log-probability, trained with Eq. 4; `likelihood_ratio`: "
        "`likelihood_beta * (mean log p_phi - mean log p_init)`, the same against the frozen init policy (0 at the start).",
    )
    likelihood_beta: float = setting(
        1.0,
        help="The likelihood kind's scale: the logit of a step is `beta * (mean log p - offset)`, so the sigmoid "
        "of a pair's margin is `sigmoid(beta * difference in mean log-probability)`.",
    )
    # Costs one policy forward per held-out step; off for a policy too large to load beside the PRM.
    likelihood_baseline: bool = setting(
        True,
        help="Also rank the held-out pairs by the init policy's own mean log-probability of each step "
        "(policy_step_likelihoods) and log it as `eval_policy_likelihood_accuracy` / `_auc`: the reference a "
        "trained PRM must beat to have learned more than the policy already prefers (MCTS siblings are policy"
        " samples, and invalid ones are often its unlikely draws).",
    )

    # --- beyond the paper
    pointwise_file: str | None = setting(
        None,
        help="Pointwise step labels (`prorag pairs` writes NAME.pointwise.jsonl beside NAME.jsonl); None: that file "
        "beside the pairs file when it exists.",
    )
    pointwise_weight: float | None = setting(
        None,
        help="Weight of the binary cross-entropy on the pointwise labels added to Eq. 4 (0: Eq. 4 alone, the paper). "
        "None: 1.0 for the `head` kind when pointwise labels exist, 0 for the likelihood kinds (which refuse > 0).",
    )
    backbone_size: str | None = setting(
        None,
        help="None: the PRM starts from the policy's own backbone (the paper); a TINY_SIZES name (`tiny`, `small`): "
        "a fresh built-in model of that size on the policy's tokenizer, drawn as SFT draws the policy (`head` kind only).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pointwise_weight is not None and not self.pointwise_weight >= 0:
            raise ValueError(f"PRMConfig.pointwise_weight must be >= 0, got {self.pointwise_weight}")
        if self.pointwise_weight and self.kind != "head":
            raise ValueError(
                f"PRMConfig.pointwise_weight > 0 needs kind 'head' (a calibrated scalar score); the {self.kind} kind's "
                "zero point is fitted after training, so a cross-entropy on its raw score would fight that fit"
            )
        if self.backbone_size is not None and self.backbone_size not in TINY_SIZES:
            raise ValueError(f"PRMConfig.backbone_size must be one of {sorted(TINY_SIZES)} or null, got {self.backbone_size!r}")
        if self.backbone_size is not None and self.kind != "head":
            raise ValueError(
                f"PRMConfig.backbone_size needs kind 'head': the {self.kind} kind scores by a language model's likelihood, "
                "and a fresh backbone's is noise"
            )
        if not 0 <= self.held_out_fraction < 1:
            raise ValueError(f"PRMConfig.held_out_fraction must be in [0, 1), got {self.held_out_fraction}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"PRMConfig.validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if self.max_length < 2:
            raise ValueError(f"PRMConfig.max_length must be >= 2, got {self.max_length}")
        if self.eval_batch_size < 1:
            raise ValueError(f"PRMConfig.eval_batch_size must be >= 1, got {self.eval_batch_size}")
        if self.bf16 not in (True, False, "auto"):
            raise ValueError(f"PRMConfig.bf16 must be true, false or 'auto', got {self.bf16!r}")
        if self.kind not in PRM_KINDS:
            raise ValueError(f"PRMConfig.kind must be one of {PRM_KINDS.names()}, got {self.kind!r}")
        if not self.likelihood_beta > 0:
            raise ValueError(f"PRMConfig.likelihood_beta must be > 0, got {self.likelihood_beta}")
        try:
            PRM_KINDS.get(self.kind).check_settings(append_eos=self.append_eos, beta=self.likelihood_beta)
        except ValueError as err:
            raise ValueError(f"PRMConfig: {err}") from None
        if self.if_no_pairs not in ("error", "untrained"):
            raise ValueError(f"PRMConfig.if_no_pairs must be 'error' or 'untrained', got {self.if_no_pairs!r}")


# ----------------------------------------------------------------------------- data


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
    """A batch of pairs for :class:`PairwiseRewardTrainer`: the chosen inputs then the rejected
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


# ----------------------------------------------------------------------------- the loss


def pairwise_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Eq. 4: ``-mean log sigmoid(r+ - r-)`` over pairs (``logsigmoid`` is the stable form)."""
    return -nn.functional.logsigmoid(chosen - rejected).mean()


def prm_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, point_logits: torch.Tensor, point_labels: torch.Tensor, weight: float
) -> torch.Tensor:
    """Eq. 4 on the pairs plus ``weight`` times the binary cross-entropy of the pointwise
    logits against their 0/1 labels (each term a mean over its own items; a term with no item
    in the batch is 0).

    Why the second term: Eq. 4 sees only differences between siblings, so it leaves each
    context's level of the scores free: a PRM can rank every pair right and still give a valid
    step of one question less than an invalid step of another. The RL process advantage compares
    steps across contexts (the group's trajectories and their steps), and the RFT filter reads
    the score's sign, so both need scores that mean the same thing everywhere; the cross-entropy
    ties ``sigmoid(score)`` to the probability that the step is valid. ``weight`` 0 is Eq. 4 alone."""
    zero = (chosen.sum() + point_logits.sum()) * 0.0  # keeps the graph when a term is empty
    loss = pairwise_loss(chosen, rejected) if chosen.numel() else zero
    if weight and point_logits.numel():
        loss = loss + weight * nn.functional.binary_cross_entropy_with_logits(point_logits, point_labels)
    return loss


def pair_wins(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Per pair: 1 when the chosen step scores higher, 0.5 on a tie, 0 otherwise (the mean is
    the pairwise accuracy; a tie is a coin flip, as in :func:`~prorag.core.metrics.ranking_auc`)."""
    return (chosen > rejected).float() + 0.5 * (chosen == rejected).float()


class PairwiseRewardTrainer(TrainerKernels, RewardTrainer):
    """TRL's ``RewardTrainer`` with the rewards its PRM's kind reads
    (:meth:`~prorag.supervision.reward_model.ProcessRewardModel.pair_logits`: the head at the last
    attended token, or the step's scaled mean likelihood) and per-pair metrics (see the module
    docstring for why). ``scorer`` is the PRM being trained (its model is the trainer's)."""

    def __init__(self, *args: Any, scorer: ProcessRewardModel, pointwise_weight: float = 0.0, **kwargs: Any) -> None:
        self.scorer = scorer
        self.pointwise_weight = float(pointwise_weight)
        super().__init__(*args, **kwargs)

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        mode = "train" if self.model.training else "eval"
        rewards = self.scorer.pair_logits(model, inputs["input_ids"], inputs["attention_mask"], inputs["step_lengths"].tolist())
        point_labels = inputs.get("point_labels", rewards.new_zeros(0))
        n_pairs = (len(rewards) - len(point_labels)) // 2
        chosen, rejected, point_logits = rewards[:n_pairs], rewards[n_pairs : 2 * n_pairs], rewards[2 * n_pairs :]
        loss = prm_loss(chosen, rejected, point_logits, point_labels.to(rewards.dtype), self.pointwise_weight)
        if self.args.center_rewards_coefficient is not None:
            loss = loss + self.args.center_rewards_coefficient * torch.mean((chosen + rejected) ** 2)
        with torch.no_grad():
            if mode == "train":
                n_tokens = self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
                self._total_train_tokens += n_tokens
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            wins = self.accelerator.gather_for_metrics(pair_wins(chosen, rejected))
            margins = self.accelerator.gather_for_metrics(chosen - rejected)
            self._metrics[mode]["accuracy"].extend(wins.tolist())
            self._metrics[mode]["margin"].extend(margins.tolist())
            self._metrics[mode]["mean_reward"].append(rewards.mean().item())
        return (loss, {"logits": torch.stack([chosen, rejected], dim=-1)}) if return_outputs else loss


# ----------------------------------------------------------------------------- the stage


class ValidationSelection(TrainerCallback):
    """Scores the model on the validation pairs at the start of training (step 0) and every
    ``every`` steps and at the end, appends ``validation_accuracy`` / ``validation_auc`` rows to
    ``metrics.jsonl``, and keeps a CPU copy of the weights with the best accuracy, the AUC
    breaking ties (a few hundred validation pairs give coarse accuracies; strictly better
    replaces, so the earliest best wins). :func:`train_prm` loads them back at the end.
    It scores through ``scorer``, whose model is the trainer's."""

    def __init__(self, scorer: ProcessRewardModel, pairs: Sequence[StepPair], every: int, batch_size: int, path: Path) -> None:
        self.scorer = scorer
        self.pairs = list(pairs)
        self.every = int(every)
        self.batch_size = int(batch_size)
        self.path = path
        self.best_accuracy = -1.0
        self.best_auc = -1.0
        self.best_step: int | None = None
        self.best_state: dict[str, torch.Tensor] | None = None
        self.last_step: int | None = None

    def check(self, step: int, epoch: float | None, is_main: bool) -> None:
        metrics = pair_metrics(*held_out_scores(self.scorer, self.pairs, self.batch_size))
        self.last_step = step
        if is_main:
            with JsonlAppender(self.path) as f:
                f.append(
                    {"step": step, "epoch": epoch, "validation_accuracy": metrics["accuracy"], "validation_auc": metrics["auc"]}
                )
        if (metrics["accuracy"], metrics["auc"]) > (self.best_accuracy, self.best_auc):
            self.best_accuracy, self.best_auc, self.best_step = metrics["accuracy"], metrics["auc"], step
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.scorer.model.state_dict().items()}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 0:
            self.check(0, 0.0, state.is_world_process_zero)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.every == 0:
            self.check(state.global_step, state.epoch, state.is_world_process_zero)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.last_step != state.global_step:
            self.check(state.global_step, state.epoch, state.is_world_process_zero)


def prm_training_args(config: PRMConfig, run_dir: str | Path, *, has_eval: bool) -> RewardConfig:
    """TRL's ``RewardConfig`` for ``config``: checkpoints in ``run_dir/checkpoints``, the
    hardware's precision, and no length filter (the examples are already cut from the left)."""
    return RewardConfig(
        **config.training_arguments(run_dir),
        per_device_eval_batch_size=config.eval_batch_size,
        center_rewards_coefficient=config.center_rewards_coefficient,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=(config.eval_steps or config.save_steps) if has_eval else None,
        max_length=None,
        remove_unused_columns=False,
    )


def make_prm_trainer(
    config: PRMConfig,
    run_dir: str | Path,
    scorer: ProcessRewardModel,
    train_examples: list[dict[str, Any]],
    eval_examples: list[dict[str, Any]] | None = None,
    extra_callbacks: Sequence[TrainerCallback] = (),
    *,
    pointwise_weight: float = 0.0,
) -> PairwiseRewardTrainer:
    """The :class:`PairwiseRewardTrainer` of :func:`train_prm` (metrics file and time budget
    included, then ``extra_callbacks``), not yet trained; ``pointwise_weight`` weighs the
    cross-entropy of the pointwise examples among ``train_examples`` (:func:`prm_loss`)."""
    from datasets import Dataset

    run = Path(run_dir)
    if not config.train_backbone:
        scorer.freeze_backbone()
    callbacks: list[TrainerCallback] = [MetricsFile(run / "metrics.jsonl"), *config.time_budget(), *extra_callbacks]
    return PairwiseRewardTrainer(
        model=scorer.model,
        **config.kernel_settings(),
        args=prm_training_args(config, run, has_eval=bool(eval_examples)),
        data_collator=PairCollator(int(scorer.tokenizer.pad_token_id)),
        train_dataset=Dataset.from_list(train_examples),
        eval_dataset=Dataset.from_list(eval_examples) if eval_examples else None,
        processing_class=scorer.tokenizer,
        callbacks=callbacks,
        scorer=scorer,
        pointwise_weight=pointwise_weight,
    )


def held_out_scores(
    scorer: ProcessRewardModel, pairs: Sequence[StepPair], batch_size: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen, rejected)`` logits of ``pairs`` under ``scorer`` (two ``(N,)`` tensors)."""
    contexts = [p.context_ids for p in pairs]
    chosen = scorer.score(contexts, [p.chosen_ids for p in pairs], batch_size)
    rejected = scorer.score(contexts, [p.rejected_ids for p in pairs], batch_size)
    return chosen, rejected


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """Pairwise ``accuracy`` and ``loss`` (Eq. 4) of sibling pairs, mean ``margin``, and the
    ranking ``auc`` of all chosen against all rejected steps (unpaired, across contexts)."""
    return {
        "accuracy": float(pair_wins(chosen, rejected).mean()),
        "loss": float(pairwise_loss(chosen, rejected)),
        "margin": float((chosen - rejected).mean()),
        "auc": ranking_auc(chosen.tolist(), rejected.tolist()),
    }


@torch.inference_mode()
def policy_step_likelihoods(
    model: Any,
    pad_id: int,
    contexts: Sequence[Sequence[int]],
    steps: Sequence[Sequence[int]],
    *,
    max_length: int,
    batch_size: int = 16,
) -> torch.Tensor:
    """Each step's mean per-token log-probability under a causal LM (the policy), given its
    context: ``(N,)`` float32. Inputs are cut from the left as the PRM's are
    (:func:`~prorag.supervision.reward_model.truncate_left`); the mean, not the sum, so that a long step is
    not ranked below a short one for its length. A step whose tokens cannot be predicted (empty,
    or the whole input) scores 0.

    As a scorer of (context, step) pairs this is the free baseline of a PRM: it needs no
    training, and it is what the policy already prefers (and where the likelihood kind of PRM
    starts, with ``beta`` 1 and offset 0)."""
    inputs = [truncate_left(c, s, max_length) for c, s in zip(contexts, steps, strict=True)]
    counts = [step_token_count(len(s), len(ids)) for s, ids in zip(steps, inputs, strict=True)]
    out = torch.zeros(len(inputs), dtype=torch.float32)
    device = next(model.parameters()).device
    for rows in length_batches([len(x) for x in inputs], batch_size):
        ids, mask = pad_batch([inputs[i] for i in rows], pad_id)
        logp = token_logprobs(model, ids.to(device), mask.to(device))
        ends = [len(inputs[i]) for i in rows]
        means = span_means(logp, range(len(rows)), [e - counts[i] for e, i in zip(ends, rows, strict=True)], ends)
        out[torch.tensor(rows)] = means.cpu()
    return out


def step_ranking_audit(scorer: StepScorer, trajectories: Sequence[Trajectory], records: Sequence[Record]) -> dict[str, float]:
    """How the PRM ranks the valid against the invalid steps of trajectories it never saw
    (``trajectories[i]`` answers ``records[i]``; fresh samples of pi_sft): every action is
    labelled by the oracle judge in its context (:func:`prorag.supervision.judge.trajectory_verdicts`), then
    the PRM's logits of the valid ones are compared with those of the invalid ones by ROC AUC.
    Also the share of each class the PRM scores above 0 (the RFT filter's threshold), and
    ``within_question_auc`` / ``within_question_kind_auc`` (:func:`~prorag.core.metrics.grouped_ranking_auc`
    over the steps of one question's samples, and of one step kind among them, with their
    ``_pairs`` counts): the rankings the RL advantage uses, which the global AUC can overstate
    when a scorer mostly tells easy questions from hard ones. NaN where no question has both a
    valid and an invalid step (one sample per question rarely does).

    ``first_error_same`` / ``_prm_earlier`` / ``_prm_later``: the shares of trajectories where the
    first step the PRM scores below 0 is the oracle's first invalid step (none on both sides counts
    as the same), comes before it, or after it (or never): how well ``process_reward:
    prm-first-error`` places the cut that ``oracle-first-error`` places from the gold path."""
    from prorag.supervision.judge import trajectory_verdicts
    from prorag.supervision.step_rewards import ORACLE_INVALID, ORACLE_VALID, first_error_index

    logits = scorer.score_trajectories(trajectories)
    valid: list[float] = []
    invalid: list[float] = []
    # (valid, invalid) scores per question and per (question, step kind): the comparisons the
    # advantage makes (process_norm "group" and "step_kind").
    by_question: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    by_kind: dict[tuple[str, str | None], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    first_errors = Counter[str]()
    skipped = 0
    for traj, record, scores in zip(trajectories, records, logits, strict=True):
        verdicts = trajectory_verdicts(record, traj.text)
        if len(verdicts) != len(scores) or len(traj.actions) != len(scores):  # a lossy decode: no pairing
            skipped += 1
            continue
        never = len(scores)  # "no error" sorts after every step
        prm_first = first_error_index([float(x) for x in scores])
        oracle_first = first_error_index([ORACLE_VALID if ok else ORACLE_INVALID for ok, _ in verdicts])
        prm_at, oracle_at = never if prm_first is None else prm_first, never if oracle_first is None else oracle_first
        first_errors["same" if prm_at == oracle_at else "prm_earlier" if prm_at < oracle_at else "prm_later"] += 1
        for (ok, _), score, action in zip(verdicts, scores, traj.actions, strict=True):
            side = 0 if ok else 1
            (valid if ok else invalid).append(float(score))
            by_question[record.id][side].append(float(score))
            by_kind[(record.id, action.kind)][side].append(float(score))
    out = {
        "trajectories": float(len(trajectories) - skipped),
        "valid_steps": float(len(valid)),
        "invalid_steps": float(len(invalid)),
        "valid_above_0": sum(x > 0 for x in valid) / len(valid) if valid else float("nan"),
        "invalid_above_0": sum(x > 0 for x in invalid) / len(invalid) if invalid else float("nan"),
    }
    out["auc"] = ranking_auc(valid, invalid) if valid and invalid else float("nan")
    audited = sum(first_errors.values())
    for name in ("same", "prm_earlier", "prm_later"):
        out[f"first_error_{name}"] = first_errors[name] / audited if audited else float("nan")
    for name, groups in (("within_question", by_question), ("within_question_kind", by_kind)):
        pairs = sum(len(v) * len(x) for v, x in groups.values())
        out[f"{name}_pairs"] = float(pairs)
        out[f"{name}_auc"] = grouped_ranking_auc(groups.values()) if pairs else float("nan")
    return out


def fresh_sample_audit(
    scorer: StepScorer,
    policy: str | Path,
    records: Sequence[Record],
    retriever: Any,
    *,
    samples: int = 2,
    top_k: int = 3,
    seed: int = 0,
    device: str | None = None,
) -> dict[str, float]:
    """:func:`step_ranking_audit` on ``samples`` fresh trajectories per record sampled from
    ``policy`` (pi_sft) through the rollout engine: how the PRM ranks the valid against the
    invalid steps of trajectories that no stage trained on (questions neither SFT, MCTS nor the
    PRM saw). Also ``policy_likelihood_auc``: the same steps ranked by the policy's own mean
    step log-probability, as recorded at sampling time (the baseline of
    ``eval_policy_likelihood_auc``), and ``policy_likelihood_within_question_auc``, its ranking
    within each question's samples."""
    from prorag.agent.rollout import RolloutConfig, RolloutEngine
    from prorag.agent.sampling import stream_seed
    from prorag.models.checkpoints import load_policy

    model, tokenizer = load_policy(str(policy), device=device)
    engine = RolloutEngine(model, tokenizer, retriever, RolloutConfig(top_k=top_k))
    repeated = [r for r in records for _ in range(samples)]
    # Sample k of a question draws from its own stream: the audit does not change with the batching.
    streams = [stream_seed("prorag-prm-audit", seed, r.id, k) for r in records for k in range(samples)]
    trajectories = engine.rollout(repeated, row_seeds=streams, progress=True)
    del engine, model
    audit = step_ranking_audit(scorer, trajectories, repeated)
    baseline = step_ranking_audit(SampledLikelihood(), trajectories, repeated)
    audit["policy_likelihood_auc"] = baseline["auc"]
    audit["policy_likelihood_within_question_auc"] = baseline["within_question_auc"]
    return audit


class SampledLikelihood:
    """A :class:`~prorag.supervision.reward_model.StepScorer` that scores each action by the mean of the
    log-probabilities the policy gave its tokens when it sampled them (``Trajectory.logprobs``):
    the policy-likelihood baseline of an audit, at no model cost."""

    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        return [
            [
                sum(t.logprobs[a.span[0] : a.span[1]]) / (a.span[1] - a.span[0]) if a.span[1] > a.span[0] else 0.0
                for a in t.actions
            ]
            for t in trajectories
        ]


def likelihood_baseline_metrics(
    init: str | Path, pairs: Sequence[StepPair], scorer: ProcessRewardModel, config: PRMConfig
) -> dict[str, float]:
    """``eval_policy_likelihood_accuracy`` / ``_auc``: ``pairs`` ranked by the init policy's
    :func:`policy_step_likelihoods`, with the PRM's input length."""
    from prorag.models.checkpoints import load_policy

    policy, _ = load_policy(str(init), dtype=config.dtype, device=str(next(scorer.model.parameters()).device))
    policy.eval()
    contexts = [p.context_ids for p in pairs] * 2
    steps = [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]
    pad = int(scorer.tokenizer.pad_token_id)
    logp = policy_step_likelihoods(policy, pad, contexts, steps, max_length=scorer.max_length, batch_size=config.eval_batch_size)
    del policy
    metrics = pair_metrics(logp[: len(pairs)], logp[len(pairs) :])
    return {"eval_policy_likelihood_accuracy": metrics["accuracy"], "eval_policy_likelihood_auc": metrics["auc"]}


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


def resolve_pointwise(config: PRMConfig, points: Sequence[PointStep] | None) -> tuple[list[PointStep], float]:
    """The pointwise labels to train on and their weight: ``points``, else ``config.pointwise_file``,
    else the pairs file's ``NAME.pointwise.jsonl`` when it exists; the weight is
    ``config.pointwise_weight``, or when unset 1.0 for the head kind with labels and 0 otherwise.
    A weight of 0 trains on no label (Eq. 4 alone)."""
    from prorag.stages.pairs import pointwise_file

    if points is None:
        path = config.pointwise_file
        if path is None and config.pairs_file and pointwise_file(config.pairs_file).is_file():
            path = str(pointwise_file(config.pairs_file))
        points = read_pointwise(path) if path else []
    weight = config.pointwise_weight
    if weight is None:
        weight = 1.0 if points and config.kind == "head" else 0.0
    return (list(points) if weight > 0 else []), weight


def train_prm(
    config: PRMConfig,
    run_dir: str | Path,
    *,
    pairs: Sequence[StepPair] | None = None,
    init: str | Path | None = None,
    points: Sequence[PointStep] | None = None,
) -> Path:
    """Run the PRM stage in ``run_dir``; return the saved scorer folder ``run_dir/prm``.

    ``pairs`` (else ``config.pairs_file``) are split by question (:func:`split_by_question`);
    ``init`` (else ``config.init``) is the policy whose backbone the PRM starts from (or whose
    tokenizer a fresh ``backbone_size`` model gets); ``points`` the pointwise labels
    (:func:`resolve_pointwise`), split by the pairs' held-out questions. Resumes
    from the last checkpoint in ``run_dir/checkpoints`` (same config and seed give the same
    split and data order; raise ``max_steps`` to train further). The last line of
    ``metrics.jsonl`` holds the held-out pairwise accuracy, loss and AUC of the saved scorer.
    """
    run = Path(run_dir)
    init, pairs = pair_stage_inputs(config, init, pairs, allow_empty=config.if_no_pairs == "untrained")
    points, pointwise_weight = resolve_pointwise(config, points)
    run.mkdir(parents=True, exist_ok=True)  # only once the inputs passed their checks
    write_json(run / "prm_config.json", asdict(config) | {"init": str(init), "pointwise_weight": pointwise_weight})
    if config.backbone_size is not None:
        model, tokenizer = reward_model_of_size(init, config.backbone_size, dtype=config.dtype, seed=config.seed)
    else:
        model, tokenizer = reward_model_from_policy(init, dtype=config.dtype, seed=config.seed, kind=config.kind)
    positions = getattr(model.config, "max_position_embeddings", None) or config.max_length
    if positions < config.max_length:
        log.info("max_length %d capped at the model's %d positions", config.max_length, positions)
    scorer = ProcessRewardModel(
        model,
        tokenizer,
        max_length=min(config.max_length, positions),
        append_eos=config.append_eos,
        kind=config.kind,
        beta=config.likelihood_beta,
        reference=init,
    )
    if not pairs:
        if config.if_no_pairs == "error":
            raise ValueError("no step pairs to train the PRM on")
        log.warning(
            "no step pairs: saving the PRM untrained (%s; no process signal beyond the init policy's)",
            "a random head on pi_sft's backbone" if config.kind == "head" else f"the {config.kind} kind at its initial weights",
        )
        with JsonlAppender(run / "metrics.jsonl") as f:
            f.append({"step": 0, "untrained": True, "pairs": 0})
        return scorer.save(run / "prm")

    train_pairs, held_out = split_by_question(list(pairs), config.held_out_fraction, config.seed)
    validation: list[StepPair] = []
    if config.validation_fraction > 0:
        train_pairs, validation = split_by_question(train_pairs, config.validation_fraction, config.seed + 1)
    write_json(
        run / "split.json",
        {
            "held_out_questions": sorted({p.question_id for p in held_out}),
            "validation_questions": sorted({p.question_id for p in validation}),
        },
    )
    log.info(
        "step pairs: %d train, %d validation, %d held out (%d questions); judges %s",
        len(train_pairs),
        len(validation),
        len(held_out),
        len({p.question_id for p in held_out}),
        dict(Counter(p.judge for p in pairs)),
    )
    train_examples, stats = pair_examples(train_pairs, scorer)
    eval_examples, eval_stats = pair_examples(held_out, scorer)
    kept_out = {p.question_id for p in [*held_out, *validation]}
    train_points = [p for p in points if p.question_id not in kept_out]
    held_points = [p for p in points if p.question_id in {q.question_id for q in held_out}]
    train_examples += point_examples(train_points, scorer)
    log.info(
        "PRM examples: train %s and %d pointwise labels (weight %g), held out %s",
        stats,
        len(train_points),
        pointwise_weight,
        eval_stats,
    )

    selection = (
        [
            ValidationSelection(
                scorer, validation, config.eval_steps or config.save_steps, config.eval_batch_size, run / "metrics.jsonl"
            )
        ]
        if validation
        else []
    )
    trainer = make_prm_trainer(config, run, scorer, train_examples, eval_examples, selection, pointwise_weight=pointwise_weight)
    resume_training(trainer, run, "PRM training")

    out = run / "prm"
    trainer.accelerator.wait_for_everyone()
    if not trainer.is_world_process_zero():
        return out
    scorer.model = trainer.accelerator.unwrap_model(trainer.model)
    scorer.model.eval()
    if selection and selection[0].best_state is not None:
        chosen_step = selection[0].best_step
        if chosen_step != trainer.state.global_step:
            scorer.model.load_state_dict(selection[0].best_state)
        log.info("kept the weights of step %s (validation accuracy %.3f)", chosen_step, selection[0].best_accuracy)
    if scorer.needs_zero_point and train_pairs:
        scorer.fit_zero_point(*held_out_scores(scorer, train_pairs, config.eval_batch_size))
    if held_out:
        chosen, rejected = held_out_scores(scorer, held_out, config.eval_batch_size)
        row = {"step": trainer.state.global_step, "epoch": trainer.state.epoch}
        row |= {f"eval_{k}": v for k, v in pair_metrics(chosen, rejected).items()}
        row["eval_pairs"] = len(held_out)
        row |= scorer.summary()
        if selection:
            row["selected_step"] = selection[0].best_step
            row["validation_accuracy"] = selection[0].best_accuracy
        if held_points:
            row |= pointwise_metrics(scorer, held_points, config.eval_batch_size)
        if config.likelihood_baseline:
            row |= likelihood_baseline_metrics(init, held_out, scorer, config)
        with JsonlAppender(run / "metrics.jsonl") as f:
            f.append(row)
        log.info("held-out pairs: accuracy %.3f, loss %.4f, AUC %.3f", row["eval_accuracy"], row["eval_loss"], row["eval_auc"])
        if config.likelihood_baseline:
            log.info(
                "held-out pairs ranked by the init policy's step likelihood: accuracy %.3f, AUC %.3f",
                row["eval_policy_likelihood_accuracy"],
                row["eval_policy_likelihood_auc"],
            )
    scorer.save(out)
    write_prm_summary(run)
    return out


def pointwise_metrics(scorer: ProcessRewardModel, points: Sequence[PointStep], batch_size: int = 32) -> dict[str, float]:
    """Held-out pointwise labels ranked by the PRM across contexts: ``eval_pointwise_auc`` (valid
    against invalid steps) and ``eval_pointwise_points``."""
    logits = scorer.score([p.context_ids for p in points], [p.step_ids for p in points], batch_size).tolist()
    valid = [x for x, p in zip(logits, points, strict=True) if p.label]
    invalid = [x for x, p in zip(logits, points, strict=True) if not p.label]
    auc = ranking_auc(valid, invalid) if valid and invalid else float("nan")
    return {"eval_pointwise_auc": auc, "eval_pointwise_points": float(len(points))}


#: (what is compared, the PRM's number, the init policy likelihood's number): the comparisons of
#: :func:`likelihood_verdict`, keys of the held-out metrics row and of the audit.
VERDICT_CHECKS: tuple[tuple[str, str, str], ...] = (
    ("held_out_accuracy", "eval_accuracy", "eval_policy_likelihood_accuracy"),
    ("held_out_auc", "eval_auc", "eval_policy_likelihood_auc"),
    ("fresh_sample_auc", "auc", "policy_likelihood_auc"),
)


#: How much a PRM's accuracy or AUC must exceed the likelihood's to count as beating it: about
#: one standard error of an AUC on a few hundred steps per class (Hanley-McNeil), so a PRM that
#: kept its initial weights (equal to the likelihood up to float noise) does not "beat" it.
VERDICT_MARGIN = 0.01


def likelihood_verdict(
    held_out: dict[str, Any] | None, audit: dict[str, Any] | None, margin: float = VERDICT_MARGIN
) -> dict[str, Any]:
    """Whether the PRM beats the init policy's own step likelihood, per comparison: held-out
    pairs' accuracy and AUC (``held_out``: the last metrics row of :func:`train_prm`) and the
    fresh-sample AUC (``audit``: :func:`fresh_sample_audit`). Each is ``{"prm", "likelihood",
    "beats"}``, ``beats`` greater by more than ``margin`` (a tie, or a float-noise difference,
    has learned nothing beyond the policy), None when a number is missing or NaN; ``beats_all``
    is True only when all three are True."""

    def number(source: dict[str, Any] | None, key: str) -> float | None:
        value = (source or {}).get(key)
        return float(value) if isinstance(value, int | float) and value == value else None

    out: dict[str, Any] = {}
    for name, prm_key, base_key in VERDICT_CHECKS:
        source = audit if name.startswith("fresh") else held_out
        prm, base = number(source, prm_key), number(source, base_key)
        out[name] = {"prm": prm, "likelihood": base, "beats": None if prm is None or base is None else prm > base + margin}
    out["beats_all"] = all(out[name]["beats"] is True for name, _, _ in VERDICT_CHECKS)
    out["margin"] = margin
    return out


def write_prm_summary(
    run_dir: str | Path, audit: dict[str, Any] | None = None, audit_source: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``RUN/summary.json``: :func:`likelihood_verdict` of a PRM run folder, from the last
    held-out row of ``metrics.jsonl`` and ``audit`` (else ``RUN/audit.json`` when the audit has
    run: the pipeline's ``prm-audit`` stage, ``prorag prm-audit``).

    The fresh-sample check depends on which policy was sampled, on which questions and how
    many times, so the summary says where its audit came from (``audit_source``: what the caller
    passes, or ``{"file": "audit.json"}`` for the run folder's own audit): an audit on RL's groups
    from pi_rft and the pipeline's on pi_sft's dev samples are different verdicts, and a reader of
    ``summary.json`` alone must be able to tell them apart."""
    run = Path(run_dir)
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "eval_accuracy" in r] if (run / "metrics.jsonl").is_file() else []
    if audit is None and (run / "audit.json").is_file():
        audit = read_json(run / "audit.json")
        audit_source = audit_source or {"file": "audit.json"}
    summary = likelihood_verdict(rows[-1] if rows else None, audit)
    if audit is not None:
        summary["audit_source"] = audit_source
    write_json(run / "summary.json", summary)
    return summary


__all__ = [
    "PRMConfig",
    "PointStep",
    "VERDICT_CHECKS",
    "likelihood_verdict",
    "point_examples",
    "pointwise_metrics",
    "prm_loss",
    "read_pointwise",
    "resolve_pointwise",
    "write_prm_summary",
    "PairCollator",
    "PairwiseRewardTrainer",
    "SampledLikelihood",
    "StepPair",
    "ValidationSelection",
    "check_vocabulary",
    "held_out_scores",
    "make_prm_trainer",
    "pair_examples",
    "pair_metrics",
    "pair_stage_inputs",
    "step_ranking_audit",
    "fresh_sample_audit",
    "likelihood_baseline_metrics",
    "pair_wins",
    "pairwise_loss",
    "policy_step_likelihoods",
    "parse_step_pair",
    "prm_training_args",
    "read_step_pairs",
    "separating_threshold",
    "split_by_question",
    "train_prm",
]
