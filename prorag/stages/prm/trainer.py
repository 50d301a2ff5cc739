"""The PRM's trainer: TRL's ``RewardTrainer`` (trl==1.16.0) with one override, ``compute_loss``.

The reward is read where the PRM's kind reads it (the head at the last attention-mask position,
where TRL's read-out is one token early when pad is EOS; or the step's scaled mean likelihood),
:func:`~prorag.stages.prm.loss.prm_loss` is applied, and accuracy and margin are kept per pair
(TRL's per-batch means weigh a short last batch like a full one). :class:`ValidationSelection`
keeps the weights with the best validation accuracy, the initial weights among the candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl import RewardConfig, RewardTrainer

from prorag.data.jsonl import JsonlAppender
from prorag.stages.prm.config import PRMConfig
from prorag.stages.prm.data import PairCollator, StepPair
from prorag.stages.prm.loss import pair_metrics, pair_wins, prm_loss
from prorag.stages.training import MetricsFile, TrainerKernels, time_budget
from prorag.supervision.reward_model import ProcessRewardModel


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


class ValidationSelection(TrainerCallback):
    """Scores the model on the validation pairs at the start of training (step 0) and every
    ``every`` steps and at the end, appends ``validation_accuracy`` / ``validation_auc`` rows to
    ``metrics.jsonl``, and keeps a CPU copy of the weights with the best accuracy, the AUC
    breaking ties (a few hundred validation pairs give coarse accuracies; strictly better
    replaces, so the earliest best wins). :func:`~prorag.stages.prm.run.train_prm` loads them back at the end.
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
    """The :class:`PairwiseRewardTrainer` of :func:`~prorag.stages.prm.run.train_prm` (metrics file and time budget
    included, then ``extra_callbacks``), not yet trained; ``pointwise_weight`` weighs the
    cross-entropy of the pointwise examples among ``train_examples`` (:func:`~prorag.stages.prm.loss.prm_loss`)."""
    from datasets import Dataset

    run = Path(run_dir)
    if not config.train_backbone:
        scorer.freeze_backbone()
    callbacks: list[TrainerCallback] = [MetricsFile(run / "metrics.jsonl"), *time_budget(config), *extra_callbacks]
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
