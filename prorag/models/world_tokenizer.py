"""The byte-level BPE tokenizer of the built-in world, trained on a world folder's texts.

Every world name, year, ``yes`` and ``no`` is one token (with and without a leading space);
the ten tags are special tokens; ``decode(encode(text)) == text``; the same texts give the
identical tokenizer (:func:`train_world_tokenizer`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prorag.agent.schema import TAGS, Action, ActionKind, render_trajectory
from prorag.data.jsonl import PathLike, read_jsonl
from prorag.models.tags import tag_token_ids

if TYPE_CHECKING:  # imported lazily at run time: transformers is slow to import
    from transformers import PreTrainedTokenizerFast

#: Special tokens of the world tokenizer besides the tags (no BOS: nothing needs one).
PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"


@cache
def _byte_to_char() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what the ByteLevel pre-tokeniser uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


def _byte_level(text: str) -> str:
    table = _byte_to_char()
    return "".join(table[b] for b in text.encode("utf-8"))


def _bpe_pieces(word: str, ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Apply BPE merges to one pre-token as the ``tokenizers`` BPE model does: repeatedly
    merge the adjacent pair of lowest rank (leftmost on ties)."""
    parts = list(word)
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get((parts[i], parts[i + 1]))
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def _vocabulary_forms() -> list[str]:
    """Every world-vocabulary word as the two pre-tokens it can be: ``Kothir`` (at the start
    of a line or after punctuation) and ``ĠKothir`` (after a space), byte-level spelled."""
    from prorag.data.world.names import world_vocabulary

    return [form for w in world_vocabulary() for form in (_byte_level(w), _byte_level(" " + w))]


def _make_single_tokens(tok_json: dict[str, Any], forms: Sequence[str]) -> int:
    """Append merges to the BPE model of ``tok_json`` (in place) until each of ``forms`` is
    one token; return how many merges were appended.

    Words are handled one at a time, in a fixed order: the word's current pieces
    ``p1 … pk`` (after every existing merge) get the chain ``(p1, p2)``, ``(p1p2, p3)`` … at
    the *end* of the merge list. The chain applies in full, since nothing earlier merges
    those pieces further, and it cannot change a word already made one token, since a
    merge of lower priority only fires where no earlier merge applies.
    """
    model = tok_json["model"]
    vocab: dict[str, int] = model["vocab"]
    merges: list[Any] = model["merges"]
    ranks = {(a, b): i for i, (a, b) in enumerate(_merge_pairs(merges))}
    next_id = max([*vocab.values(), *(t["id"] for t in tok_json.get("added_tokens", []))]) + 1
    appended = 0
    for form in forms:
        pieces = _bpe_pieces(form, ranks)
        while len(pieces) > 1:
            a, b = pieces[0], pieces[1]
            merged = a + b
            if (a, b) not in ranks:
                ranks[(a, b)] = len(ranks)
                merges.append([a, b])
                appended += 1
            if merged not in vocab:
                vocab[merged] = next_id
                next_id += 1
            pieces = [merged, *pieces[2:]]
    return appended


def _merge_pairs(merges: Sequence[Any]) -> Iterator[tuple[str, str]]:
    for m in merges:  # tokenizers >= 0.20 writes [a, b]; older versions "a b"
        if isinstance(m, str):
            a, b = m.split(" ", 1)
            yield a, b
        else:
            yield m[0], m[1]


def _format_primer() -> list[str]:
    """A plain prompt and a rendered trajectory, so that the format's own words (``Question``,
    ``Doc``, ``Title``) are merged too: a fixed text, part of the tokenizer's definition."""
    traj = render_trajectory(
        [
            Action(
                ActionKind.SEARCH,
                "I need to find who directed Kothir.",
                "Kothir director",
                retrieval="Doc 1(Title: Kothir) Kothir is a film. Kothir was directed by Tavor.\n"
                "Doc 2(Title: Tavor (career)) This page is about the career of Tavor.",
            ),
            Action(ActionKind.CONCLUDE, "The first document says so.", "Kothir was directed by Tavor."),
            Action(ActionKind.ANSWER, "So the answer is Tavor.", "Tavor"),
        ]
    )
    from prorag.agent.prompts import plain_prompt

    return [plain_prompt("Who directed Kothir?") + traj]


def _train_bpe(texts: Sequence[str], vocab_size: int) -> dict[str, Any]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, lstrip=False, rstrip=False, normalized=False, special=True) for t in (PAD_TOKEN, EOS_TOKEN, *TAGS)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return json.loads(tok.to_str())


