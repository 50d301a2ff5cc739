"""Packed layouts: sequences first-fit into rows, packed and unpacked back exactly; a tiny model run on
the packed rows (position ids restarting per sequence, no mask) gives each sequence's log-probabilities
and gradients as the padded batch does, for Llama and Qwen3, sdpa and eager attention, and LoRA."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from prorag.models.logprobs import causal_lm_label_logprobs
from prorag.models.packing import (
    first_fit_rows,
    pack_layout,
    packed_label_logprobs,
    packs_in_one_row,
    padding_share,
    real_spans,
)
from prorag.models.tiny import make_tiny_model

#: Left-padded prompts and right-padded completions: real spans [2, 7), [0, 10), [1, 5), [3, 4), none.
ATTENTION = torch.tensor(
    [
        [0, 0, 1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        [0, 1, 1, 1, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
)


def test_first_fit_rows_fill_rows_longest_first() -> None:
    assert first_fit_rows([5, 10, 4, 1, 0], 10) == [[1], [0, 2, 3]]
    assert first_fit_rows([3, 3, 3], 5) == [[0], [1], [2]]
    assert first_fit_rows([7, 2], 4) == [[0], [1]], "a sequence longer than a row gets a row of its own"
    assert first_fit_rows([], 4) == [] and first_fit_rows([0, 0], 4) == []


def test_a_layout_packs_every_real_token_once_and_unpacks_exactly() -> None:
    assert real_spans(ATTENTION) == ([2, 0, 1, 3, 0], [7, 10, 5, 4, 0])
    assert padding_share(ATTENTION) == pytest.approx(1 - 20 / 50)
    values = torch.arange(50).view(5, 10)
    for row_tokens, one_row, rows in ((None, False, 2), (16, False, 2), (20, False, 1), (None, True, 1)):
        layout = pack_layout(ATTENTION, row_tokens, one_row=one_row)
        assert layout.source.shape[0] == rows
        packed = layout.pack(values, -1)
        assert sorted(packed[layout.real].tolist()) == values[ATTENTION.bool()].tolist()
        assert (packed[~layout.real] == -1).all()
        assert torch.equal(layout.unpack(packed, -7), torch.where(ATTENTION.bool(), values, -7))
        # each sequence's positions count from 0, and so does the padding after the last one
        for r in range(rows):
            for b in range(5):
                slots = (layout.source[r] // 10 == b) & layout.real[r]
                assert layout.position_ids[r][slots].tolist() == list(range(int(slots.sum())))
    two = pack_layout(ATTENTION)
    assert two.source.shape == (2, 10) and two.position_ids[1].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 0]


def test_a_row_with_a_gap_cannot_be_packed() -> None:
    with pytest.raises(ValueError, match="one span"):
        pack_layout(torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match="row_tokens must be >= 1"):
        pack_layout(ATTENTION, 0)


def test_which_attention_takes_rows_and_which_one_row(world_tokenizer: Any) -> None:
    model = make_tiny_model(world_tokenizer)
    assert packs_in_one_row(model) is False  # sdpa
    model.config._attn_implementation = "flash_attention_2"
    assert packs_in_one_row(model) and packs_in_one_row(SimpleNamespace(module=model)), "through a DDP-style wrapper too"
    model.config._attn_implementation = "paged|my_kernel"
    with pytest.raises(ValueError, match="cannot keep packed sequences apart"):
        packs_in_one_row(model)


def batch_of(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ATTENTION's batch with random ids and labels on the real tokens after each row's first two."""
    ids = torch.randint(0, vocab, ATTENTION.shape, generator=torch.Generator().manual_seed(0))
    labels = ids.masked_fill(ATTENTION == 0, -100)
    labels[:, :4] = -100  # row 1's first tokens, rows 0 and 2's prompt-like start
    return ids, labels


def chunked_forward(model: Any) -> Any:
    def forward(input_ids: torch.Tensor, labels: torch.Tensor, **inputs: Any) -> tuple[torch.Tensor, None]:
        inputs.pop("use_cache")
        return causal_lm_label_logprobs(model, input_ids, labels, chunk=7, **inputs), None

    return forward


@pytest.mark.parametrize(
    ("arch", "attention", "lora"),
    [("llama", "sdpa", False), ("qwen3", "sdpa", False), ("llama", "eager", False), ("qwen3", "sdpa", True)],
)
@pytest.mark.parametrize("row_tokens", [None, 12], ids=["longest", "rows-of-12"])
def test_packed_log_probabilities_and_gradients_equal_the_padded_batchs(
    world_tokenizer: Any, arch: str, attention: str, lora: bool, row_tokens: int | None
) -> None:
    model = make_tiny_model(world_tokenizer, arch=arch)
    model.config._attn_implementation = attention
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    ids, labels = batch_of(len(world_tokenizer))
    weights = torch.randn(labels[:, 1:].shape, generator=torch.Generator().manual_seed(1))
    layout = pack_layout(ATTENTION, row_tokens, one_row=packs_in_one_row(model))

    packed, _ = packed_label_logprobs(chunked_forward(model), layout, ids, labels, rows=1)
    (packed * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    # the padded batch, positions counting real tokens only (as TRL's left-padded rows shift them:
    # rotary attention depends on relative positions only)
    positions = (ATTENTION.cumsum(-1) - 1).clamp(min=0)
    padded = causal_lm_label_logprobs(model, ids, labels, chunk=None, attention_mask=ATTENTION, position_ids=positions)
    (padded * weights).sum().backward()

    scored = labels[:, 1:] != -100
    assert scored.sum() == 10 and (packed[~scored] == 0).all()
    assert torch.allclose(packed, padded, atol=1e-5)
    assert grads and (not lora or all("lora" in n for n in grads))
    for name, g in grads.items():
        assert torch.allclose(g, dict(model.named_parameters())[name].grad, atol=1e-5), name
