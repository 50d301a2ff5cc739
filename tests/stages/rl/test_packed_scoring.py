"""``packed_scoring``: every forward of the RL step (the loss, pi_old, the reference of ``beta_kl``,
pi_init of ``kl_to_init``) run on packed rows equals the padded path to float tolerance: the
log-probabilities, the loss, its gradients and the logged entropy and KL, under full fine-tuning and
LoRA, on one process and on two."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.data.records import Record, read_records
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.rl import make_rl_trainer
from prorag.stages.training_config import LoRAConfig
from tests.stages.test_rl import GOLD_ROLLOUT, FakePRM, fast_config, replayed, two_groups  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "train.jsonl")[:2]


def packed_forwards(trainer: Any) -> list[tuple[bool, int]]:
    """Records, for every forward of the trainer's policy, whether it ran on packed rows (position ids
    given, no attention mask) and how many rows; returns the list it fills."""
    seen: list[tuple[bool, int]] = []

    def hook(_: Any, args: Any, kwargs: dict[str, Any]) -> None:
        packed = kwargs.get("position_ids") is not None and kwargs.get("attention_mask") is None
        seen.append((packed, kwargs["input_ids"].shape[0]))

    trainer.accelerator.unwrap_model(trainer.model).register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.mark.parametrize(
    ("lora", "beta_kl", "row_tokens", "scoring_rows"),
    [(False, 0.0, None, 1), (True, 0.0, 4096, None), (False, 0.3, 4096, None), (True, 0.3, None, None)],
)
def test_packed_scoring_equals_the_padded_path(
    tmp_path: Path,
    replayed: None,  # noqa: F811 - the fixture
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
    lora: bool,
    beta_kl: float,
    row_tokens: int | None,
    scoring_rows: int | None,
) -> None:
    # num_iterations 2: TRL scores pi_old; beta_kl > 0: it scores the reference (a frozen copy, or the
    # adapter off), which kl_to_init then reuses; else kl_to_init scores pi_init itself. Rows of 4096
    # tokens hold the whole batch: every trajectory shares its row with others; scoring_rows 1: one
    # packed row per forward, each cut to its own fill.
    adapter = LoRAConfig(enabled=True, r=4, alpha=8, dropout=0.0) if lora else LoRAConfig()
    cfg = fast_config(
        rollout=GOLD_ROLLOUT,
        num_iterations=2,
        beta_kl=beta_kl,
        lora=adapter,
        packed_row_tokens=row_tokens,
        scoring_rows=scoring_rows,
    )
    trainer = make_rl_trainer(
        cfg, tmp_path, make_tiny_model(world_tokenizer), world_tokenizer, records, tiny_retriever, FakePRM()
    )
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    with torch.no_grad():  # the policy moved away from pi_init (and a LoRA adapter away from 0)
        gen = torch.Generator().manual_seed(0)
        for p in (p for p in model.parameters() if p.requires_grad):
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.train()
    forwards = packed_forwards(trainer)

    batches = {}
    for packed in (False, True):
        trainer.rl_config = replace(cfg, packed_scoring=packed)
        batches[packed] = trainer._generate_and_score_completions(two_groups(trainer))
    padded, packed = batches[False], batches[True]
    mask = padded["completion_mask"] * padded["tool_mask"]
    retrieved = (mask == 0) & (padded["completion_mask"] == 1)
    assert retrieved.any() and padded["completion_mask"].sum(1).unique().numel() > 1, "retrievals, rows of unequal length"
    keys = ["old_per_token_logps"] + (["ref_per_token_logps"] if beta_kl else [])
    for key in keys:
        assert torch.allclose(packed[key][mask == 1], padded[key][mask == 1], atol=1e-5), key
        # TRL's own forwards of the batch scored the policy's tokens only
        assert (packed[key][retrieved] == 0).all() and (padded[key][retrieved] != 0).any(), key
    kl = trainer._metrics["train"]["kl_to_init"]
    assert kl[-1] == pytest.approx(kl[-2], rel=1e-4) and kl[-1] > 1e-3

    batch = dict(padded, old_per_token_logps=padded["sampling_per_token_logps"] + 0.3 * torch.randn(mask.shape, generator=gen))
    results = {}
    for on in (False, True):
        trainer.rl_config = replace(cfg, packed_scoring=on)
        model.zero_grad(set_to_none=True)
        start = len(forwards)
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
        assert len(forwards) > start and all(packed == on for packed, _ in forwards[start:])
        if on and (row_tokens or scoring_rows):
            assert all(rows == 1 for _, rows in forwards[start:]), "one packed row per forward"
        with trainer._scoring(mask):
            init = trainer._init_logps(batch) if not beta_kl else None
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[on] = loss.detach(), grads, trainer._metrics["train"]["entropy"][-1], init
    (loss, grads, entropy, init), (ref_loss, ref_grads, ref_entropy, ref_init) = results[True], results[False]
    assert torch.allclose(loss, ref_loss, rtol=0, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and grads and (not lora or all("lora" in n for n in grads))
    for name, g in grads.items():
        assert torch.allclose(g, ref_grads[name], rtol=1e-4, atol=1e-6), name
    assert entropy == pytest.approx(ref_entropy, rel=1e-5)
    if init is not None:
        assert torch.allclose(init[mask == 1], ref_init[mask == 1], atol=1e-5)


@pytest.mark.slow
def test_two_packed_processes_train_as_one_padded_process(
    tmp_path: Path, tiny_world: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever
) -> None:
    """`prorag rl` with padded scoring on one process (8 trajectories per device) and with packed
    scoring under `torchrun --nproc_per_node 2` on CPU (gloo, 4 per device), groups of 4 spanning both
    processes, two optimiser steps on one rollout batch (``num_iterations`` 2: pi_old scored too):
    the same logged steps and the same weights up to float noise (as
    tests/stages/test_rl.py::test_one_and_two_processes_train_alike, whose setting this is)."""
    from safetensors.torch import load_file

    from tests.stages.test_rl import one_and_two_process_runs
    from tests.stages.test_sft_cli import assert_same_training, step_metrics

    def extra(n: int) -> str:  # pi_old scored too; packed on two processes, padded on one
        return f"num_iterations: 2\npacked_scoring: {'true' if n == 2 else 'false'}\n"

    policy, runs = one_and_two_process_runs(tmp_path, tiny_world, world_tokenizer, tiny_retriever, extra, port=29547)
    rows = step_metrics(runs[2])
    assert [r["step"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows), "both steps carry signal"
    keys = ("loss", "grad_norm", "entropy")  # logged at every step (the rest with each rollout batch)
    assert_same_training(runs[1], runs[2], load_file(policy / "model.safetensors"), keys, weight_atol=3e-4)
    one = step_metrics(runs[1])[0]  # the rollout batch's own metrics, logged with its first step
    for key in ("outcome_reward", "process_reward", "kl_to_init", "num_tokens"):
        assert rows[0][key] == pytest.approx(one[key], rel=1e-3, abs=1e-5), key
