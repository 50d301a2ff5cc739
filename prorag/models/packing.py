"""Padding-free scoring: the real tokens of a padded batch packed end to end into few rows.

A padded row's real tokens must be one span (left-padded prompt and right-padded completion, or
right padding). Each sequence keeps its own position ids, restarting at 0, and neither an attention
mask nor a cache is passed: transformers then reads the sequences' boundaries off the position ids
and keeps them apart (a block-diagonal causal mask for ``sdpa``, ``eager`` and ``flex_attention``;
varlen kernels for flash attention, which it detects in a single row only). Two layouts follow:

* mask-building kernels: sequences are first-fit, longest first, into rows of ``row_tokens`` (never
  less than the longest sequence), by default the padded batch's width. A row's attention costs its
  length squared whatever the mask, so one row holding the whole batch would cost far more than the
  padding saved; rows no wider than the padded batch's, and fewer of them, never cost more;
* flash attention: the whole batch in one row (varlen attention costs each sequence's own length).

A packed row's trailing padding is a sequence of its own (positions from 0), which no real token reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: Attention implementations whose mask transformers builds from packed position ids, several rows at a time.
MASKED_ATTENTION = ("sdpa", "eager", "flex_attention")
#: The label that nothing scores (transformers' and TRL's ignore index).
IGNORE = -100


@dataclass(frozen=True)
class PackedLayout:
    """Where each real token of a padded ``(B, L)`` batch sits in the packed ``(R, W)`` one."""

    source: torch.Tensor
    """``(R, W)`` long: the flat index ``b * L + t`` of the padded token at each packed slot, -1 on padding."""
    position_ids: torch.Tensor
    """``(R, W)`` long: each token's position in its own sequence (restarting at 0 per sequence and on padding)."""
    batch_shape: tuple[int, int]
    """``(B, L)`` of the padded batch."""

    @property
    def real(self) -> torch.Tensor:
        """``(R, W)`` bool: the slots that hold a real token."""
        return self.source >= 0

    def pack(self, values: torch.Tensor, fill: float | int) -> torch.Tensor:
        """``values`` ``(B, L, ...)`` laid out as ``(R, W, ...)``, ``fill`` on padding slots."""
        return _move(values, self.source, self.batch_shape, self.source.shape, fill, inverse=False)

    def unpack(self, packed: torch.Tensor, fill: float | int) -> torch.Tensor:
        """``packed`` ``(R, W, ...)`` back to ``(B, L, ...)``, ``fill`` where the padded batch has padding
        (differentiable with respect to ``packed``)."""
        return _move(packed, self.source, self.batch_shape, self.source.shape, fill, inverse=True)


def _move(
    values: torch.Tensor, source: torch.Tensor, padded: tuple[int, int], packed: torch.Size, fill: float | int, *, inverse: bool
) -> torch.Tensor:
    """Copy the real tokens' entries between the padded and the packed layouts (``inverse``: packed to padded)."""
    rest = values.shape[2:]
    index = source.flatten()
    keep = index >= 0
    where = index[keep].to(values.device)
    slots = keep.nonzero().squeeze(-1).to(values.device)
    if inverse:
        flat = values.reshape(-1, *rest)
        out = flat.new_full((padded[0] * padded[1], *rest), fill)
        return out.index_copy(0, where, flat.index_select(0, slots)).view(*padded, *rest)
    flat = values.reshape(-1, *rest)
    out = flat.new_full((packed[0] * packed[1], *rest), fill)
    return out.index_copy(0, slots, flat.index_select(0, where)).view(*packed, *rest)


def real_spans(attention_mask: torch.Tensor) -> tuple[list[int], list[int]]:
    """Each row's real tokens as ``[start, end)`` (``(0, 0)`` for a row without one); raises
    ``ValueError`` when a row's real tokens are not one span (packing would reorder them)."""
    real = attention_mask.bool().cpu()
    width = real.shape[1]
    cols = torch.arange(width)
    count = real.sum(1)
    start = torch.where(real, cols, width).min(1).values
    end = torch.where(real, cols, -1).max(1).values + 1
    if bool(((end - start) != count)[count > 0].any()):
        raise ValueError("packing needs each row's real tokens in one span (padding only before and after them)")
    start = torch.where(count > 0, start, 0)
    end = torch.where(count > 0, end, 0)
    return start.tolist(), end.tolist()


