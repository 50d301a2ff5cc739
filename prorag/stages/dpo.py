"""The offline process-supervision baseline: ReasonRAG-style DPO of ``pi_sft`` on the MCTS sibling pairs.

ReasonRAG turns MCTS-built step preferences into static DPO data; ProRAG's Table 1 compares it with
process-supervised RL. Here it trains on the very pairs the PRM trains on (``prorag pairs``, read and
checked by :func:`~prorag.stages.prm.read_step_pairs`): the prompt is the shared prefix of the two
siblings (the rollout's prompt and every action and retrieval before the step), chosen and rejected are
the two sibling steps, all as the token ids the policy wrote them in the rollout. Training is TRL's
``DPOTrainer`` (trl==1.16.0) with one override: the examples are already token ids, so TRL's text path
(which would re-tokenise and append EOS after every step, something the policy never writes mid-trajectory)
is skipped. Writes ``dpo_config.json``, ``dpo_pairs.jsonl`` (the examples, readable), ``checkpoints/``,
``metrics.jsonl`` and ``policy/`` (evaluated like pi_sft and pi_rft).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trl import DPOConfig as TRLDPOConfig
from trl import DPOTrainer

from prorag.data.jsonl import write_json, write_jsonl
from prorag.stages.dpo_config import DPOConfig
from prorag.stages.prm import StepPair, check_vocabulary, pair_stage_inputs
from prorag.stages.training import MetricsFile, TrainerKernels, resume_training, save_trained_policy, time_budget

log = logging.getLogger(__name__)

#: The columns :class:`StepDPOTrainer` trains on (TRL's tokenised preference format).
ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")


# ----------------------------------------------------------------------------- data


def dpo_example(pair: StepPair, tokenizer: Any, max_length: int) -> dict[str, Any] | None:
    """One DPO example of a step pair: ``prompt_ids`` (the context: rollout prompt and history up to
    the step), ``chosen_ids`` and ``rejected_ids`` (the sibling steps), and the same as text
    (``prompt``, ``chosen``, ``rejected``; decoded with the tags, as the policy reads them) with ``id``.

    Token ids, not text: the pair's ids are what the policy sampled, and re-tokenising the text could
    merge tokens across the step boundary. The prompt loses its oldest tokens so that prompt + the longer
    step fit ``max_length`` (the steps are the targets); ``None`` when a step alone does not fit."""
    keep = max_length - max(len(pair.chosen_ids), len(pair.rejected_ids))
    if keep < 1:
        return None
    prompt = pair.context_ids[-keep:] if len(pair.context_ids) > keep else list(pair.context_ids)

    def text(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    return {
        "id": pair.id,
        "prompt": text(prompt),
        "chosen": text(pair.chosen_ids),
        "rejected": text(pair.rejected_ids),
        "prompt_ids": list(prompt),
        "chosen_ids": list(pair.chosen_ids),
        "rejected_ids": list(pair.rejected_ids),
    }


def dpo_examples(pairs: Sequence[StepPair], tokenizer: Any, max_length: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """:func:`dpo_example` of every pair, and counts (``pairs``, ``examples``, ``truncated``: prompts cut
    from the left, ``dropped``: a step longer than ``max_length``). ``ValueError`` for a token id outside
    the tokenizer's vocabulary (pairs made with another policy's tokenizer)."""
    vocab = len(tokenizer)
    out: list[dict[str, Any]] = []
    truncated = dropped = 0
    for pair in pairs:
        check_vocabulary(pair.id, [*pair.context_ids, *pair.chosen_ids, *pair.rejected_ids], vocab, "policy")
        example = dpo_example(pair, tokenizer, max_length)
        if example is None:
            dropped += 1
            continue
        truncated += len(example["prompt_ids"]) < len(pair.context_ids)
        out.append(example)
    return out, {"pairs": len(pairs), "examples": len(out), "truncated": truncated, "dropped": dropped}


# ----------------------------------------------------------------------------- training


class StepDPOTrainer(TrainerKernels, DPOTrainer):
    """TRL's ``DPOTrainer`` on examples that are already token ids (:data:`ID_COLUMNS`): its
    dataset preparation (prompt extraction, an EOS appended to every completion, tokenisation) is
    replaced by keeping those columns as they are."""

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        missing = [c for c in ID_COLUMNS if c not in dataset.column_names]
        if missing:
            raise ValueError(f"{dataset_name} dataset lacks the columns {missing}; build it with dpo_examples")
        return dataset.select_columns(list(ID_COLUMNS))


def dpo_training_args(config: DPOConfig, run_dir: str | Path) -> TRLDPOConfig:
    """TRL's ``DPOConfig`` for ``config``: the shared training arguments, ``beta`` and the loss, and
    no length handling (:func:`dpo_examples` already cut the prompts)."""
    return TRLDPOConfig(
        **config.training_arguments(run_dir),
        beta=config.beta,
        loss_type=[config.loss_type],
        max_length=None,
        remove_unused_columns=False,
    )


def make_dpo_trainer(
    config: DPOConfig, run_dir: str | Path, model: Any, ref_model: Any, tokenizer: Any, examples: list[dict[str, Any]]
) -> StepDPOTrainer:
    """The :class:`StepDPOTrainer` of :func:`train_dpo` (metrics file and time budget included), not
    yet trained. ``ref_model`` is the frozen reference (``None`` with LoRA: the adapter-free model)."""
    from datasets import Dataset

    run = Path(run_dir)
    return StepDPOTrainer(
        model=model,
        **config.kernel_settings(),
        ref_model=ref_model,
        args=dpo_training_args(config, run),
        train_dataset=Dataset.from_list([{c: e[c] for c in ID_COLUMNS} for e in examples]),
        processing_class=tokenizer,
        callbacks=[MetricsFile(run / "metrics.jsonl"), *time_budget(config)],
        peft_config=config.lora.peft_config(),
    )


def train_dpo(
    config: DPOConfig, run_dir: str | Path, *, pairs: Sequence[StepPair] | None = None, init: str | Path | None = None
) -> Path:
    """Run the offline DPO baseline in ``run_dir``; return the saved policy folder ``run_dir/policy``.

    ``pairs`` (else ``config.pairs_file``) are the judged sibling pairs; ``init`` (else ``config.init``)
    is the policy trained and, frozen, the reference. Resumes from the last checkpoint in
    ``run_dir/checkpoints`` (same config and seed give the same data order)."""
    from prorag.models.checkpoints import load_policy, save_policy

    run = Path(run_dir)
    init, pairs = pair_stage_inputs(config, init, pairs, allow_empty=config.if_no_pairs == "copy_policy")
    run.mkdir(parents=True, exist_ok=True)  # only once the inputs passed their checks
    write_json(run / "dpo_config.json", asdict(config) | {"init": str(init)})
    model, tokenizer = load_policy(str(init), dtype=config.dtype)
    positions = getattr(model.config, "max_position_embeddings", None) or config.max_length
    examples, stats = dpo_examples(pairs, tokenizer, min(config.max_length, positions))
    write_jsonl(run / "dpo_pairs.jsonl", examples)
    write_json(run / "dpo_counts.json", stats)
    log.info("DPO examples: %s", stats)
    out = run / "policy"
    if not examples:
        if config.if_no_pairs == "error":
            raise ValueError(f"no step pairs to train DPO on ({stats})")
        log.warning("no step pairs (%s): the DPO policy is %s unchanged", stats, init)
        return save_policy(model, tokenizer, out)
    ref_model = None if config.lora.enabled else load_policy(str(init), dtype=config.dtype)[0]
    trainer = make_dpo_trainer(config, run, model, ref_model, tokenizer, examples)
    resume_training(trainer, run, "DPO training")
    save_trained_policy(trainer, tokenizer, out, merge_lora=config.lora.enabled)
    return out


__all__ = [
    "DPOConfig",
    "ID_COLUMNS",
    "StepDPOTrainer",
    "dpo_example",
    "dpo_examples",
    "dpo_training_args",
    "make_dpo_trainer",
    "train_dpo",
]
