"""Stage 1 of ProRAG: supervised warm-up with the format-aware loss (docs/METHOD.md §2, Eq. 1) -> ``pi_sft``.

One gold trajectory (:mod:`prorag.agent.gold`) is one example trained in one pass: the prompt is
exactly the rollout engine's and the completion is tokenised segment by segment as the engine does,
so training text equals inference text token for token. The loss mask is 0 on the prompt and every
environment segment (``<retrieval>``, environment-written ``<step>`` openers); every action is a
target at once, equivalent to the paper's (context, action) pairs and cheaper.

:class:`WeightedSFTTrainer` subclasses TRL's ``SFTTrainer`` (trl==1.16.0) with the dataset already
tokenised (``skip_prepare_dataset``, no packing, our collator) and three overrides: ``compute_loss``
(per-token weights; the fused LM head on CUDA avoids ``(B, T, V)`` logits),
``_get_num_items_in_batch`` (the normaliser spans every micro-batch and process of an optimiser
step, so N processes train as one would: ``test_one_and_two_processes_train_alike``) and
``_get_train_sampler`` (length grouping over all processes). Writes ``sft_config.json``,
``checkpoints/``, ``metrics.jsonl`` (with a last held-out ``format_valid_rate``) and ``policy/``.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import TrainerCallback
from transformers.trainer_pt_utils import LengthGroupedSampler
from trl import SFTConfig as TRLSFTConfig
from trl import SFTTrainer

from prorag.agent.gold import GoldTrajectory, render_gold, tokenize_segments
from prorag.agent.prompts import PromptStyle, prompt_token_ids
from prorag.data.jsonl import JsonlAppender, read_jsonl, write_json, write_jsonl
from prorag.data.records import Record, read_records
from prorag.method.losses import (
    Reduction,
    format_token_weights,
    loss_normalizer,
    reduce_weighted_nll,
    tag_weight_table,
    token_nll,
)
from prorag.retrieval.base import Retriever
from prorag.stages.sft_config import BUILTIN_MODELS, SFTConfig, SFTTrainingConfig
from prorag.stages.training import MetricsFile, TrainerKernels, resume_training, save_trained_policy, time_budget

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- data


def gold_from_dict(d: Mapping[str, Any]) -> GoldTrajectory:
    """A :class:`~prorag.agent.gold.GoldTrajectory` from its ``to_dict`` form."""
    return GoldTrajectory(
        id=str(d["id"]),
        question=str(d["question"]),
        segments=[(str(text), bool(by_model)) for text, by_model in d["segments"]],
        answer=str(d["answer"]),
        missing_gold=list(d.get("missing_gold") or []),
        retrievals=list(d.get("retrievals") or []),
        prompt=d.get("prompt"),
    )


def load_trajectories(
    path: str | Path, retriever: Retriever | None = None, top_k: int = 3
) -> tuple[list[GoldTrajectory], list[Record] | None]:
    """Read a JSONL file of gold trajectories, or of records rendered on the fly with ``retriever``.

    Returns the trajectories and, for a record file, the records (they carry the retrieval
    partitions that held-out rollouts need). Records without a gold decomposition are skipped
    by :func:`~prorag.agent.gold.render_gold`.
    """
    rows = list(read_jsonl(path))
    if not rows:
        raise ValueError(f"{path}: no rows")
    if "segments" in rows[0]:
        return [gold_from_dict(r) for r in rows], None
    records = [Record.from_dict(r, where=f"{path}:{n}") for n, r in enumerate(rows, start=1)]
    if retriever is None:
        raise ValueError(f"{path} holds records; rendering them into gold trajectories needs a retriever (set `index`)")
    return render_gold(records, retriever, k=top_k), records


def build_sft_examples(
    trajectories: Sequence[GoldTrajectory],
    tokenizer: Any,
    tag_weights: Mapping[int, float],
    *,
    prompt_style: PromptStyle | None = None,
    max_length: int | None = None,
    overlong: Literal["drop", "truncate"] = "drop",
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One example per trajectory: ``{"id", "input_ids", "loss_mask", "loss_weights", "length"}``.

    ``input_ids`` = prompt ids + completion ids; ``loss_mask`` is 0 on the prompt and on
    environment segments, 1 on model-written segments; ``loss_weights`` =
    :func:`~prorag.method.losses.format_token_weights` of them. Returns the examples and counts
    (``kept``, ``dropped_overlong``, ``truncated``, ``no_target``).
    """
    if overlong not in ("drop", "truncate"):
        raise ValueError(f"overlong must be 'drop' or 'truncate', got {overlong!r}")
    out: list[dict[str, Any]] = []
    stats = {"kept": 0, "dropped_overlong": 0, "truncated": 0, "no_target": 0}
    for traj in trajectories:
        if traj.prompt is not None:  # a trained baseline's own prompt
            prompt = tokenizer(traj.prompt, add_special_tokens=False)["input_ids"]
        else:
            prompt = prompt_token_ids(tokenizer, traj.question, prompt_style)
        completion, env = tokenize_segments(tokenizer, traj.segments)
        ids = prompt + completion
        mask = [0] * len(prompt) + env
        if max_length is not None and len(ids) > max_length:
            if overlong == "drop":
                stats["dropped_overlong"] += 1
                continue
            ids, mask = ids[:max_length], mask[:max_length]
            stats["truncated"] += 1
        if not any(mask):
            stats["no_target"] += 1
            continue
        weights = format_token_weights(torch.tensor([ids]), torch.tensor([mask]), tag_weights)[0]
        out.append({"id": traj.id, "input_ids": ids, "loss_mask": mask, "loss_weights": weights.tolist(), "length": len(ids)})
        stats["kept"] += 1
    return out, stats


