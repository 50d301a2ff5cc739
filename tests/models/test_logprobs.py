"""Chunked log-probabilities equal the direct computation (full logits, log-softmax, gather) in value
and gradient, on hand-made tensors and through a tiny model (LoRA included), and never hold more than
one chunk's logits."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from prorag.models.logprobs import causal_lm_label_logprobs, check_plain_head, chunked_logprobs
from prorag.models.tiny import make_tiny_model


def direct(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logits = head(hidden).float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_equal_the_direct_computation_and_its_gradients(chunk: int | None, temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(13, 8, generator=gen, requires_grad=True)
    head = torch.nn.Linear(8, 21, bias=True)
    with torch.no_grad():
        head.weight.copy_(torch.randn(21, 8, generator=gen))
        head.bias.copy_(torch.randn(21, generator=gen))
    targets = torch.randint(0, 21, (13,), generator=gen)
    weights = torch.randn(13, generator=gen)  # a loss that weighs tokens unequally

    got = chunked_logprobs(hidden, head, targets, chunk=chunk, temperature=temperature)
    (got * weights).sum().backward()
    grads = hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()
    hidden.grad = None
    head.zero_grad()
    want = direct(hidden, head, targets, temperature)
    (want * weights).sum().backward()

    assert got.dtype == torch.float32 and got.shape == (13,)
    assert torch.allclose(got, want, atol=1e-5)
    for g, w in zip(grads, (hidden.grad, head.weight.grad, head.bias.grad), strict=True):
        assert torch.allclose(g, w, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(chunked_logprobs(hidden, head, targets, chunk=chunk, temperature=temperature), want, atol=1e-5)


def test_only_one_chunk_of_logits_is_ever_held() -> None:
    # Every tensor autograd keeps for the backward is recorded: with chunks of 4 tokens none holds
    # more than 4 x vocabulary entries of logits (the direct computation keeps all 64 x vocabulary).
    vocab, tokens = 500, 64
    hidden = torch.randn(tokens, 16, requires_grad=True)
    head = torch.nn.Linear(16, vocab, bias=False)
    targets = torch.randint(0, vocab, (tokens,))

    def largest_saved(fn: Any) -> int:
        sizes: list[int] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            sizes.append(t.numel() if t.shape[-1:] == (vocab,) and t.dim() > 1 else 0)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn().sum().backward()
        return max(sizes)

    assert largest_saved(lambda: chunked_logprobs(hidden, head, targets, chunk=4)) <= 4 * vocab
    assert largest_saved(lambda: direct(hidden, head, targets)) >= tokens * vocab


def test_bad_arguments_are_one_line_errors() -> None:
    head = torch.nn.Linear(4, 5)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        chunked_logprobs(torch.zeros(2, 4), head, torch.zeros(2, dtype=torch.long), chunk=0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        chunked_logprobs(torch.zeros(2, 4), head, torch.zeros(2, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="differ in length"):
        chunked_logprobs(torch.zeros(2, 4), head, torch.zeros(3, dtype=torch.long))


def labelled_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three rows, the last right-padded, the first two tokens of each never a label."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (3, 12), generator=gen)
    attention = torch.ones(3, 12, dtype=torch.long)
    attention[2, 8:] = 0
    labels = ids.masked_fill(attention == 0, -100)
    labels[:, :2] = -100
    return ids, attention, labels


def model_logprobs(
    model: Any, ids: torch.Tensor, attention: torch.Tensor, labels: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The direct computation: the model's full logits, log-softmax, the labels gathered."""
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / temperature
    picked = torch.log_softmax(logits, -1).gather(-1, labels[:, 1:].clamp(min=0)[..., None]).squeeze(-1)
    return torch.where(labels[:, 1:] != -100, picked, torch.zeros_like(picked))


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")  # the adapted head is the tied embedding
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_tiny_models_label_logprobs_and_gradients_equal_its_full_logits(world_tokenizer: Any, lora: bool) -> None:
    model = make_tiny_model(world_tokenizer, arch="qwen3")
    if lora:
        from peft import LoraConfig, get_peft_model

        target = ["q_proj", "v_proj", "lm_head"]  # the head too: it is called as a module, adapter included
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=target, init_lora_weights=False))
    ids, attention, labels = labelled_batch(len(world_tokenizer))
    weights = torch.randn(labels[:, 1:].shape, generator=torch.Generator().manual_seed(2))

    got = causal_lm_label_logprobs(model, ids, labels, chunk=5, temperature=0.8, attention_mask=attention)
    (got * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    want = model_logprobs(model, ids, attention, labels, 0.8)
    (want * weights).sum().backward()

    assert got.shape == (3, 11) and (got[labels[:, 1:] == -100] == 0).all()
    assert torch.allclose(got, want, atol=1e-5)
    assert grads and grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    if lora:
        assert all("lora" in n for n in grads) and any("lm_head" in n for n in grads)
    for name, g in grads.items():
        assert torch.allclose(g, dict(model.named_parameters())[name].grad, atol=1e-5), name


def test_models_that_transform_their_logits_are_refused(world_tokenizer: Any) -> None:
    model = make_tiny_model(world_tokenizer)
    check_plain_head(model)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        check_plain_head(model)
