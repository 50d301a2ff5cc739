"""The PRM stage's entry point, :func:`train_prm`: judged step pairs in, the scorer ``RUN/prm`` out.

Writes ``prm_config.json``, ``split.json``, ``checkpoints/`` (resumed from), ``metrics.jsonl`` (its
last row: the saved scorer's held-out accuracy, loss and AUC beside the init policy's likelihood
baseline, the number to beat), ``prm/`` and ``summary.json``
(:func:`~prorag.stages.prm.verdict.likelihood_verdict`). The likelihood kinds' zero point is fitted
on the *training* pairs, after training. With no pair at all (a policy too weak for any valid
sibling step), ``if_no_pairs: untrained`` saves the PRM as built, so a pipeline with small budgets
goes on.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from prorag.data.jsonl import JsonlAppender, write_json
from prorag.stages.prm.audits import likelihood_baseline_metrics, pointwise_metrics
from prorag.stages.prm.config import PRMConfig
from prorag.stages.prm.data import (
    PointStep,
    StepPair,
    pair_examples,
    pair_stage_inputs,
    point_examples,
    read_pointwise,
    split_by_question,
)
from prorag.stages.prm.loss import pair_metrics
from prorag.stages.prm.trainer import ValidationSelection, held_out_scores, make_prm_trainer
from prorag.stages.prm.verdict import write_prm_summary
from prorag.stages.training import resume_training
from prorag.supervision.reward_model import ProcessRewardModel, reward_model_from_policy, reward_model_of_size

log = logging.getLogger(__name__)


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

    ``pairs`` (else ``config.pairs_file``) are split by question (:func:`~prorag.stages.prm.data.split_by_question`);
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