#: How often each vocabulary word is shown to the BPE trainer in each form (on top of its
#: occurrences in the texts), so that its merges rank early whatever the texts.
_VOCAB_REPEATS = 8


def train_world_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer for the built-in world, trained on ``texts``.

    * Byte level (GPT-2's pre-tokeniser and decoder, no normaliser, no prefix space): every
      string can be encoded, with no unknown token, and ``decode(encode(text)) == text``
      exactly (``clean_up_tokenization_spaces`` is off).
    * Special tokens: ``<pad>`` (id 0, ``pad_token``), ``<eos>`` (id 1, ``eos_token``) and
      the ten :data:`~prorag.agent.schema.TAGS` (ids 2..11, ``extra_special_tokens``); no BOS,
      and encoding adds no special token.
    * Every name, year, ``yes`` and ``no`` (:func:`~prorag.data.world.names.world_vocabulary`) is exactly
      one token both after a space (``" Kothir"``) and without one (at the start of a line,
      after ``(`` or ``\\n``); punctuation is split off by the pre-tokeniser, so
      ``"Kothir."`` is ``Kothir`` + ``.``. A probe showed that a tiny model only learns to
      copy answers from retrieved text when every name is one token. How: each word is fed
      to the trainer :data:`_VOCAB_REPEATS` times in both forms (so its merges rank early),
      then any word that is still more than one token gets a chain of merges appended at
      the lowest priority (:func:`_make_single_tokens`, which cannot disturb other words),
      and finally every form is verified on the finished tokenizer (``RuntimeError`` if
      one is not a single token). Added tokens are not used for names: they are matched
      before pre-tokenisation, which with byte-level spaces means inside longer words too.
    * ``vocab_size`` bounds the final vocabulary, specials included (the trainer may stop
      earlier when the texts run out of pairs to merge). If the appended merges push it
      over, the trainer is re-run with a smaller target. ``ValueError`` if it cannot fit.
    * Deterministic: the same texts (in the same order) give the identical tokenizer
      (``backend_tokenizer.to_str()`` and the saved ``tokenizer.json``).
    """
    from transformers import PreTrainedTokenizerFast

    from prorag.data.world.names import world_vocabulary

    words = world_vocabulary()
    min_size = 256 + 2 + len(TAGS) + 2 * len(words)
    if vocab_size < min_size:
        raise ValueError(f"vocab_size={vocab_size} is too small: the world tokenizer needs at least {min_size} tokens")
    corpus = [t for t in texts if t]
    for w in words:
        corpus.append("\n".join([w] * _VOCAB_REPEATS))
        corpus.append(" " + " ".join([w] * _VOCAB_REPEATS))
    corpus.extend(_format_primer())
    forms = _vocabulary_forms()

    target = vocab_size
    for _ in range(8):
        tok_json = _train_bpe(corpus, target)
        _make_single_tokens(tok_json, forms)
        size = len(tok_json["model"]["vocab"]) + sum(
            1 for t in tok_json["added_tokens"] if t["content"] not in tok_json["model"]["vocab"]
        )
        if size <= vocab_size:
            break
        target -= size - vocab_size
        if target < min_size:
            break
    else:
        size = vocab_size + 1
    if size > vocab_size:
        raise ValueError(f"cannot fit the world vocabulary in vocab_size={vocab_size}; use a larger one")

    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(json.dumps(tok_json, ensure_ascii=False))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=list(TAGS),
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    bad = [w for w in words for text in (w, " " + w) if len(tokenizer.encode(text, add_special_tokens=False)) != 1]
    if bad:
        raise RuntimeError(f"world tokenizer: {len(bad)} vocabulary words are not single tokens, e.g. {bad[:5]}")
    tag_token_ids(tokenizer)
    return tokenizer


def world_tokenizer_texts(world_dir: PathLike) -> Iterator[str]:
    """The training texts of the world tokenizer from a world folder (``prorag world``):
    every passage's contents (``corpus.jsonl``), then every question of ``train``, ``dev``
    and ``test`` with its gold decomposition's sub-questions and search queries (the words a
    policy writes in its thoughts and sub-queries). Missing split files are skipped; a
    missing ``corpus.jsonl`` raises :class:`~prorag.core.errors.DataError`. Fixed order.
    """
    root = Path(world_dir)
    for row in read_jsonl(root / "corpus.jsonl"):
        yield str(row["contents"])
    for split in ("train", "dev", "test"):
        path = root / f"{split}.jsonl"
        if not path.is_file():
            continue
        for row in read_jsonl(path):
            yield str(row["question"])
            for hop in (row.get("metadata") or {}).get("decomposition") or []:
                for key in ("question", "query"):
                    if hop.get(key):
                        yield str(hop[key])
