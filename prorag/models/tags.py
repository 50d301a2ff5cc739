"""The ten trajectory tags on any Hugging Face tokenizer, the embedding rows they need, and
generation that stops at ``</answer>``.

Every policy's tokenizer knows the ten :data:`prorag.agent.schema.TAGS` as *special* tokens,
each one id: the token parser (:func:`prorag.agent.schema.parse_token_actions`) and the losses
then work on ids without decoding, and ``</answer>`` can end a sequence. New embedding rows are
initialised from each tag's spelling (:func:`resize_for_tags`), exactly and without randomness.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from prorag.agent.schema import ANSWER_CLOSE, TAGS
from prorag.core.lazy_modules import lazy_module

if TYPE_CHECKING:  # imported lazily at run time: torch and transformers are slow to import
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
else:
    torch = lazy_module("torch")


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

    missing = unregistered_tags(tokenizer)
    added = 0
    if missing:
        tokens = [AddedToken(t, lstrip=False, rstrip=False, normalized=False, special=True) for t in missing]
        added = tokenizer.add_special_tokens({"extra_special_tokens": tokens}, replace_extra_special_tokens=False)
    tag_token_ids(tokenizer)  # verifies
    return int(added)


def unregistered_tags(tokenizer: PreTrainedTokenizerBase) -> list[str]:
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
            raise ValueError(f"{tag} is not a single token of this tokenizer; call prorag.models.tags.add_tag_tokens first")
        out[tag] = int(tid)
    if len(set(out.values())) != len(TAGS):
        raise ValueError(f"tags share token ids: {out}")
    return out


def has_tags(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether every tag is one token of ``tokenizer`` (:func:`tag_token_ids` does not raise)."""
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
    is far below the top of a peaked distribution: a mean-initialised ``<step>`` starts many
    nats below where the SFT target puts it, and Adam moves a row by about the learning rate
    per coordinate per step, so a short SFT on a pretrained model can leave the policy unable
    to open a step (every trajectory format-invalid).

    ``init="spelling"`` (default): the mean of the rows of the old tokens that spell the new
    token's text (``<step>`` -> ``<``, ``step``, ``>``, tokenised with special tokens split),
    the usual initialisation of added vocabulary from its subwords. The tag then starts as
    likely as its spelled-out form and its input embedding reads like the text it stands for. A
    token whose spelling cannot be had (a tokenizer that cannot split special tokens, or pieces
    that are themselves new) falls back to the mean.

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
