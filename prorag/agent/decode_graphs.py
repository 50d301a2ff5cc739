"""The rollout engine's decode step as replayed CUDA graphs.

A small model's decode step is launch-bound (hundreds of small kernels: Python and the launches set the
pace); recorded once as a CUDA graph it replays with one launch, at fixed addresses and shapes, so:

* **Buffers that never move.** The KV cache is a :class:`~prorag.agent.kv_cache.SlotPool` that outlives
  batches (finished rows compacted in place, a grown capacity starts a new generation of graphs); ids and
  slots are copied into static ``(max_rows, 1)`` buffers, and the mask is built inside the graph.
* **Shapes in buckets.** The batch is padded up to :func:`batch_bucket`, the attention width up to a
  multiple of :data:`WIDTH_BUCKET`: one graph per (rows, width), captured when first met. Padding rows
  compute on stale values, their logits are dropped, and they write only into pool rows no live row uses.

Same ids, slots and mask as the slot cache (:class:`~prorag.agent.kv_cache.SlotState`), so log-probabilities
match the eager path up to float noise (a wider width reorders the reductions); ``capture=False`` runs the
very same static path eagerly: what CPU tests check.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from prorag.agent.kv_cache import SlotCache, SlotPool, additive_mask_dtype, cache_keyword, slot_mask
from prorag.core.kernels import compile_static_step

log = logging.getLogger(__name__)

#: The attention width a graph reads is rounded up to a multiple of this (a new graph per bucket).
WIDTH_BUCKET = 128

#: Failed captures after which decode steps run eagerly for good. A capture can fail once and not
#: again (one failed capture could otherwise cost a rollout every graph): each failure drops the
#: graphs and their pool and captures afresh, a few at most.
MAX_CAPTURE_FAILURES = 3


def batch_bucket(rows: int, max_rows: int) -> int:
    """The batch size a step of ``rows`` rows runs at: 1, 2, 4, 8, then the next multiple of 8,
    capped at ``max_rows``. Powers of two for the few-row tail, where a step is cheap and rows
    leave one by one; steps of 8 above, so padding wastes at most 7 rows of a large batch."""
    if rows < 1:
        raise ValueError(f"a decode step needs at least one row, got {rows}")
    if rows > max_rows:
        raise ValueError(f"{rows} rows exceed the {max_rows} the decode graphs were made for")
    bucket = 1 << (rows - 1).bit_length() if rows <= 8 else -(-rows // 8) * 8
    return min(bucket, max_rows)


def width_bucket(used: int) -> int:
    """The attention width for ``used`` slots: rounded up to :data:`WIDTH_BUCKET`."""
    return -(-used // WIDTH_BUCKET) * WIDTH_BUCKET


def grouped_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over the slot cache, for a transformers attention module (registered as
    ``"prorag_slot"``). ``query`` ``(B, H, q, D)``; ``key``/``value`` ``(B, Hkv, W, D)``, views of
    the slot pool; ``attention_mask`` boolean ``(B, 1, q, W)``, True where a query may look.

    The alternative to SDPA: with a mask, transformers' SDPA path expands the key/value heads to
    the query heads (``repeat_kv``: a copy of the whole visible cache, every layer, every step).
    Here the query heads that share a key/value head are stacked as rows of one matrix product,
    so each key and value is read once, from the pool's strided view without a copy; the softmax
    runs in float32 (the scores themselves come out of the product in the model's dtype).
    Measured on a GPU it was no faster than SDPA: opt-in (``DecodeGraphs(attention=)``).
    """
    B, H, q, D = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    group = H // kv_heads
    scale = D**-0.5 if scaling is None else scaling
    # Query head h reads key/value head h // group: heads are grouped kv-major.
    scores = torch.matmul(query.reshape(B, kv_heads, group * q, D), key.transpose(-1, -2)).float() * scale
    if attention_mask is not None:
        visible = attention_mask.reshape(B, 1, 1, q, width) if attention_mask.dtype == torch.bool else None
        scores = scores.view(B, kv_heads, group, q, width)
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        else:  # an additive mask
            scores = scores + attention_mask.reshape(B, 1, 1, q, width).float()
        scores = scores.view(B, kv_heads, group * q, width)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).view(B, H, q, D)
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def attention_implementation(model: Any, name: str) -> Iterator[None]:
    """Run ``model`` with the registered attention ``name`` inside the block (the attention
    modules read ``config._attn_implementation`` at each forward; a captured graph keeps what it
    read at capture)."""
    config = model.config
    saved = config._attn_implementation_internal
    config._attn_implementation_internal = name
    try:
        yield
    finally:
        config._attn_implementation_internal = saved


def _register_slot_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SLOT_ATTENTION, grouped_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SLOT_ATTENTION, sdpa_mask)  # unused: the step passes its own 4D mask


#: The name :func:`grouped_attention` is registered under in transformers.
SLOT_ATTENTION = "prorag_slot"
_register_slot_attention()


def parameter_signature(model: Any) -> tuple[int, ...]:
    """Where the model's parameters live: a captured graph reads these addresses, so a model
    whose tensors were replaced (not updated in place, as an optimiser does) needs new graphs."""
    return tuple(p.data_ptr() for p in model.parameters())


