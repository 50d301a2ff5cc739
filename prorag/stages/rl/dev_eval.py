"""Greedy evaluations on a fixed dev set while RL trains (``eval_every``), and the weights they
choose (``select_policy: best_dev``): :func:`dev_best` takes the highest dev EM, ties to the
earlier step, step 0 (the initial policy) included: early stopping chosen on dev, never on test.
The dev-best weights (trainable parameters only) and every evaluation's scores are kept in
``dev_eval/best.safetensors`` and ``dev_eval/best.json`` while training runs, so a resumed run
knows them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from trl.models import unwrap_model_for_generation

from prorag.data.jsonl import read_json, write_json
from prorag.data.records import Record
from prorag.evaluation.eval_config import EvalConfig
from prorag.evaluation.harness import evaluate
from prorag.models.checkpoints import load_trainable_state, save_trainable_state
from prorag.retrieval.base import Retriever
from prorag.stages.rl.trainer import ProcessSupervisedGRPOTrainer


def dev_best(evaluations: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The evaluation to keep among ``evaluations`` (``{"step", "eval_em", ...}`` each): the highest
    dev EM, ties to the earlier step.

    EM is the metric the tables report, so it is the one early stopping optimises; the tie goes to
    the step nearer the initial policy, the smaller change that did as well. Step 0 (the initial
    policy) competes like any other: RL that never beats it on dev gives it back."""
    if not evaluations:
        raise ValueError("no dev evaluation to select from")
    return max(sorted(evaluations, key=lambda e: e["step"]), key=lambda e: e["eval_em"])


def dev_selection(run_dir: str | Path) -> dict[str, Any] | None:
    """The evaluation whose weights a ``select_policy="best_dev"`` run's ``policy/`` holds
    (``{"step", "eval_em", "eval_f1"}``, from ``dev_eval/best.json``); ``None`` for another run."""
    path = Path(run_dir) / "dev_eval" / "best.json"
    return read_json(path)["best"] if path.is_file() else None


class DevEvaluation(TrainerCallback):
    """Greedy evaluation of the policy on a fixed dev set (:func:`~prorag.evaluation.harness.evaluate`)
    before the first step, every ``every`` optimiser steps and at the last; ``eval_em`` and
    ``eval_f1`` go into that step's log row (so ``metrics.jsonl`` and the learning curve) and each
    evaluation's files into ``out_dir/step-N/`` (a resumed run reuses a finished one).

    With ``keep_best`` it also keeps the weights of the :func:`dev_best` evaluation so far in
    ``out_dir/best.safetensors`` (the trainable parameters only) and its step and scores, with every
    evaluation's, in ``out_dir/best.json``; a resumed run reads them back. :meth:`restore_best` puts
    those weights into the model once training is over."""

    def __init__(
        self,
        trainer: ProcessSupervisedGRPOTrainer,
        records: Sequence[Record],
        retriever: Retriever,
        config: EvalConfig,
        every: int,
        out_dir: Path,
        *,
        keep_best: bool = False,
    ) -> None:
        self.trainer, self.records, self.retriever = trainer, list(records), retriever
        self.config, self.every, self.out_dir, self.keep_best = config, every, out_dir, keep_best
        self.evaluations: list[dict[str, Any]] = []
        if keep_best and (out_dir / "best.json").is_file() and (out_dir / "best.safetensors").is_file():
            self.evaluations = list(read_json(out_dir / "best.json")["evaluations"])

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Add the evaluation of ``step``; when it is the new :func:`dev_best`, save the current
        weights (a resumed run evaluating a step again replaces its earlier entry)."""
        self.evaluations = [e for e in self.evaluations if e["step"] != step] + [{"step": step, **metrics}]
        best = dev_best(self.evaluations)
        if best["step"] == step:
            save_trainable_state(self.trainer.accelerator.unwrap_model(self.trainer.model), self.out_dir / "best.safetensors")
        write_json(self.out_dir / "best.json", {"best": best, "evaluations": sorted(self.evaluations, key=lambda e: e["step"])})

    def restore_best(self) -> dict[str, Any]:
        """Load the dev-best weights into the trainer's model (main process); return that evaluation."""
        best = dev_best(self.evaluations)
        load_trainable_state(self.trainer.accelerator.unwrap_model(self.trainer.model), self.out_dir / "best.safetensors")
        return best

    def run(self, step: int) -> dict[str, float]:
        """Evaluate the current policy on the main process (the others wait: one set of files, and
        only the main process logs; so not under DeepSpeed ZeRO-3, whose parameter gather needs every
        process); ``{"eval_em", "eval_f1"}`` there, ``{}`` elsewhere."""
        trainer = self.trainer
        if not trainer.accelerator.is_main_process:
            trainer.accelerator.wait_for_everyone()
            return {}
        was_training = trainer.model.training
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation
        ) as model:
            metrics = evaluate(
                model,
                trainer.processing_class,
                self.records,
                self.retriever,
                self.out_dir / f"step-{step}",
                self.config,
                progress=False,
            )
        trainer.model.train(was_training)
        scores = {"eval_em": metrics["em"], "eval_f1": metrics["f1"]}
        if self.keep_best:
            self.record(step, scores)
        trainer.accelerator.wait_for_everyone()
        return scores

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 0:
            self.trainer.pending_logs.update(self.run(0))
            self.trainer.log({})

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step % self.every == 0 or state.global_step >= state.max_steps:
            self.trainer.pending_logs.update(self.run(state.global_step))
            control.should_log = True
        return control


__all__ = [
    "DevEvaluation",
    "dev_best",
    "dev_selection",
]
