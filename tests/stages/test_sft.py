"""The SFT stage on the tiny built-in world: examples equal inference text, the trainer's loss is
the format-aware loss, training moves the weights, the policy reloads, and runs resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.gold import GoldTrajectory, render_gold, tokenize_segments
from prorag.agent.rollout import RolloutEngine
from prorag.agent.schema import ANSWER_CLOSE, RETRIEVAL_OPEN, STEP_OPEN
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import Record, read_records
from prorag.method.losses import format_token_weights, tag_weight_table, weighted_lm_loss
from prorag.models.checkpoints import load_policy
from prorag.models.tags import tag_token_ids
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.sft import (
    WeightedSFTCollator,
    build_sft_examples,
    gold_from_dict,
    load_trajectories,
    make_sft_trainer,
    train_sft,
)
from prorag.stages.sft_config import SFTConfig
from prorag.stages.training_config import LoRAConfig

pytestmark = pytest.mark.usefixtures("one_thread")


# The tiny world, its BM25 retriever and its world tokenizer are the session fixtures of
# tests/conftest.py (tiny_world, tiny_retriever, world_tokenizer), under shorter names here.


@pytest.fixture(scope="module")
def world(tiny_world: Path) -> Path:
    return tiny_world


@pytest.fixture(scope="module")
def retriever(tiny_retriever: BM25Retriever) -> BM25Retriever:
    return tiny_retriever


@pytest.fixture(scope="module")
def tokenizer(world_tokenizer: Any) -> Any:
    return world_tokenizer


@pytest.fixture(scope="module")
def records(world: Path) -> list[Record]:
    return read_records(world / "train.jsonl")


@pytest.fixture(scope="module")
def gold(records: list[Record], retriever: BM25Retriever) -> list[GoldTrajectory]:
    return render_gold(records, retriever, k=3)


def fast_config(**kw: Any) -> SFTConfig:
    base = dict(
        model="tiny",
        per_device_batch_size=2,
        learning_rate=3e-3,
        logging_steps=1,
        save_steps=2,
        eval_steps=1000,
        eval_fraction=0.05,
        eval_samples=3,
        eval_batch_size=8,
        max_length=512,
    )
    return SFTConfig(**(base | kw))


# ----------------------------------------------------------------------------- examples


def test_examples_are_the_inference_text(tokenizer: Any, gold: list[GoldTrajectory], retriever: BM25Retriever) -> None:
    table = tag_weight_table(tag_token_ids(tokenizer))
    examples, stats = build_sft_examples(gold[:5], tokenizer, table)
    assert stats["kept"] == 5
    engine = RolloutEngine(make_tiny_model(tokenizer, "tiny"), tokenizer, retriever)
    tags = tag_token_ids(tokenizer)
    for ex, traj in zip(examples, gold[:5], strict=True):
        prompt = engine.prompt_ids(traj.question)
        completion, env = tokenize_segments(tokenizer, traj.segments)
        assert ex["input_ids"] == prompt + completion
        assert ex["loss_mask"] == [0] * len(prompt) + env
        assert tokenizer.decode(ex["input_ids"][len(prompt) :]) == traj.text
        ids, mask, w = ex["input_ids"], ex["loss_mask"], ex["loss_weights"]
        assert len(w) == len(ids) == ex["length"]
        assert all(wt == 0 for wt, m in zip(w, mask, strict=True) if m == 0)
        # Retrieval blocks and the environment's <step> openers are never targets.
        assert all(m == 0 for t, m in zip(ids, mask, strict=True) if t == tags[RETRIEVAL_OPEN])
        assert sum(1 for t, m in zip(ids, mask, strict=True) if t == tags[STEP_OPEN] and m == 1) == 1
        assert ids[-1] == tags[ANSWER_CLOSE] and mask[-1] == 1 and w[-1] == 5.0
        expected = format_token_weights(torch.tensor([ids]), torch.tensor([mask]), table)[0].tolist()
        assert w == expected


def test_overlong_examples_are_dropped_or_cut_on_the_right(tokenizer: Any, gold: list[GoldTrajectory]) -> None:
    table = tag_weight_table(tag_token_ids(tokenizer))
    full, _ = build_sft_examples(gold[:4], tokenizer, table)
    limit = min(e["length"] for e in full) - 1
    dropped, stats = build_sft_examples(gold[:4], tokenizer, table, max_length=limit)
    assert dropped == [] and stats["dropped_overlong"] == 4
    cut, stats = build_sft_examples(gold[:4], tokenizer, table, max_length=limit, overlong="truncate")
    assert stats["truncated"] == 4
    for c, f in zip(cut, full, strict=True):
        assert c["input_ids"] == f["input_ids"][:limit] and c["loss_weights"] == f["loss_weights"][:limit]


def test_collator_pads_right_with_zero_weight() -> None:
    batch = WeightedSFTCollator(pad_token_id=0)(
        [{"input_ids": [5, 6, 7], "loss_weights": [0.0, 1.0, 5.0]}, {"input_ids": [8], "loss_weights": [0.0]}]
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_weights"].tolist() == [[0.0, 1.0, 5.0], [0.0, 0.0, 0.0]]
    assert WeightedSFTCollator(0, pad_to_multiple_of=4)([{"input_ids": [1], "loss_weights": [0.0]}])["input_ids"].shape == (1, 4)


def test_load_trajectories_from_gold_and_record_files(
    tmp_path: Path, world: Path, gold: list[GoldTrajectory], retriever: BM25Retriever
) -> None:
    path = tmp_path / "gold.jsonl"
    write_jsonl(path, (g.to_dict() for g in gold[:3]))
    again, recs = load_trajectories(path)
    assert recs is None and [g.to_dict() for g in again] == [g.to_dict() for g in gold[:3]]
    assert gold_from_dict(gold[0].to_dict()).text == gold[0].text
    rendered, recs = load_trajectories(world / "train.jsonl", retriever, 3)
    assert recs is not None and [g.to_dict() for g in rendered] == [g.to_dict() for g in gold]
    with pytest.raises(ValueError, match="retriever"):
        load_trajectories(world / "train.jsonl")


# ----------------------------------------------------------------------------- the trainer's loss


@pytest.mark.parametrize(
    "scheme,reduction,fused",
    [("reference", "weighted_mean", False), ("paper", "sum", False), ("reference", "weighted_mean", True)],
)
def test_trainer_loss_is_the_weighted_loss(
    tmp_path: Path, tokenizer: Any, gold: list[GoldTrajectory], scheme: str, reduction: str, fused: bool
) -> None:
    """On a fixed batch the trainer's loss is weighted_lm_loss of the model's logits, through
    the plain forward or TRL's fused LM head alike."""
    cfg = fast_config(weight_scheme=scheme, reduction=reduction, control_lambda=4.0, fused_lm_head=fused)
    table = tag_weight_table(tag_token_ids(tokenizer), cfg.weight_scheme, cfg.control_lambda)
    examples, _ = build_sft_examples(gold[:4], tokenizer, table)
    model = make_tiny_model(tokenizer, "tiny")
    trainer = make_sft_trainer(cfg, tmp_path, model, tokenizer, examples, tag_weights=table)
    batch = trainer.data_collator(examples)
    model.eval()
    with torch.no_grad():
        direct = weighted_lm_loss(
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
            batch["input_ids"],
            batch["loss_weights"],
            reduction,
        )
        got = trainer.compute_loss(trainer.model, dict(batch))
        assert got.item() == pytest.approx(direct.item(), rel=1e-5)
        # Gradient accumulation: two micro-batches normalised by the whole batch add up to it.
        halves = [trainer.data_collator(examples[:2]), trainer.data_collator(examples[2:])]
        norm = trainer._get_num_items_in_batch(halves, torch.device("cpu"))
        parts = sum(trainer.compute_loss(trainer.model, dict(h), num_items_in_batch=norm) for h in halves)
        # Padding differs between the halves and the whole batch; the targets do not.
        assert parts.item() == pytest.approx(direct.item(), rel=1e-4)
    assert trainer.loss_is_scaled_for_ga is True
    assert trainer.fused_lm_head is fused
    # The gradients agree too (one backward through each path).
    if fused:
        model.train()
        trainer.compute_loss(trainer.model, dict(batch)).backward()
        fused_grad = model.model.layers[0].mlp.up_proj.weight.grad.clone()
        model.zero_grad()
        weighted_lm_loss(
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
            batch["input_ids"],
            batch["loss_weights"],
        ).backward()
        assert torch.allclose(fused_grad, model.model.layers[0].mlp.up_proj.weight.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("cudnn", [False, True])
def test_a_training_step_runs_with_the_configured_attention_kernels(
    tmp_path: Path, tokenizer: Any, gold: list[GoldTrajectory], cudnn: bool
) -> None:
    """The stage's trainer takes ``cudnn_attention`` from its config: every forward of a real
    training step runs without cuDNN's attention by default (prorag.core.kernels)."""
    cfg = fast_config(cudnn_attention=cudnn)
    table = tag_weight_table(tag_token_ids(tokenizer), cfg.weight_scheme, cfg.control_lambda)
    examples, _ = build_sft_examples(gold[:2], tokenizer, table)
    model = make_tiny_model(tokenizer, "tiny")
    trainer = make_sft_trainer(cfg, tmp_path, model, tokenizer, examples, tag_weights=table)
    seen: list[bool] = []
    hook = model.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    try:
        model.train()
        loss = trainer.training_step(model, dict(trainer.data_collator(examples)))
    finally:
        hook.remove()
    assert torch.isfinite(loss) and seen and set(seen) == {cudnn}


def test_compile_norms_compiles_the_trained_models_norms(tmp_path: Path, tokenizer: Any, gold: list[GoldTrajectory]) -> None:
    """``compile_norms`` reaches the model the stage trains (its RMSNorms, nothing else); off by default."""
    examples, _ = build_sft_examples(gold[:2], tokenizer, tag_weight_table(tag_token_ids(tokenizer), "paper", 4.0))
    for flag in (False, True):
        model = make_tiny_model(tokenizer, "tiny")
        make_sft_trainer(fast_config(compile_norms=flag), tmp_path / str(flag), model, tokenizer, examples)
        compiled = [m for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None]
        norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
        assert norms and compiled == (norms if flag else [])


# ----------------------------------------------------------------------------- training, saving, resuming


def test_train_save_reload_and_resume(
    tmp_path: Path, tokenizer: Any, gold: list[GoldTrajectory], records: list[Record], retriever: BM25Retriever
) -> None:
    run = tmp_path / "run"
    cfg = fast_config(max_steps=4)
    policy = train_sft(cfg, run, tokenizer=tokenizer, trajectories=gold, records=records, retriever=retriever)
    assert policy == run / "policy"
    assert sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    rows = list(read_jsonl(run / "metrics.jsonl"))
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in train_rows)
    assert all({"learning_rate", "epoch", "step"} <= r.keys() for r in train_rows)
    assert any("eval_loss" in r and r["eval_loss"] == r["eval_loss"] for r in rows)  # held-out loss, finite
    final = rows[-1]
    assert final["eval_samples"] == 3 and 0.0 <= final["format_valid_rate"] <= 1.0
    assert len(list(read_jsonl(run / "eval_trajectories.jsonl"))) == 3
    assert json.loads((run / "sft_config.json").read_text())["max_steps"] == 4

    # The saved policy reloads, stops at </answer>, and its weights moved away from the initial ones.
    model, tok = load_policy(str(policy))
    eos = model.generation_config.eos_token_id
    assert tag_token_ids(tok)[ANSWER_CLOSE] in (eos if isinstance(eos, list) else [eos])
    assert not any(p.suffix in (".bin", ".pt", ".pkl") for p in policy.iterdir())
    init = make_tiny_model(tokenizer, "tiny", seed=cfg.seed).state_dict()
    trained = model.state_dict()
    changed = [k for k in init if not torch.equal(init[k], trained[k])]
    assert len(changed) >= len(init) // 2

    # Resume: ask for 6 steps in the same run directory; training continues at step 5.
    cfg6 = fast_config(max_steps=6)
    train_sft(cfg6, run, tokenizer=tokenizer, trajectories=gold, records=records, retriever=retriever)
    rows = list(read_jsonl(run / "metrics.jsonl"))
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
    state = json.loads((run / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3, 4, 5, 6]


def test_lora_policy_is_merged(tmp_path: Path, tokenizer: Any, gold: list[GoldTrajectory]) -> None:
    cfg = fast_config(max_steps=2, lora=LoRAConfig(enabled=True), eval_samples=0, eval_fraction=0.0, warmup_ratio=0.0)
    policy = train_sft(cfg, tmp_path / "lora", tokenizer=tokenizer, trajectories=gold[:8])
    assert not (policy / "adapter_config.json").exists()
    model, _ = load_policy(str(policy))
    assert not any("lora" in k for k in model.state_dict())
    init = make_tiny_model(tokenizer, "tiny", seed=cfg.seed).state_dict()
    assert not torch.equal(
        init["model.layers.0.self_attn.q_proj.weight"], model.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    )


def test_needs_a_tokenizer_for_builtin_models(tmp_path: Path, gold: list[GoldTrajectory]) -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        train_sft(fast_config(max_steps=1), tmp_path, trajectories=gold[:4])


# ----------------------------------------------------------------------------- trained baselines


@pytest.mark.parametrize("kind", ["naive", "standard-rag"])
def test_baseline_examples_are_the_baseline_inference_text(
    kind: str, tokenizer: Any, records: list[Record], retriever: BM25Retriever
) -> None:
    from prorag.evaluation.baselines import baseline_prompts, baseline_trajectories

    trajs = baseline_trajectories(kind, records[:4], retriever, tokenizer, k=2)
    prompts, _ = baseline_prompts(kind, tokenizer, records[:4], retriever, 2, None)
    table = tag_weight_table(tag_token_ids(tokenizer))
    examples, stats = build_sft_examples(trajs, tokenizer, table)
    assert stats["kept"] == 4
    for ex, prompt, record in zip(examples, prompts, records[:4], strict=True):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert ex["input_ids"][: len(p)] == p and not any(ex["loss_mask"][: len(p)])
        target = tokenizer.decode(ex["input_ids"][len(p) :])
        assert target == f"<answer> {record.golden_answers[0]} </answer>"
        assert all(ex["loss_mask"][len(p) :])
    assert ("Doc 1(Title:" in prompts[0]) == (kind == "standard-rag")
    # The prompt survives the trajectory file format.
    assert gold_from_dict(json.loads(json.dumps(trajs[0].to_dict()))).prompt == trajs[0].prompt


def test_train_a_baseline_on_the_same_questions(
    tmp_path: Path, tokenizer: Any, gold: list[GoldTrajectory], records: list[Record], retriever: BM25Retriever
) -> None:
    cfg = fast_config(max_steps=2, target="standard-rag", eval_samples=2)
    policy = train_sft(cfg, tmp_path / "rag", tokenizer=tokenizer, trajectories=gold, records=records, retriever=retriever)
    rows = list(read_jsonl(tmp_path / "rag" / "metrics.jsonl"))
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert rows[-1]["eval_samples"] == 2
    trajs = list(read_jsonl(tmp_path / "rag" / "eval_trajectories.jsonl"))
    assert all(len(t["actions"]) <= 1 for t in trajs)  # one-shot: a single action
    assert (policy / "model.safetensors").exists()
    # Without the records of the questions a baseline cannot be built.
    with pytest.raises(ValueError, match="records_file"):
        train_sft(fast_config(max_steps=1, target="naive"), tmp_path / "naive", tokenizer=tokenizer, trajectories=gold)