class DecodeGraphs:
    """Static decode steps of ``model`` for batches of at most ``max_rows`` rows.

    ``capture=True`` (CUDA only) records each (rows, width) step as a CUDA graph on its first
    use and replays it afterwards; ``capture=False`` runs the same static step eagerly. The
    graphs share one memory pool (they never run concurrently; each result is cloned out at once).
    ``compile=True`` compiles the step whole before it is run or captured (:mod:`prorag.core.kernels`).
    """

    def __init__(
        self, model: Any, max_rows: int, device: torch.device, capture: bool, attention: str = "model", compile: bool = False
    ) -> None:
        if capture and torch.device(device).type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.model = model
        self.max_rows = max_rows
        self.device = torch.device(device)
        self.capture = capture
        self.pool = SlotPool(max_rows)
        self.ids = torch.zeros(max_rows, 1, dtype=torch.long, device=device)
        self.slots = torch.zeros(max_rows, 1, dtype=torch.long, device=device)
        self.attention = attention
        """The attention the step runs: the model's own (``"model"``, the default), or :data:`SLOT_ATTENTION`
        (:func:`grouped_attention`). Measured on a GPU the two decoded at the same speed (the step's time
        is elsewhere), and the grouped one rounds its scores to bf16, so the model's own attention stays
        the default."""
        self.additive = additive_mask_dtype(model) if attention == "model" else None
        """The dtype of an additive mask (the model's eager attention), or None: a boolean one."""
        self.cache_keyword = cache_keyword(model)
        self.compiled = compile
        """Whether the step runs compiled whole (:func:`~prorag.core.kernels.compile_static_step`): the
        graphs then record the compiled kernels, and ``capture=False`` runs them uncaptured."""
        self._run = compile_static_step(self._step) if compile else self._step
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
        self.captures = 0
        """Graphs recorded so far (a count that only grows; replays reuse them)."""
        self.capture_failures = 0
        """Captures that failed (at :data:`MAX_CAPTURE_FAILURES`, steps run eagerly from then on)."""
        self.shapes: set[tuple[int, int]] = set()
        """The (rows, width) steps run so far, captured or not: the graphs a capturing run holds."""
        self._generation = self.pool.generation
        self._signature = parameter_signature(model)
        self._mempool: Any = None
        """The memory pool the graphs share: the first graph's, once it is captured (a fresh pool
        handle passed to a first capture trips an allocator assertion in torch 2.11)."""

    def new_batch(self) -> None:
        """Called when a batch starts: drop graphs that read parameters no longer there."""
        signature = parameter_signature(self.model)
        if signature != self._signature:
            self._drop_graphs()
            self._signature = signature

    def _drop_graphs(self) -> None:
        self.graphs.clear()
        self._mempool = None  # the pool goes with its last graph

    def decode(self, cache: SlotCache, tokens: torch.Tensor, slots: torch.Tensor, used: int) -> torch.Tensor:
        """One decode step of the ``n = len(tokens)`` rows held: ``tokens`` ``(n,)`` written at
        ``slots`` ``(n, 1)``, attending to at most ``used`` slots; returns the last logits ``(n, V)``."""
        if cache.pool is not self.pool:
            raise ValueError("the cache does not use these decode graphs' slot pool")
        n = tokens.shape[0]
        rows, width = batch_bucket(n, self.max_rows), width_bucket(used)
        cache.reserve(width)
        if self.pool.generation != self._generation:  # the buffers moved: every graph points at freed memory
            self._drop_graphs()
            self._generation = self.pool.generation
        self.ids[:n, 0].copy_(tokens)
        self.slots[:n].copy_(slots)
        self.shapes.add((rows, width))
        if not self.capture:
            return self._run(cache, rows, width)[:n]
        key = (rows, width)
        if key not in self.graphs:
            try:
                self.graphs[key] = self._record(cache, rows, width)
            except RuntimeError as err:  # e.g. an attention kernel that syncs with the host (SDPA's float32 math path)
                self._capture_failed(err, key)
                return self._run(cache, rows, width)[:n]
        graph, logits = self.graphs[key]
        graph.replay()
        return logits[:n].clone()

    def _capture_failed(self, err: RuntimeError, key: tuple[int, int]) -> None:
        """After a failed capture: drop every graph and their shared pool (a failed capture leaves
        the pool's state unknown) and capture afresh from the next step, or, after
        :data:`MAX_CAPTURE_FAILURES`, run every step eagerly (the same static step, uncaptured)."""
        self.capture_failures += 1
        self._drop_graphs()
        final = self.capture_failures >= MAX_CAPTURE_FAILURES
        log.warning(
            "CUDA graph capture failed for %d rows x %d slots (%s; failure %d of %d, %d graphs recorded before); %s",
            *key,
            " ".join(str(err).split())[:300],
            self.capture_failures,
            MAX_CAPTURE_FAILURES,
            self.captures,
            "decode steps run eagerly from now on" if final else "the graphs are dropped and captured afresh",
        )
        if final:
            self.capture = False

    def _step(self, cache: SlotCache, rows: int, width: int) -> torch.Tensor:
        """The static step: reads only the static buffers, the pool and the parameters."""
        slots = self.slots[:rows]
        cache.slots, cache.width, cache.seen = slots, width, width
        mask = slot_mask(torch.arange(width, device=self.device), slots, self.additive)
        implementation = self.model.config._attn_implementation if self.attention == "model" else self.attention
        with attention_implementation(self.model, implementation):
            out = self.model(
                input_ids=self.ids[:rows],
                attention_mask=mask,
                position_ids=slots,
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_keyword: cache},
            )
        return out.logits[:, -1, :]

    def _record(self, cache: SlotCache, rows: int, width: int) -> tuple[Any, torch.Tensor]:
        """Capture the step (after a warm-up on a side stream, as CUDA graph capture requires).
        The warm-up runs the real step: it writes the same keys and values at the same slots as
        the replay that follows, so running it twice changes nothing."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._run(cache, rows, width)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (a data loader, a logger) cannot invalidate the capture.
        with torch.cuda.graph(graph, pool=self._mempool, capture_error_mode="thread_local"):
            logits = self._run(cache, rows, width)
        if self._mempool is None:
            self._mempool = graph.pool()
        self.captures += 1
        return graph, logits
