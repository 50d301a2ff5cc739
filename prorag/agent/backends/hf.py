"""The ``hf`` backend: the project's own decode loop on a Hugging Face causal LM.

It holds the model, its KV cache choice (the engine's static slot cache where the model supports
it, else the model's own cache) and the CUDA decode graphs, kept across batches and calls. The
rollout loop drives it one token step at a time (:meth:`HFBackend.open_state`, :meth:`HFBackend.sample`),
which lets a row get the environment's reply and go on while others still write their action
(``RolloutConfig.resume_early``); :meth:`HFBackend.continue_batch` runs the same steps for whole
actions, the contract every backend meets (:mod:`prorag.agent.backends.base`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from prorag.agent.backends.base import Continuation, Continued, Sampling, finish_of
from prorag.agent.decode_graphs import DecodeGraphs
from prorag.agent.kv_cache import BatchState, SlotState, supports_slot_cache
from prorag.agent.sampling import RowStreams, sample_next


class HFBackend:
    """Token-step generation on ``model`` (see the module docstring); ``config`` is the rollout
    config it was made for (``decode_graphs``, ``compile_decode``, ``batch_size``)."""

    def __init__(self, model: Any, config: Any) -> None:
        self.model = model
        self.config = config
        self.static_cache = supports_slot_cache(model)
        """Whether batches run on the engine's :class:`~prorag.agent.kv_cache.SlotCache` (set False to use the model's own cache)."""
        self.graphs: DecodeGraphs | None = None
        """The decode graphs of this model, kept across batches and calls (see :meth:`decode_graphs_for`)."""
        pad = getattr(getattr(model, "config", None), "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        """The id padding is written with (the rollout engine sets its tokenizer's)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def generation_config(self) -> Any:
        return getattr(self.model, "generation_config", None)

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """The model in eval mode, without gradients, for the duration (its mode restored after)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.train(was_training)

    def open_state(self, rows: int, pad_id: int, expected: int, config: Any) -> SlotState | BatchState:
        """A KV cache state for ``rows`` rows of up to ``expected`` positions."""
        if self.static_cache:
            return SlotState(self.model, rows, pad_id, self.device, expected, graphs=self.decode_graphs_for(rows, config))
        return BatchState(self.model, rows, pad_id, self.device, expected)

    def decode_graphs_for(self, rows: int, config: Any) -> DecodeGraphs | None:
        """The decode graphs a batch of ``rows`` rows runs its decode steps on (None: eager
        forwards), per ``config.decode_graphs``: ``auto`` captures on CUDA only. Made once and
        kept, so graphs captured for one batch serve the next; remade larger if a batch outgrows them."""
        mode = config.decode_graphs
        if mode == "off" or (mode == "auto" and self.device.type != "cuda"):
            return None
        if self.graphs is None or self.graphs.max_rows < rows:
            self.graphs = None  # free the old pool before allocating the new one
            self.graphs = DecodeGraphs(
                self.model,
                max(rows, config.batch_size),
                self.device,
                capture=mode == "auto",
                compile=config.compile_decode,
            )
        return self.graphs

    @staticmethod
    def sample(
        logits: torch.Tensor,
        sampling: Sampling,
        generator: torch.Generator | None,
        streams: RowStreams | None = None,
        held: torch.Tensor | None = None,
        live: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample the next token of every held row: from ``generator``, or from the ``streams``
        of the rows ``held`` (advancing those of the ``live`` rows, whose token is kept)."""
        uniforms = streams.draw(held, live) if streams is not None and held is not None and live is not None else None
        return sample_next(
            logits,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            greedy=sampling.greedy,
            generator=generator,
            uniforms=uniforms,
        )

    def continue_batch(self, requests: Sequence[Continuation], sampling: Sampling) -> list[Continued]:
        """Continue every request until a stop id or its cap (one batch, one KV cache). Rows with
        seeds sample from their own streams (:class:`~prorag.agent.sampling.RowStreams`), so a row's
        continuation does not depend on its batch; without seeds one generator (seed 0) samples."""
        if not requests:
            return []
        dev = self.device
        cap = max(r.max_tokens for r in requests)
        streams = None
        if not sampling.greedy and all(r.seed is not None for r in requests):
            streams = RowStreams([int(r.seed) for r in requests], dev, 2 * cap)  # type: ignore[arg-type]
            streams.reserve(range(len(requests)), cap)
        generator = torch.Generator(device=dev).manual_seed(0)
        stop_ids = torch.tensor(sorted(sampling.stop_ids), dtype=torch.long, device=dev)
        limits = torch.tensor([r.max_tokens for r in requests], device=dev)
        held = torch.arange(len(requests), device=dev)
        ids: list[list[int]] = [[] for _ in requests]
        lps: list[list[float]] = [[] for _ in requests]
        with self.generating():
            state = self.open_state(len(requests), self.pad_id, max(len(r.ids) for r in requests) + cap, self.config)
            logits = state.feed([list(r.ids) for r in requests])
            live = torch.ones(len(requests), dtype=torch.bool, device=dev)
            written = torch.zeros(len(requests), dtype=torch.long, device=dev)
            while True:
                tok, lp = self.sample(logits, sampling, generator, streams, held, live)
                for j in live.nonzero().squeeze(-1).tolist():
                    ids[j].append(int(tok[j]))
                    lps[j].append(float(lp[j]))
                written += live.long()
                live = live & ~(torch.isin(tok, stop_ids) | (written >= limits))
                if not bool(live.any()):
                    break
                logits = state.feed_step(tok, live)
        return [Continued(i, lp, finish_of(i, sampling.stop_ids)) for i, lp in zip(ids, lps, strict=True)]


__all__ = ["HFBackend"]
