"""``benchmarks/rl_step.py``'s timed step: the loss part runs under the trainer's attention kernels."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from prorag.core.kernels import training_attention
from prorag.models.tiny import make_tiny_model

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks"


class _CheckpointedTrainer:
    """Just what ``time_step`` calls on a trainer: the loss is a forward of a gradient-checkpointed
    tiny model, run (as the RL trainer's scoring forwards are) under ``training_attention``."""

    cudnn_attention = False

    def __init__(self, model: Any) -> None:
        self.model = model
        self.rollout_func = SimpleNamespace(seconds=0.0)
        self.scorer = None

    def _generate_and_score_completions(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = torch.tensor([row["ids"] for row in rows])
        return {
            "input_ids": ids,
            "prompt_mask": torch.ones_like(ids),
            "completion_mask": torch.ones_like(ids),
            "tool_mask": torch.ones_like(ids),
        }

    def compute_loss(self, model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with training_attention(self.cudnn_attention):
            return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


def test_the_timed_loss_recomputes_its_checkpointed_forwards_under_the_same_attention_kernels(
    world_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With gradient checkpointing the backward recomputes each layer's forward; run outside the
    # trainer's attention block, the recomputation may pick cuDNN's kernel where the forward did not,
    # and on a GPU the backward then fails on tensors that differ from the saved ones (an H200 did).
    # Every attention call, forward and recomputation, must see cuDNN's kernel switched off.
    monkeypatch.syspath_prepend(str(SCRIPTS))
    sys.modules.pop("rl_step", None)
    from rl_step import time_step

    model = make_tiny_model(world_tokenizer)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    seen: list[bool] = []
    attention = [m for name, m in model.named_modules() if name.endswith("self_attn")]
    assert attention
    for module in attention:
        module.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    parts = time_step(_CheckpointedTrainer(model), [{"ids": [5, 6, 7, 8]}, {"ids": [9, 10, 11, 12]}], optimizer)
    assert len(seen) == 2 * len(attention), "each layer ran its forward and its recomputation"
    assert not any(seen), "an attention call ran with cuDNN's kernel allowed"
    assert torch.backends.cuda.cudnn_sdp_enabled()
    assert parts["loss"] >= 0 and parts["tokens"] == 8
