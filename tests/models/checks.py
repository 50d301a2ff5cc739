"""What the models tests share: tiny tokenizers standing in for "any HF tokenizer" (trained
here, no hub access: one byte-level, GPT-2 / Llama-3 / Qwen style, one Metaspace,
SentencePiece style), the check that the tags are single tokens, and a folder listing."""

from __future__ import annotations

from pathlib import Path

from prorag.agent.schema import TAGS
from prorag.models.tags import tag_token_ids

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "A tokenizer splits text into pieces; a model reads the pieces.",
    "Who wrote this? Nobody knows, but everyone has read it twice.",
    "In 1999 the company moved to a new city, and it is based there now.",
] * 5


def any_tokenizer(style: str):
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


def glued_texts() -> list[str]:
    return [
        "<step> I",
        "</step><subquery>",
        "<step> I need the answer</step><answer> Paris </answer>",
        "x<subanswer>y</subanswer>z",
        "\n<retrieval>\nDoc 1(Title: a) b\n</retrieval>\n<step>",
    ] + [f"ab{tag}cd" for tag in TAGS]


def check_tags_single(tok) -> None:
    ids = tag_token_ids(tok)
    assert list(ids) == list(TAGS) and len(set(ids.values())) == 10
    for tag, tid in ids.items():
        assert tok.encode(tag, add_special_tokens=False) == [tid]
    for text in glued_texts():
        enc = tok.encode(text, add_special_tokens=False)
        for tag, tid in ids.items():
            assert enc.count(tid) == text.count(tag), (text, tag, tok.convert_ids_to_tokens(enc))


def folder_files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}
