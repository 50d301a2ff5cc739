"""The rollout engine's two KV-cache backends: a static slot cache, or the model's own cache.

* :class:`SlotState` on :class:`SlotCache`, for full-attention transformers models (Llama,
  Qwen2/3, Mistral without sliding window; SDPA or eager, :func:`supports_slot_cache`): per
  layer, buffers ``(rows, heads, capacity, head_dim)`` allocated when a batch starts (at least
  256 slots, doubled when full), written in place. A row's token ``t`` sits at slot ``t``, so a
  row's cache holds exactly its prompt and completion, without holes; a waiting row writes at
  its next slot without advancing. The mask ``slot <= query position`` is built on the device
  against the used length rounded up to 32 slots (static shapes for 32 steps); the step copies
  nothing from the host, and finished rows leave the batch (:meth:`SlotState.select`).
* :class:`BatchState`, for every other model (sliding windows, flash attention, custom caches,
  test doubles): rows feed the same number of positions per forward; a waiting row or a shorter
  chunk leaves padding "holes" that the mask hides and position ids skip.
Both expose ``feed`` (a right-aligned chunk per row), ``feed_step`` (one token per row) and ``can_drop``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin

from prorag.core.kernels import variable_shape_attention

#: Model types whose every layer is plain full attention over a standard key/value cache.
_SLOT_CACHE_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
#: The attention width (used slots) is rounded up to a multiple of this, so shapes change once per bucket.
_SLOT_BUCKET = 32
#: Slots allocated at least, per row, when a batch starts (then doubled when full).
_SLOT_MIN_CAPACITY = 256


def supports_slot_cache(model: Any) -> bool:
    """Whether ``model`` can run on the engine's :class:`SlotCache`: a full-attention decoder
    (Llama, Qwen2/3, Mistral without sliding window) with SDPA or eager attention, which takes a
    ready 4D attention mask. Other models run on their own cache."""
    cfg = getattr(model, "config", None)
    if not isinstance(cfg, PretrainedConfig) or cfg.model_type not in _SLOT_CACHE_MODEL_TYPES:
        return False
    if getattr(cfg, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return False
    return not (getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True))


def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` where it has one (transformers
    renamed ``past_key_values``, which still works but warns on every run), else ``past_key_values``
    (older transformers, test doubles). A PEFT or ``torch.compile`` wrapper passes keywords through
    to the model it wraps, whose signature decides."""
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    inner = getattr(inner, "_orig_mod", inner)
    try:
        params = inspect.signature(inner.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


class _SlotLayer(CacheLayerMixin):
    """One layer of a :class:`SlotCache`: preallocated buffers written in place at given slots.

    The buffers hold :attr:`SlotPool.rows` rows; a forward of ``B`` rows reads and writes the first
    ``B`` (finished rows are compacted away in place, :meth:`select`), so the buffers never move:
    what a captured decode graph (:mod:`prorag.agent.decode_graphs`) needs.
    """

    is_sliding = False

    def __init__(self, owner: SlotCache) -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, H, _, Dk = key_states.shape
        rows, cap = self.owner.pool.rows, self.owner.capacity
        self.keys = key_states.new_zeros((rows, H, cap, Dk))
        self.values = value_states.new_zeros((rows, H, cap, value_states.shape[-1]))
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        width, rows = self.owner.width, self.owner.fed_rows
        if rows is not None:
            # Some rows only: write at theirs (row, head, slot) and read a copy of theirs.
            heads = torch.arange(key_states.shape[1], device=rows.device)[None, :, None]
            where = (rows[:, None, None], heads, self.owner.slots[:, None, :])
            self.keys.index_put_(where, key_states)
            self.values.index_put_(where, value_states)
            return self.keys[:, :, :width].index_select(0, rows), self.values[:, :, :width].index_select(0, rows)
        # The first B rows each write their (head, slot) rows, as rows of the buffers' flat
        # (rows * heads * capacity, head_dim) views: one index_copy_ per buffer. A scatter_ along
        # the slots wrote the same, but a compiled decode step (``compile_decode``) turned it into a
        # copy of the whole buffer, every layer and step; index_copy_ into the flat view stays in
        # place there too.
        B, H, q = key_states.shape[:3]
        flat = self.owner.flat_positions(B, H, q)
        self.keys.view(-1, self.keys.shape[-1]).index_copy_(0, flat, key_states.reshape(B * H * q, -1))
        self.values.view(-1, self.values.shape[-1]).index_copy_(0, flat, value_states.reshape(B * H * q, -1))
        return self.keys[:B, :, :width], self.values[:B, :, :width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width, 0

    def get_seq_length(self) -> int:
        return self.owner.seen

    def get_max_length(self) -> int:
        return self.owner.capacity

    def resize(self, capacity: int) -> None:
        if self.is_initialized:
            keys, values = self.keys, self.values
            self.keys = keys.new_zeros((*keys.shape[:2], capacity, keys.shape[-1]))
            self.values = values.new_zeros((*values.shape[:2], capacity, values.shape[-1]))
            n = min(capacity, keys.shape[2])
            self.keys[:, :, :n] = keys[:, :, :n]
            self.values[:, :, :n] = values[:, :, :n]

    def select(self, rows: torch.Tensor) -> None:
        """Move ``rows`` to the front of the buffers, in that order (in place: the buffers stay put)."""
        if self.is_initialized:
            self.keys[: len(rows)] = self.keys.index_select(0, rows)
            self.values[: len(rows)] = self.values.index_select(0, rows)


class SlotPool:
    """The per-layer buffers of a :class:`SlotCache` (``rows`` rows, ``capacity`` slots each),
    which can outlive one batch: a :class:`~prorag.agent.decode_graphs.DecodeGraphs` keeps one so
    that the graphs it captured, which read and write these very buffers, serve every batch.
    ``generation`` counts reallocations (a capacity that grew): graphs of an older generation
    point at freed memory and must be captured again."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.layers: list[CacheLayerMixin] = []
        self.capacity = 0
        self.generation = 0


class SlotCache(Cache):
    """The engine's static KV cache (a ``transformers`` ``Cache``): per layer, buffers
    ``(rows, kv_heads, capacity, head_dim)`` written in place at the slots the engine sets
    before each forward (``slots``, ``(rows, q)``: a row's slot is the position of its token),
    read back over the first ``width`` slots.

    ``rows`` holds, for each row, its index in the batch the cache was made for; dropping
    finished rows (:meth:`select`) keeps it in step, so a model that keeps per-row state can
    follow its rows (:attr:`forward_rows`: those of the current forward). ``pool``: buffers to
    reuse (from an earlier batch); by default new ones sized for this batch.
    """

    def __init__(self, batch: int, device: torch.device, expected: int = 0, pool: SlotPool | None = None) -> None:
        super().__init__(layer_class_to_replicate=lambda: _SlotLayer(self))
        if pool is not None and pool.rows < batch:
            raise ValueError(f"a slot pool of {pool.rows} rows cannot hold a batch of {batch}")
        self.pool = pool or SlotPool(batch)
        self.layers = self.pool.layers  # layers made during this batch land in the pool
        for layer in self.layers:
            layer.owner = self
        self.expected = expected
        """Slots a row is expected to need at most: growth by doubling stops there (unless more is needed)."""
        self.width = 0
        self.seen = 0
        self._flat: tuple[tuple[int, int, int, int], torch.Tensor] | None = None
        self.slots = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.fed_rows: torch.Tensor | None = None
        """The rows a forward feeds when not all of them (``slots`` then has one row per fed row)."""
        self.rows = torch.arange(batch, device=device)

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    @property
    def slots(self) -> torch.Tensor:
        """The slot of each position a forward feeds, ``(rows, q)`` (set before each forward)."""
        return self._slots

    @slots.setter
    def slots(self, value: torch.Tensor) -> None:
        self._slots = value
        self._flat = None  # new slots, new write positions

    def flat_positions(self, rows: int, heads: int, q: int) -> torch.Tensor:
        """Where row ``b``'s head ``h`` writes its ``i``-th position (slot ``slots[b, i]``) in a
        layer's flat ``(rows * heads * capacity, head_dim)`` view, ordered as ``(b, h, i)``:
        ``(b * heads + h) * capacity + slot``. The same for every layer of a forward, so computed
        once per forward (each assignment of :attr:`slots`), not once per layer."""
        key = (rows, heads, q, self.capacity)
        if self._flat is None or self._flat[0] != key:
            device = self._slots.device
            row_head = (
                torch.arange(rows, device=device)[:, None, None] * heads + torch.arange(heads, device=device)[None, :, None]
            )
            self._flat = key, (row_head * self.capacity + self._slots[:rows, None, :q]).reshape(-1)
        return self._flat[1]

    @property
    def forward_rows(self) -> torch.Tensor:
        """The batch indices of the rows the current forward runs, in order: every row held, or
        those a chunk feeds (:attr:`fed_rows`)."""
        return self.rows if self.fed_rows is None else self.rows.index_select(0, self.fed_rows)

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` slots (doubling, so that growth is rare, up to :attr:`expected`)."""
        if capacity > self.pool.capacity:
            self.pool.capacity = max(capacity, min(max(2 * self.pool.capacity, _SLOT_MIN_CAPACITY), self.expected))
            self.pool.generation += 1
            for layer in self.layers:
                layer.resize(self.pool.capacity)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current rows), in that order."""
        for layer in self.layers:
            layer.select(rows)
        self.rows = self.rows.index_select(0, rows)


def additive_mask_dtype(model: Any) -> torch.dtype | None:
    """The dtype of the additive attention mask ``model`` takes (eager attention adds the mask to
    its scores), or None: SDPA takes a boolean mask."""
    if model.config._attn_implementation == "sdpa":
        return None
    dtype = next(model.parameters()).dtype
    return dtype if dtype.is_floating_point else torch.float32


def slot_mask(columns: torch.Tensor, slots: torch.Tensor, additive: torch.dtype | None) -> torch.Tensor:
    """``(B, 1, q, W)``: query ``i`` of row ``b`` sees slot ``s`` (``columns``: the ``W`` slot ids)
    when ``s <= slots[b, i]``. Boolean, or with ``additive`` a mask of that dtype: 0 where seen,
    the dtype's minimum elsewhere."""
    allowed = columns <= slots[:, None, :, None]
    if additive is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=additive, device=allowed.device).masked_fill_(~allowed, torch.finfo(additive).min)


class StaticDecoder(Protocol):
    """What :class:`SlotState` needs of static decode steps (:class:`~prorag.agent.decode_graphs.DecodeGraphs`):
    the slot pool its caches use, a call when a batch starts, and the step itself."""

    pool: SlotPool

    def new_batch(self) -> None: ...

    def decode(self, cache: SlotCache, tokens: torch.Tensor, slots: torch.Tensor, used: int) -> torch.Tensor: ...


class SlotState:
    """A batch on a :class:`SlotCache`: each row's length (its next slot and position) and the mask.

    A row's token ``t`` is at slot ``t``: a fed chunk is right-aligned, its real tokens go to the
    row's next slots and its left padding past them; a decode step writes every row at its next
    slot and advances only the rows that decode. Query ``i`` of row ``b`` attends to the slots
    up to its own, ``slot <= slots[b, i]``; padding and waiting rows only ever see their own row's
    real tokens and stale values past its end, never anything a real token attends to.
    """

    def __init__(
        self, model: Any, batch: int, pad_id: int, device: torch.device, expected: int = 0, graphs: StaticDecoder | None = None
    ) -> None:
        self.model = model
        self.pad_id = pad_id
        self.device = device
        self.graphs = graphs
        """Static decode steps (CUDA graphs) for :meth:`feed_step`; None: the eager forward."""
        if graphs is not None:
            graphs.new_batch()
        self.cache = SlotCache(batch, device, expected, pool=graphs.pool if graphs is not None else None)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.longest = 0
        """An upper bound of ``length.max()`` kept on the host (exact after each chunk)."""
        self.slot_ids = torch.arange(0, device=device)
        self.additive = additive_mask_dtype(model)
        self.cache_keyword = cache_keyword(model)

    can_drop = True

    def feed(self, chunks: Sequence[list[int] | None]) -> torch.Tensor:
        """Feed a chunk of tokens per row (None: nothing), right-aligned; return last-position logits ``(B, V)``.

        Only the rows with a chunk run through the model. When a few rows resume after the
        environment's reply while the others are inside their action (``resume_early``), the
        others would otherwise compute the whole chunk's width in padding: on the engine's CPU
        benchmark eleven padded positions per real one. A row without a chunk gets zero logits:
        whatever is sampled from them, the caller drops."""
        n = [len(c) if c else 0 for c in chunks]
        fed = [r for r, k in enumerate(n) if k]
        if not fed:
            raise ValueError("feed needs a chunk for at least one row")
        width = max(n)
        ids = torch.full((len(fed), width), self.pad_id, dtype=torch.long)
        for j, r in enumerate(fed):
            ids[j, width - n[r] :] = torch.tensor(chunks[r])
        count = torch.tensor([n[r] for r in fed])[:, None]
        col = torch.arange(width)[None, :]
        # Real tokens (the last n columns) go to the next n slots, the padding after them.
        offset = torch.where(col >= width - count, col - (width - count), count + col)
        before = self.length.tolist()
        rows = torch.tensor(fed, dtype=torch.long, device=self.device) if len(fed) < len(chunks) else None
        length = self.length if rows is None else self.length.index_select(0, rows)
        self.cache.fed_rows = rows
        try:
            logits = self._forward(
                ids.to(self.device), length[:, None] + offset.to(self.device), max(before[r] for r in fed) + width
            )
        finally:
            self.cache.fed_rows = None
        if rows is not None:
            logits = logits.new_zeros((len(chunks), logits.shape[-1])).index_copy_(0, rows, logits)
        after = [a + b for a, b in zip(before, n, strict=True)]
        self.length = torch.tensor(after, dtype=torch.long, device=self.device)
        self.longest = max(after)
        return logits

    def feed_step(self, tokens: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``live`` False: written at the row's next slot, not kept); the decode step."""
        if self.graphs is not None:
            logits = self.graphs.decode(self.cache, tokens, self.length[:, None], self.longest + 1)
        else:
            logits = self._forward(tokens[:, None], self.length[:, None], self.longest + 1)
        self.length = self.length + live.long()
        self.longest += 1
        return logits

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows``, in that order (finished rows leave the batch and the cache)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.cache.select(index)
        self.length = self.length.index_select(0, index)

    def _forward(self, ids: torch.Tensor, slots: torch.Tensor, used: int) -> torch.Tensor:
        width = -(-used // _SLOT_BUCKET) * _SLOT_BUCKET
        self.cache.reserve(width)
        if self.slot_ids.numel() < width:
            self.slot_ids = torch.arange(self.cache.capacity, device=self.device)
        self.cache.slots, self.cache.width, self.cache.seen = slots, width, used
        mask = slot_mask(self.slot_ids[:width], slots, self.additive)
        with variable_shape_attention():  # each chunk and eager step is a new shape
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=slots,
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_keyword: self.cache},
            )
        return out.logits[:, -1, :]


class BatchState:
    """The model's own KV cache, its attention mask (with holes) and each row's next position
    (``expected`` is unused: the model sizes its own cache)."""

    def __init__(self, model: Any, batch: int, pad_id: int, device: torch.device, expected: int = 0) -> None:
        self.model = model
        self.pad_id = pad_id
        self.device = device
        self.cache: Any = None
        self.mask = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            params = {}
        self.extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.cache_keyword = cache_keyword(model)

    can_drop = False
    """The model's cache cannot drop rows: finished rows stay (and decode nothing)."""

    def feed(self, chunks: Sequence[list[int] | None]) -> torch.Tensor:
        """Feed a chunk of tokens per row (None: nothing), right-aligned; return last-position logits ``(B, V)``."""
        width = max(len(c) for c in chunks if c is not None)
        B = len(chunks)
        ids = torch.full((B, width), self.pad_id, dtype=torch.long)
        live = torch.zeros((B, width), dtype=torch.long)
        for r, c in enumerate(chunks):
            if c:
                ids[r, width - len(c) :] = torch.tensor(c)
                live[r, width - len(c) :] = 1
        return self._forward(ids.to(self.device), live.to(self.device))

    def feed_step(self, tokens: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``live`` False: a hole); the static-shape decode step."""
        ids = torch.where(live, tokens, torch.full_like(tokens, self.pad_id))
        return self._forward(ids[:, None], live.long()[:, None])

    def _forward(self, ids: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        positions = self.next_pos[:, None] + live.cumsum(1) - 1
        positions = positions.clamp(min=0)
        self.mask = torch.cat([self.mask, live], dim=1)
        with variable_shape_attention():  # the cache grows by every chunk and step
            out = self.model(
                input_ids=ids,
                attention_mask=self.mask,
                position_ids=positions,
                use_cache=True,
                **{self.cache_keyword: self.cache},
                **self.extra,
            )
        self.cache = getattr(out, self.cache_keyword)
        self.next_pos = self.next_pos + live.sum(1)
        return out.logits[:, -1, :]