@dataclass
class WeightedSFTCollator:
    """Pads a list of examples on the right: ``input_ids`` with ``pad_token_id``,
    ``attention_mask`` 1/0, ``loss_weights`` with 0 (a pad is never a target)."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        width = max(len(e["input_ids"]) for e in examples)
        if self.pad_to_multiple_of:
            width = math.ceil(width / self.pad_to_multiple_of) * self.pad_to_multiple_of
        B = len(examples)
        ids = torch.full((B, width), int(self.pad_token_id), dtype=torch.long)
        attention = torch.zeros((B, width), dtype=torch.long)
        weights = torch.zeros((B, width), dtype=torch.float32)
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            if len(e["loss_weights"]) != n:
                raise ValueError(f"example {i}: {n} ids but {len(e['loss_weights'])} weights")
            ids[i, :n] = torch.as_tensor(e["input_ids"], dtype=torch.long)
            attention[i, :n] = 1
            weights[i, :n] = torch.as_tensor(e["loss_weights"], dtype=torch.float32)
        return {"input_ids": ids, "attention_mask": attention, "loss_weights": weights}


# ----------------------------------------------------------------------------- trainer


def target_nll(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, weights: torch.Tensor, *, fused: bool
) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
    """Next-token NLLs ``(B, T - 1)`` of a weighted batch, the top-1 hits on its targets (positive
    weights; ``None`` where the fused head does not report them) and the model's output.

    ``fused``: through the fused LM head TRL patches into the model (labels -100 off the targets),
    which never builds the ``(B, T, V)`` logits; its NLLs are 0 off the targets, where every use of
    them is masked. Else the plain forward and :func:`~prorag.method.losses.token_nll`."""
    target = weights[:, 1:] > 0
    if fused:
        labels = torch.where(weights > 0, input_ids, torch.full_like(input_ids, -100))
        outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        correct = outputs.is_top1.bool() & target if outputs.is_top1 is not None else None
        return -outputs.log_probs, correct, outputs
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    with torch.no_grad():
        correct = (outputs.logits[:, :-1].argmax(-1) == input_ids[:, 1:]) & target
    return token_nll(outputs.logits, input_ids), correct, outputs


def length_group_size(args: Any) -> int:
    """The batch whose examples ``group_by_length`` sorts by length together: one optimiser
    step's examples over every process (``train_batch_size * world_size * accumulation``).

    Trainer gives its ``LengthGroupedSampler`` one process's batch, and the sampler's
    megabatches (up to 50 batches, or a quarter of the data, sorted by length) are multiples of
    it: with two processes at half the per-device batch the data order would change. With the
    global batch the sampler yields the same sequence whatever the number of processes (and, on
    one process, the one it always did), and accelerate cuts it into the same steps.
    """
    return int(args.train_batch_size) * max(1, int(args.world_size)) * int(args.gradient_accumulation_steps)


class WeightedSFTTrainer(TrainerKernels, SFTTrainer):
    """TRL's ``SFTTrainer`` with the format-aware loss (see the module docstring for why each
    override is needed). Batches are :class:`WeightedSFTCollator`'s; ``reduction`` picks the
    loss's reduction.

    ``fused_lm_head``: compute the target log-probabilities with the fused LM head TRL patches
    into the model (``model(..., labels=..., fused_lm_head=True)``), which never builds the
    ``(B, T, V)`` logits: with a 150k vocabulary those are gigabytes per batch. The labels
    passed to it are the ids where the weight is positive and -100 elsewhere; the weights are
    then applied by :func:`~prorag.method.losses.reduce_weighted_nll`, the same reduction as
    :func:`~prorag.method.losses.weighted_lm_loss`. Off: the plain forward and ``weighted_lm_loss``
    on its logits (on CPU TRL's fused head scores every position anyway, so it saves memory
    but no time).
    """

    #: ``compute_loss`` divides by the normaliser of the whole accumulated batch already.
    loss_is_scaled_for_ga = True

    def __init__(self, *args: Any, reduction: Reduction = "weighted_mean", fused_lm_head: bool = False, **kwargs: Any) -> None:
        self.reduction: Reduction = reduction
        self.fused_lm_head = fused_lm_head
        super().__init__(*args, **kwargs)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        sampler = super()._get_train_sampler(train_dataset)
        if isinstance(sampler, LengthGroupedSampler):
            sampler.batch_size = length_group_size(self.args)
        return sampler

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> torch.Tensor | None:
        if not batch_samples or "loss_weights" not in batch_samples[0]:
            return None
        total = sum(loss_normalizer(b["loss_weights"], self.reduction) for b in batch_samples)
        total = torch.as_tensor(total, dtype=torch.float32).to(device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            total = self.accelerator.gather(total).sum()
        return total

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        mode = "train" if self.model.training else "eval"
        weights = inputs.pop("loss_weights")
        inputs.pop("labels", None)
        input_ids = inputs["input_ids"]
        attention_mask = inputs.get("attention_mask")
        target = weights[:, 1:] > 0
        nll, correct, outputs = target_nll(model, input_ids, attention_mask, weights, fused=self.fused_lm_head)
        loss = reduce_weighted_nll(nll, weights, self.reduction, normalizer=num_items_in_batch)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            # DDP averages gradients over processes; the normaliser already counts every process.
            loss = loss * self.accelerator.num_processes
        with torch.no_grad():
            if correct is not None:
                n = self.accelerator.gather_for_metrics(target.sum()).sum()
                hits = self.accelerator.gather_for_metrics(correct.sum()).sum()
                self._metrics[mode]["mean_token_accuracy"].append((hits / n).item() if n > 0 else 0.0)
            if mode == "train" and attention_mask is not None:
                self._total_train_tokens += int(self.accelerator.gather_for_metrics(attention_mask.sum()).sum().item())
                self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        if return_outputs and self.fused_lm_head:
            with torch.no_grad():  # callers that want outputs want logits
                outputs = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return (loss, outputs) if return_outputs else loss


# ----------------------------------------------------------------------------- the stage


def _load_model(config: SFTConfig, tokenizer: Any) -> tuple[Any, Any]:
    from prorag.data.safetensors_files import check_folder
    from prorag.models.checkpoints import POLICY_REMEDY, as_dtype, load_policy, prepare_policy
    from prorag.models.tags import tag_token_ids
    from prorag.models.tiny import make_tiny_model

    if config.model in BUILTIN_MODELS:
        if tokenizer is None and config.tokenizer is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
        elif tokenizer is None and config.world_dir is not None:
            from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts

            tokenizer = train_world_tokenizer(world_tokenizer_texts(config.world_dir))
        elif tokenizer is None:
            raise ValueError(
                f"model={config.model!r} needs a tokenizer: pass `tokenizer` or set `tokenizer` or `world_dir` in the config"
            )
        tag_token_ids(tokenizer)  # the tags must be single tokens already
        model = make_tiny_model(tokenizer, config.model, arch=config.arch, seed=config.seed)
        return model, tokenizer
    if tokenizer is None:
        return load_policy(config.model, dtype=config.dtype)
    from transformers import AutoModelForCausalLM

    check_folder(config.model, remedy=POLICY_REMEDY)
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=as_dtype(config.dtype))
    prepare_policy(model, tokenizer)
    return model, tokenizer


def _split(trajectories: list[GoldTrajectory], fraction: float, seed: int) -> tuple[list[GoldTrajectory], list[GoldTrajectory]]:
    """Seeded held-out split by question id (at least one held out when ``fraction > 0``)."""
    if fraction <= 0 or len(trajectories) < 2:
        return trajectories, []
    order = sorted(range(len(trajectories)), key=lambda i: trajectories[i].id)
    random.Random(seed).shuffle(order)
    n_eval = min(len(order) - 1, max(1, round(fraction * len(order))))
    held = set(order[:n_eval])
    return [t for i, t in enumerate(trajectories) if i not in held], [t for i, t in enumerate(trajectories) if i in held]


def _dataset(examples: list[dict[str, Any]]) -> Any:
    from datasets import Dataset

    return Dataset.from_list(examples)


def sft_training_args(config: SFTTrainingConfig, run_dir: str | Path, *, has_eval: bool = True) -> TRLSFTConfig:
    """TRL's ``SFTConfig`` for ``config``: checkpoints in ``run_dir/checkpoints``, CPU/bf16 chosen
    from the hardware, and the options that keep TRL from re-tokenising or packing the
    pre-tokenised dataset."""
    return TRLSFTConfig(
        **config.training_arguments(run_dir),
        **config.evaluation_arguments(has_eval),
        train_sampling_strategy="group_by_length" if config.group_by_length else "random",
        dataloader_num_workers=config.dataloader_num_workers,
        # A pre-tokenised dataset with a custom collator: TRL must neither re-tokenise nor pack.
        dataset_kwargs={"skip_prepare_dataset": True},
        remove_unused_columns=False,
        packing=False,
        padding_free=False,
        max_length=config.max_length,
    )


def make_sft_trainer(
    config: SFTTrainingConfig,
    run_dir: str | Path,
    model: Any,
    tokenizer: Any,
    train_examples: list[dict[str, Any]],
    eval_examples: list[dict[str, Any]] | None = None,
    tag_weights: Mapping[int, float] | None = None,
) -> WeightedSFTTrainer:
    """The :class:`WeightedSFTTrainer` of :func:`train_sft` over examples of :func:`build_sft_examples`
    (LoRA, metrics file and time budget included), not yet trained."""
    run = Path(run_dir)
    peft_config = None
    if config.lora.enabled:
        from prorag.models.tags import tag_token_ids

        ids = sorted(tag_weights) if tag_weights else sorted(tag_token_ids(tokenizer).values())
        peft_config = config.lora.peft_config(trainable_token_indices={"embed_tokens": ids})
    callbacks: list[TrainerCallback] = [MetricsFile(run / "metrics.jsonl"), *time_budget(config)]
    return WeightedSFTTrainer(
        model=model,
        **config.kernel_settings(),
        args=sft_training_args(config, run, has_eval=bool(eval_examples)),
        data_collator=WeightedSFTCollator(int(tokenizer.pad_token_id)),
        train_dataset=_dataset(train_examples),
        eval_dataset=_dataset(eval_examples) if eval_examples else None,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
        reduction=config.reduction,
        fused_lm_head=torch.cuda.is_available() if config.fused_lm_head == "auto" else bool(config.fused_lm_head),
    )


def train_sft(
    config: SFTConfig,
    run_dir: str | Path,
    *,
    tokenizer: Any = None,
    trajectories: Sequence[GoldTrajectory] | None = None,
    eval_trajectories: Sequence[GoldTrajectory] | None = None,
    records: Sequence[Record] | None = None,
    retriever: Retriever | None = None,
) -> Path:
    """Run the SFT stage in ``run_dir``; return the saved policy folder ``run_dir/policy``.

    Data: ``trajectories`` (else ``config.train_file``), held out: ``eval_trajectories`` (else
    ``config.eval_file``, else ``config.eval_fraction`` of the training trajectories).
    ``records`` (matched by id) give the held-out rollouts their questions' retrieval partitions
    (a record file supplies them itself); without them a held-out question searches the whole
    corpus. ``retriever`` (else ``config.index``) renders record files and runs the rollouts;
    without one the format-valid rate is skipped with a warning.

    Resumes from the last checkpoint in ``run_dir/checkpoints`` if there is one (global step,
    optimiser, scheduler and data order continue; raise ``max_steps`` to train further).
    """
    run = Path(run_dir)
    if retriever is None and config.index:
        from prorag.retrieval.index import open_retriever

        retriever = open_retriever(config.index)

    # ---- data
    if records is None and config.records_file:
        records = read_records(config.records_file)
    by_id: dict[str, Record] = {r.id: r for r in records or []}
    if trajectories is None:
        if not config.train_file:
            raise ValueError("no training data: pass `trajectories` or set `train_file`")
        trajectories, recs = load_trajectories(config.train_file, retriever, config.top_k)
        by_id.update({r.id: r for r in recs or []})
    train_trajs = list(trajectories)
    if eval_trajectories is not None:
        held_out = list(eval_trajectories)
    elif config.eval_file:
        held_out, recs = load_trajectories(config.eval_file, retriever, config.top_k)
        by_id.update({r.id: r for r in recs or []})
    else:
        train_trajs, held_out = _split(train_trajs, config.eval_fraction, config.seed)
    if config.missing_gold == "drop":
        before = len(train_trajs)
        train_trajs = [t for t in train_trajs if not t.missing_gold]
        log.info("dropped %d of %d training trajectories whose retrieval missed a gold page", before - len(train_trajs), before)

    model, tokenizer = _load_model(config, tokenizer)
    from prorag.models.tags import tag_token_ids

    if config.target != "prorag":
        train_trajs, held_out = (_as_baseline(config, t, by_id, retriever, tokenizer) for t in (train_trajs, held_out))

    table = tag_weight_table(tag_token_ids(tokenizer), config.weight_scheme, config.control_lambda, weights=config.tag_weights)
    build = dict(prompt_style=config.prompt_style, max_length=config.max_length, overlong=config.overlong)
    train_examples, stats = build_sft_examples(train_trajs, tokenizer, table, **build)
    eval_examples, eval_stats = build_sft_examples(held_out, tokenizer, table, **build)
    log.info("SFT examples: train %s, held out %s", stats, eval_stats)
    if not train_examples:
        raise ValueError(f"no training example left ({stats})")

    # ---- trainer (the run folder is written only once the config and the data passed their checks)
    run.mkdir(parents=True, exist_ok=True)
    write_json(run / "sft_config.json", asdict(config))
    trainer = make_sft_trainer(config, run, model, tokenizer, train_examples, eval_examples, table)

    resume_training(trainer, run, "SFT")
    evaluated = [h["step"] for h in trainer.state.log_history if "eval_loss" in h]
    if eval_examples and (not evaluated or evaluated[-1] != trainer.state.global_step):
        trainer.evaluate()  # the held-out loss of the final weights, unless just measured

    out = run / "policy"
    policy = save_trained_policy(trainer, tokenizer, out, merge_lora=config.lora.enabled)
    if policy is None:
        return out

    # ---- format-valid rate of greedy rollouts on held-out questions
    if config.eval_samples > 0:
        row, trajs = _rollout_eval(policy, tokenizer, held_out, by_id, retriever, config)
        row = {"step": trainer.state.global_step, "epoch": trainer.state.epoch, **row}
        if trajs:
            write_jsonl(run / "eval_trajectories.jsonl", (t.to_dict() for t in trajs))
        with JsonlAppender(run / "metrics.jsonl") as f:
            f.append(row)
        log.info("held-out rollouts: %s", json.dumps(row))
    return out


def _as_baseline(
    config: SFTConfig,
    trajectories: Sequence[GoldTrajectory],
    by_id: Mapping[str, Record],
    retriever: Retriever | None,
    tokenizer: Any,
) -> list[GoldTrajectory]:
    """The baseline examples (``config.target``) of the questions of ``trajectories``."""
    from prorag.evaluation.baselines import baseline_trajectories

    missing = [t.id for t in trajectories if t.id not in by_id]
    if missing:
        raise ValueError(
            f"target={config.target!r} needs the record of every question (gold answers, partition), "
            f"but {len(missing)} have none (first: {missing[0]!r}): set `records_file` or train on a record file"
        )
    if config.target == "standard-rag" and retriever is None:
        raise ValueError("target='standard-rag' needs a retriever: pass `retriever` or set `index`")
    return baseline_trajectories(
        config.target, [by_id[t.id] for t in trajectories], retriever, tokenizer, k=config.top_k, style=config.prompt_style
    )


def _rollout_eval(
    model: Any,
    tokenizer: Any,
    held_out: Sequence[GoldTrajectory],
    by_id: Mapping[str, Record],
    retriever: Retriever | None,
    config: SFTConfig,
) -> tuple[dict[str, Any], list[Any]]:
    """Greedy rollouts of the first ``eval_samples`` held-out questions: the I_traj rate (what the
    reference code validates on), EM and F1; returns the metrics and the trajectories."""
    from prorag.agent.rollout import RolloutEngine
    from prorag.core.metrics import answer_metrics
    from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
    from prorag.evaluation.harness import predicted_answer

    if retriever is None:
        log.warning("no retriever (pass `retriever` or set `index`): the format-valid rate is not measured")
        return {"format_valid_rate": None, "eval_samples": 0}, []
    if not held_out:
        log.warning("no held-out questions: the format-valid rate is not measured")
        return {"format_valid_rate": None, "eval_samples": 0}, []
    chosen = list(held_out)[: config.eval_samples]
    recs = [by_id.get(t.id) or Record(t.id, t.question, [t.answer]) for t in chosen]
    baseline = config.target != "prorag"
    settings = EvalConfig(
        baseline=config.target if baseline else None,
        rollout=EvalRolloutConfig(
            top_k=config.top_k, batch_size=config.eval_batch_size, prompt_style=config.prompt_style, seed=config.seed
        ),
    )
    engine = RolloutEngine(model, tokenizer, retriever, settings.rollout_config())
    t0 = time.perf_counter()
    # A baseline answers its own prompt in one action; "valid" for it means it wrote an answer.
    trajs = engine.rollout(recs, prompts=[t.prompt for t in chosen] if baseline else None)
    seconds = time.perf_counter() - t0
    answers = [predicted_answer(t, tokenizer, baseline=baseline) for t in trajs]  # as `prorag eval` reads them
    scores = [answer_metrics(a or "", r.golden_answers) for a, r in zip(answers, recs, strict=True)]
    n = len(trajs)
    return {
        "format_valid_rate": sum((a is not None) if baseline else t.valid for a, t in zip(answers, trajs, strict=True)) / n,
        "eval_em": sum(s["em"] for s in scores) / n,
        "eval_f1": sum(s["f1"] for s in scores) / n,
        "eval_samples": n,
        "eval_rollout_seconds": round(seconds, 2),
    }, trajs


__all__ = [
    "BUILTIN_MODELS",
    "SFTConfig",
    "SFTTrainingConfig",
    "WeightedSFTCollator",
    "WeightedSFTTrainer",
    "build_sft_examples",
    "gold_from_dict",
    "length_group_size",
    "load_trajectories",
    "make_sft_trainer",
    "prompt_token_ids",
    "sft_training_args",
    "target_nll",
    "train_sft",
]
