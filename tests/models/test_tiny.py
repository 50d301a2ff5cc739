"""Tiny models: measured parameter counts, seeded weights, generation config from the tokenizer."""

from __future__ import annotations

import pytest
import torch

from prorag.models.tags import answer_eos_ids
from prorag.models.tiny import make_tiny_model, tiny_model_config

EXPECTED_PARAMS = {
    ("llama", "tiny"): 1_377_408,
    ("qwen3", "tiny"): 1_377_664,
    ("llama", "small"): 5_573_888,
    ("qwen3", "small"): 5_574_272,
}


@pytest.mark.parametrize(("arch", "size"), list(EXPECTED_PARAMS))
def test_tiny_config_parameter_counts(arch: str, size: str) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    cfg = tiny_model_config(4096, size, arch=arch)
    assert isinstance(cfg, LlamaConfig if arch == "llama" else Qwen3Config)
    assert cfg.max_position_embeddings == 2048 and cfg.tie_word_embeddings
    model = AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert n == EXPECTED_PARAMS[(arch, size)]  # the numbers in tiny_model_config's docstring
    lo, hi = (0.5e6, 1.5e6) if size == "tiny" else (3e6, 6e6)
    assert lo <= n <= hi


def test_tiny_config_rejects_unknown() -> None:
    with pytest.raises(ValueError):
        tiny_model_config(100, "huge")
    with pytest.raises(ValueError):
        tiny_model_config(100, arch="gpt2")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_make_tiny_model(world_tok, arch: str) -> None:
    state = torch.random.get_rng_state()
    model = make_tiny_model(world_tok, arch=arch, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched
    assert model.config.vocab_size == len(world_tok)
    assert model.config.eos_token_id == world_tok.eos_token_id and model.config.pad_token_id == world_tok.pad_token_id
    assert model.generation_config.eos_token_id == answer_eos_ids(world_tok)
    batch = world_tok(["Kothir is a person.", "<step> Who directed Tavor? </step>"], padding=True, return_tensors="pt")
    out = model(**batch)
    assert out.logits.shape == (2, batch["input_ids"].shape[1], len(world_tok))
    same = make_tiny_model(world_tok, arch=arch, seed=3)
    other = make_tiny_model(world_tok, arch=arch, seed=4)
    sd, sd_same, sd_other = model.state_dict(), same.state_dict(), other.state_dict()
    assert all(torch.equal(sd[k], sd_same[k]) for k in sd)
    assert not torch.equal(sd["model.embed_tokens.weight"], sd_other["model.embed_tokens.weight"])
