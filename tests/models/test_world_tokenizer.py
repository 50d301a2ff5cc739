"""The world tokenizer: specials, every world name one token, exact round trip, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prorag.agent.schema import (
    TAGS,
    Action,
    ActionKind,
    render_answer,
    render_env_turn,
    render_search,
    render_trajectory,
)
from prorag.data.jsonl import read_jsonl
from prorag.data.world.names import YEARS, world_vocabulary
from prorag.models.tags import add_tag_tokens, tag_token_ids
from prorag.models.world_tokenizer import (
    EOS_TOKEN,
    PAD_TOKEN,
    _make_single_tokens,
    _train_bpe,
    _vocabulary_forms,
    train_world_tokenizer,
    world_tokenizer_texts,
)
from prorag.retrieval.base import Hit, format_documents
from tests.models.checks import ENGLISH, check_tags_single


def test_world_tokenizer_specials(world_tok) -> None:
    assert world_tok.eos_token == EOS_TOKEN and world_tok.pad_token == PAD_TOKEN
    assert world_tok.bos_token is None
    assert world_tok.pad_token_id == 0 and world_tok.eos_token_id == 1
    assert tag_token_ids(world_tok) == {tag: i + 2 for i, tag in enumerate(TAGS)}
    check_tags_single(world_tok)
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