def first_fit_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` in rows of at most ``capacity`` tokens (a longer sequence gets a row of
    its own): first fit, longest first (stable), the classic bin-packing heuristic, whose rows are
    nearly full when sequences are short against ``capacity``. Empty sequences are left out."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(max(capacity, lengths[i]) - lengths[i])
    return rows


def pack_layout(attention_mask: torch.Tensor, row_tokens: int | None = None, *, one_row: bool = False) -> PackedLayout:
    """The packed layout of a padded batch (``attention_mask`` ``(B, L)``, 1 on real tokens): its
    sequences first-fit into rows of ``row_tokens`` tokens (``None``: ``L``, the padded rows' width),
    or all in one row (``one_row``, for flash attention)."""
    start, end = real_spans(attention_mask)
    lengths = [e - s for s, e in zip(start, end, strict=True)]
    total = sum(lengths)
    if row_tokens is not None and row_tokens < 1:
        raise ValueError(f"row_tokens must be >= 1 (or None: the longest sequence), got {row_tokens}")
    capacity = total if one_row else (row_tokens or attention_mask.shape[1])
    rows = first_fit_rows(lengths, capacity) or [[]]
    width = max(max(sum(lengths[i] for i in row) for row in rows), 1)
    B, L = attention_mask.shape
    source = torch.full((len(rows), width), -1, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            n = lengths[i]
            source[r, at : at + n] = torch.arange(i * L + start[i], i * L + end[i])
            positions[r, at : at + n] = torch.arange(n)
            at += n
        positions[r, at:] = torch.arange(width - at)
    device = attention_mask.device
    return PackedLayout(source.to(device), positions.to(device), (B, L))


def packs_in_one_row(model: Any) -> bool:
    """Whether ``model``'s attention needs the packed batch in one row (flash attention's varlen path),
    rather than rows whose mask transformers builds from the position ids; raises ``ValueError`` for an
    attention implementation that would let packed sequences read each other."""
    while hasattr(model, "module"):  # DistributedDataParallel and similar wrappers
        model = model.module
    config = model.config
    implementation = str(getattr(config, "_attn_implementation", None) or "eager")
    if "flash" in implementation:
        return True
    if implementation in MASKED_ATTENTION:
        return False
    raise ValueError(
        f"packed scoring: attention implementation {implementation!r} cannot keep packed sequences apart "
        f"(supported: {', '.join(MASKED_ATTENTION)} and flash attention)"
    )


#: ``forward(input_ids=(r, W), position_ids=(r, W), labels=(r, W), use_cache=False)`` -> ``(log_probs, entropy or None)``,
#: each ``(r, W - 1)`` with entry ``c`` for the label at ``c + 1`` (TRL's fused LM head's layout).
LabelForward = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def packed_label_logprobs(
    forward: LabelForward, layout: PackedLayout, input_ids: torch.Tensor, labels: torch.Tensor, *, rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each label's log-probability (and entropy, where ``forward`` gives one) over a padded batch
    computed on its packed layout: ``(B, L - 1)``, entry ``t`` for ``labels[:, t + 1]`` and 0 where that
    label is ``-100`` (the layout of TRL's fused LM head, so either path's output serves the same code).
    A sequence's first token is never a label (the token before it belongs to another sequence).

    ``rows``: packed rows per forward (``None``: all in one), taken fullest first and each forward cut
    to its fullest row: rows that hold one long sequence (which nothing else fits beside) then carry
    little padding either."""
    ids = layout.pack(input_ids, 0)
    packed_labels = layout.pack(labels, IGNORE).masked_fill(layout.position_ids == 0, IGNORE)
    fill = layout.real.sum(1)
    order = torch.argsort(fill, descending=True, stable=True)
    step = rows or ids.shape[0]
    width = ids.shape[1]
    logps, entropies = [], []
    for s in range(0, len(order), step):
        index = order[s : s + step]
        cut = max(int(fill[index].max()), 1)
        logp, entropy = forward(
            input_ids=ids[index, :cut],
            position_ids=layout.position_ids[index, :cut],
            labels=packed_labels[index, :cut],
            use_cache=False,  # transformers reads packed sequences off the position ids only without a cache
        )
        # Column c scores the label at c + 1: moved to the label's own column, over the full width.
        logps.append(torch.nn.functional.pad(logp, (1, width - cut)))
        entropies.append(None if entropy is None else torch.nn.functional.pad(entropy, (1, width - cut)))
    back = torch.argsort(order)
    logp = layout.unpack(torch.cat(logps).index_select(0, back.to(logps[0].device)), 0.0)[:, 1:]
    if any(e is None for e in entropies):
        return logp, None
    entropy = layout.unpack(torch.cat(entropies).index_select(0, back.to(entropies[0].device)), 0.0)[:, 1:]
    return logp, entropy


def padding_share(attention_mask: torch.Tensor) -> float:
    """The share of a padded batch's positions that are padding."""
    return 1.0 - float(attention_mask.bool().float().mean()) if attention_mask.numel() else 0.0


__all__ = [
    "IGNORE",
    "MASKED_ATTENTION",
    "LabelForward",
    "PackedLayout",
    "first_fit_rows",
    "pack_layout",
    "packed_label_logprobs",
    "packs_in_one_row",
    "padding_share",
    "real_spans",
]
