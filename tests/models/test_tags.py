"""The ten tags on any tokenizer (byte-level and Metaspace BPEs trained here, no hub access),
the embedding rows they get, and the ids that end generation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from prorag.agent.schema import (
    ANSWER_CLOSE,
    TAGS,
)
from prorag.models.tags import add_tag_tokens, answer_eos_ids, resize_for_tags, spelling_ids, tag_token_ids
from prorag.models.tiny import tiny_model_config
from tests.models.checks import any_tokenizer, check_tags_single


@pytest.mark.parametrize("style", ["bytelevel", "metaspace"])
def test_add_tag_tokens_on_any_tokenizer(style: str) -> None:
    tok = any_tokenizer(style)
    assert len(tok.encode("<subquery>", add_special_tokens=False)) > 1  # not a token before
    with pytest.raises(ValueError, match="add_tag_tokens"):
        tag_token_ids(tok)
    n = len(tok)
    assert add_tag_tokens(tok) == 10
    assert len(tok) == n + 10
    ids = tag_token_ids(tok)
    check_tags_single(tok)
    # idempotent: nothing added, same ids, and the tags are special (skipped on request)
    assert add_tag_tokens(tok) == 0
    assert len(tok) == n + 10 and tag_token_ids(tok) == ids
    assert set(TAGS) <= set(tok.all_special_tokens)
    enc = tok.encode("<step> a </step>", add_special_tokens=False)
    assert "<step>" not in tok.decode(enc, skip_special_tokens=True)


def test_add_tag_tokens_keeps_earlier_special_tokens() -> None:
    tok = any_tokenizer("bytelevel")
    tok.add_special_tokens({"extra_special_tokens": ["<tool>"]})
    add_tag_tokens(tok)
    assert "<tool>" in [str(t) for t in tok.extra_special_tokens]
    assert len(tok.encode("<tool>", add_special_tokens=False)) == 1


def test_answer_eos_ids(world_tok) -> None:
    assert answer_eos_ids(world_tok) == [world_tok.eos_token_id, tag_token_ids(world_tok)[ANSWER_CLOSE]]
    with pytest.raises(ValueError):
        answer_eos_ids(any_tokenizer("bytelevel"))


def _bytelevel_lm(tied: bool) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """A byte-level tokenizer without tags, a tiny seeded LM on it (tied or not), and copies of
    its input and output embedding matrices before any resize."""
    from transformers import AutoModelForCausalLM

    tok = any_tokenizer("bytelevel")
    cfg = tiny_model_config(len(tok))
    cfg.tie_word_embeddings = tied
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    return tok, model, model.get_input_embeddings().weight.detach().clone(), model.get_output_embeddings().weight.detach().clone()


@pytest.mark.parametrize("tied", [True, False])
def test_resize_for_tags_mean_rows(tied: bool) -> None:
    tok, model, old_in, old_out = _bytelevel_lm(tied)
    n_old = old_in.shape[0]
    add_tag_tokens(tok)
    assert resize_for_tags(model, tok, init="mean") == 10
    new_in = model.get_input_embeddings().weight.detach()
    new_out = model.get_output_embeddings().weight.detach()
    assert new_in.shape[0] == len(tok) == n_old + 10 and new_out.shape[0] == len(tok)
    assert model.config.vocab_size == len(tok)
    assert torch.equal(new_in[:n_old], old_in)
    assert torch.equal(new_out[:n_old], old_out)
    for tid in tag_token_ids(tok).values():
        assert torch.allclose(new_in[tid], old_in.mean(dim=0), atol=1e-7, rtol=0)
        assert torch.allclose(new_out[tid], old_out.mean(dim=0), atol=1e-7, rtol=0)
    if tied:
        assert new_in.data_ptr() == new_out.data_ptr()
    else:
        assert not torch.allclose(old_in.mean(0), old_out.mean(0))  # each matrix used its own mean
    # nothing more to do the second time
    assert resize_for_tags(model, tok) == 0
    assert torch.equal(model.get_input_embeddings().weight[:n_old], old_in)
    model(torch.tensor([tok.encode("<step> the </step>")]))  # the new ids are usable


def test_resize_for_tags_spare_rows() -> None:
    """A matrix with spare rows (Qwen style) is not shrunk; named new rows get the mean."""
    from transformers import AutoModelForCausalLM

    tok = any_tokenizer("bytelevel")
    n_base = len(tok)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_model_config(n_base + 16))
    old = model.get_input_embeddings().weight.detach().clone()
    add_tag_tokens(tok)
    new_ids = list(tag_token_ids(tok).values())
    assert max(new_ids) < n_base + 16
    assert resize_for_tags(model, tok, new_ids=new_ids, init="mean") == 0
    w = model.get_input_embeddings().weight.detach()
    assert w.shape[0] == n_base + 16
    keep = [i for i in range(n_base + 16) if i not in new_ids]
    assert torch.equal(w[keep], old[keep])
    for tid in new_ids:
        assert torch.allclose(w[tid], old[keep].mean(0), atol=1e-7, rtol=0)


@pytest.mark.parametrize("tied", [True, False])
def test_resize_for_tags_spelling_rows(tied: bool) -> None:
    """The default init: each tag's row is the mean of the rows of the old tokens that spell it
    (in both matrices when untied); the pieces are ordinary tokens, never the tag itself."""
    tok, model, old_in, old_out = _bytelevel_lm(tied)
    n_old = old_in.shape[0]
    spelled = {t: tok(t, add_special_tokens=False)["input_ids"] for t in ("<step>", "</answer>")}
    add_tag_tokens(tok)
    ids = tag_token_ids(tok)
    assert resize_for_tags(model, tok) == 10
    new_in = model.get_input_embeddings().weight.detach()
    new_out = model.get_output_embeddings().weight.detach()
    assert torch.equal(new_in[:n_old], old_in)
    for tag, pieces in spelled.items():
        assert len(pieces) > 1 and all(p < n_old for p in pieces)
        assert spelling_ids(tok, ids[tag], n_old, set(ids.values())) == pieces
        assert torch.allclose(new_in[ids[tag]], old_in[pieces].mean(0), atol=1e-6, rtol=0)
        assert torch.allclose(new_out[ids[tag]], old_out[pieces].mean(0), atol=1e-6, rtol=0)
    # different spellings, different rows (the mean init would give them all one row)
    assert not torch.allclose(new_in[ids["<step>"]], new_in[ids["</answer>"]])


def test_spelling_ids_falls_back() -> None:
    """No spelling when a piece is itself new or outside the old rows: the row gets the mean."""
    tok = any_tokenizer("bytelevel")
    n_old = len(tok)
    add_tag_tokens(tok)
    ids = tag_token_ids(tok)
    pieces = spelling_ids(tok, ids["<step>"], n_old, set(ids.values()))
    assert pieces
    assert spelling_ids(tok, ids["<step>"], n_old, set(ids.values()) | {pieces[0]}) == []
    assert spelling_ids(tok, ids["<step>"], min(pieces), set(ids.values())) == []


def test_resize_for_tags_rejects_unknown_init() -> None:
    from transformers import AutoModelForCausalLM

    tok = any_tokenizer("bytelevel")
    model = AutoModelForCausalLM.from_config(tiny_model_config(len(tok)))
    add_tag_tokens(tok)
    with pytest.raises(ValueError, match="unknown init"):
        resize_for_tags(model, tok, init="zeros")
