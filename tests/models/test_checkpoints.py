"""Loading and saving policies: safetensors round trip, tags registered on a plain checkpoint,
left padding and generation that stops at ``</answer>``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from prorag.agent.schema import (
    ANSWER_CLOSE,
    STEP_OPEN,
    SUBQUERY_OPEN,
)
from prorag.core.errors import DataError
from prorag.models.checkpoints import load_policy, load_trainable_state, save_policy, save_trainable_state
from prorag.models.tags import tag_token_ids
from prorag.models.tiny import make_tiny_model, tiny_model_config
from prorag.models.world_tokenizer import PAD_TOKEN
from tests.models.checks import any_tokenizer, check_tags_single, folder_files


def test_save_load_round_trip(world_tok, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = make_tiny_model(world_tok, seed=1).eval()
    out = save_policy(model, world_tok, tmp_path / "ckpt")
    names = folder_files(out)
    assert "model.safetensors" in names and "config.json" in names and "generation_config.json" in names
    assert "tokenizer.json" in names
    assert not [n for n in names if n.endswith((".bin", ".pkl", ".pt", ".pth"))]
    assert folder_files(tmp_path) == {"ckpt"}  # no temporary folder left behind

    with caplog.at_level(logging.INFO, logger="prorag.models.checkpoints"):
        loaded, tok = load_policy(str(out))
    assert not caplog.records  # the tags were saved with the tokenizer: nothing to register
    assert tok.backend_tokenizer.to_str() == world_tok.backend_tokenizer.to_str()
    assert tok.padding_side == "left" and tok.pad_token == PAD_TOKEN
    assert tag_token_ids(tok) == tag_token_ids(world_tok)
    assert tag_token_ids(tok)[ANSWER_CLOSE] in loaded.generation_config.eos_token_id
    assert tok.eos_token_id in loaded.generation_config.eos_token_id
    assert loaded.dtype == torch.float32
    ids = torch.tensor([world_tok.encode("<step> Kothir was born in 1960. </step><answer> 1960 </answer>")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)

    # saving again over the folder replaces it atomically
    save_policy(loaded, tok, out)
    assert folder_files(tmp_path) == {"ckpt"}
    again, _ = load_policy(str(out), dtype="bfloat16")
    assert again.dtype == torch.bfloat16


def test_trainable_state_round_trip_puts_one_moment_back(world_tok, tmp_path: Path) -> None:
    model = make_tiny_model(world_tok, seed=1)
    ids = torch.tensor([world_tok.encode("<step> Kothir was born in 1960. </step>")])
    with torch.no_grad():
        before = model(ids).logits
    path = save_trainable_state(model, tmp_path / "best.safetensors")
    assert folder_files(tmp_path) == {"best.safetensors"}  # no temporary file left behind
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
        assert not torch.allclose(model(ids).logits, before)
    assert load_trainable_state(model, path) == len([p for p in model.parameters() if p.requires_grad])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_trainable_state_saves_only_what_trains_and_refuses_another_model(world_tok, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = make_tiny_model(world_tok, seed=1)
    frozen = [n for n, p in model.named_parameters()][:2]
    for n, p in model.named_parameters():
        p.requires_grad_(n not in frozen)
    path = save_trainable_state(model, tmp_path / "part.safetensors")
    saved = load_file(str(path))
    assert set(saved) == {n for n, p in model.named_parameters() if p.requires_grad} and not set(frozen) & set(saved)

    other = make_tiny_model(world_tok, seed=2)  # every parameter trains: the file lacks two
    with pytest.raises(DataError, match="lacks trainable parameters"):
        load_trainable_state(other, path)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameter"):
        save_trainable_state(model, tmp_path / "none.safetensors")


def test_load_policy_registers_tags(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint made with a tokenizer that has no tags and no pad token (any hub model)."""
    from transformers import AutoModelForCausalLM

    tok = any_tokenizer("bytelevel")
    cfg = tiny_model_config(len(tok))
    cfg.eos_token_id = tok.eos_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    old = model.get_input_embeddings().weight.detach().clone()
    model.save_pretrained(tmp_path / "plain")
    tok.save_pretrained(tmp_path / "plain")

    with caplog.at_level(logging.INFO, logger="prorag.models.checkpoints"):
        loaded, ltok = load_policy(str(tmp_path / "plain"))
    assert any("registered 10 trajectory tags" in r.getMessage() for r in caplog.records)
    check_tags_single(ltok)
    assert ltok.pad_token == ltok.eos_token == "<|endoftext|>" and ltok.padding_side == "left"
    w = loaded.get_input_embeddings().weight.detach()
    assert w.shape[0] == len(tok) + 10
    assert torch.equal(w[: len(tok)], old)
    pieces = ltok("<step>", add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert torch.allclose(w[tag_token_ids(ltok)["<step>"]], old[pieces].mean(0), atol=1e-6, rtol=0)
    assert loaded.generation_config.eos_token_id == [ltok.eos_token_id, tag_token_ids(ltok)[ANSWER_CLOSE]]


class _Push:
    """A forward hook on the lm_head that makes ``first`` the top token at the first
    generation step and ``then`` the top token afterwards."""

    def __init__(self, first: int, then: int) -> None:
        self.first, self.then, self.calls = first, then, 0

    def __call__(self, module, args, output):
        want = self.first if self.calls == 0 else self.then
        self.calls += 1
        output = output.clone()
        output[..., want] += 1e4
        return output


def test_generation_stops_at_answer_close(world_tok) -> None:
    model = make_tiny_model(world_tok, seed=0).eval()
    ids = tag_token_ids(world_tok)
    name = world_tok.encode(" Kothir", add_special_tokens=False)[0]
    prompt = world_tok(["<step> Who? </step><answer>"], return_tensors="pt")
    n = prompt["input_ids"].shape[1]

    handle = model.lm_head.register_forward_hook(_Push(name, ids[ANSWER_CLOSE]))
    out = model.generate(**prompt, max_new_tokens=20, do_sample=False)
    handle.remove()
    assert out[0, n:].tolist() == [name, ids[ANSWER_CLOSE]]  # ends right after </answer>
    assert world_tok.decode(out[0, n:]) == " Kothir</answer>"

    # without </answer> among the eos ids the same model would run on to max_new_tokens
    model.generation_config.eos_token_id = [world_tok.eos_token_id]
    handle = model.lm_head.register_forward_hook(_Push(name, ids[ANSWER_CLOSE]))
    out = model.generate(**prompt, max_new_tokens=20, do_sample=False)
    handle.remove()
    assert out.shape[1] == n + 20


def test_generation_batch_left_padded(world_tok, tmp_path: Path) -> None:
    """Left padding (set by load_policy): every row of a batch stops after its </answer>."""
    out_dir = save_policy(make_tiny_model(world_tok, seed=0), world_tok, tmp_path / "p")
    model, tok = load_policy(str(out_dir))
    ids = tag_token_ids(tok)
    batch = tok(
        [STEP_OPEN + " a " + SUBQUERY_OPEN, "<step> a much longer prompt here </step><answer>"], padding=True, return_tensors="pt"
    )
    assert (batch["attention_mask"][:, -1] == 1).all()  # prompts end where generation starts
    handle = model.lm_head.register_forward_hook(_Push(ids[ANSWER_CLOSE], ids[ANSWER_CLOSE]))
    out = model.generate(**batch, max_new_tokens=10, do_sample=False)
    handle.remove()
    n = batch["input_ids"].shape[1]
    assert out[:, n].tolist() == [ids[ANSWER_CLOSE]] * 2 and out.shape[1] == n + 1
