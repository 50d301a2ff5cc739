"""SFT replay during RL: the format-aware SFT loss on gold trajectories, added to the RL loss.

``L = L_RL + coef * L_SFT(batch_k)``: InstructGPT's PPO-ptx ("mixing the pretraining gradients into the
PPO gradients", Ouyang et al. 2022), with the warm-up's own data and loss (Eq. 1) in place of pretraining
text. Why: outcome RL can move the policy along a direction whose first-order worth on held-out
questions is positive but whose second-order cost, paid in reading the retrieved documents, is larger,
and a KL penalty on the RL questions' own samples does not see that cost. The replay loss measures the
fit to gold reading steps on other questions, so its curvature is the one RL's steps pay; at the start
its gradient is small (pi_rft fits its warm-up data), so it acts as a restoring force, not a second objective.

Draw ``k`` is a pure function of ``(seed, k)`` (:func:`replay_indices`; the trainer numbers its draws with
:func:`draw_index`), so a resumed run draws what the uninterrupted one would have, and arms with one seed
replay the same trajectories in the same order. ``coef`` 0 with a replay file only measures: the loss is
computed without gradients and logged (``replay_nll``), the drift of the warm-up's fit, one forward a step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from prorag.agent.sampling import stream_seed
from prorag.method.losses import (
    reduce_weighted_nll,
    tag_weight_table,
)
from prorag.models.logprobs import causal_lm_label_logprobs
from prorag.models.packing import IGNORE, LabelForward, pack_layout, packed_label_logprobs, packs_in_one_row
from prorag.models.tags import tag_token_ids
from prorag.retrieval.base import Retriever
from prorag.stages.rl.config import SFTReplayConfig
from prorag.stages.sft import WeightedSFTCollator, build_sft_examples, load_trajectories, target_nll

log = logging.getLogger(__name__)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The replay set's order in ``epoch``: a permutation of ``range(n)`` seeded by ``(seed, epoch)``."""
    generator = torch.Generator().manual_seed(stream_seed("sft-replay", seed, epoch))
    return torch.randperm(n, generator=generator).tolist()


def replay_indices(n: int, batch_size: int, seed: int, draw: int) -> list[int]:
    """The examples of draw ``draw``: positions ``draw * batch_size`` to ``(draw + 1) * batch_size - 1``
    of the endless sequence ``epoch_order(n, seed, 0) + epoch_order(n, seed, 1) + ...``.

    Every example is replayed once per epoch, in an order no other seed shares; a batch that
    runs past the end of an epoch continues into the next one's order (so with ``batch_size > n``
    a batch can hold an example twice)."""
    if n < 1:
        raise ValueError("replay_indices needs at least one example")
    if batch_size < 1 or draw < 0:
        raise ValueError(f"replay_indices needs batch_size >= 1 and draw >= 0, got {batch_size}, {draw}")
    start = draw * batch_size
    out: list[int] = []
    epoch, offset = divmod(start, n)
    while len(out) < batch_size:
        order = epoch_order(n, seed, epoch)
        out.extend(order[offset : offset + batch_size - len(out)])
        epoch, offset = epoch + 1, 0
    return out


def draw_index(step: int, micro_batch: int, accumulation: int, process: int, processes: int) -> int:
    """The draw of one RL loss computation: optimiser ``step`` (0-based), its ``micro_batch`` of
    ``accumulation``, on ``process`` of ``processes``. Distinct for every computation of a run, and
    the same whether a run was resumed or not; on one process draws go 0, 1, 2, ..."""
    return (step * accumulation + micro_batch) * processes + process


class SFTReplay:
    """The replay set of one RL run, tokenised as the SFT stage tokenises it, and its loss.

    ``examples`` are :func:`~prorag.stages.sft.build_sft_examples` rows."""

    def __init__(self, examples: Sequence[dict[str, Any]], pad_token_id: int, config: SFTReplayConfig, seed: int) -> None:
        if not examples:
            raise ValueError(f"{config.file}: no trajectory left to replay (all dropped as overlong or without a target?)")
        self.examples = list(examples)
        self.config = config
        self.seed = seed
        self.collate = WeightedSFTCollator(pad_token_id)

    def __len__(self) -> int:
        return len(self.examples)

    def batch(self, draw: int) -> dict[str, torch.Tensor]:
        """Draw ``draw``'s examples, collated (``input_ids``, ``attention_mask``, ``loss_weights``)."""
        picked = replay_indices(len(self.examples), self.config.batch_size, self.seed, draw)
        return self.collate([self.examples[i] for i in picked])

    def loss(
        self,
        model: Any,
        draw: int,
        *,
        fused: bool,
        packed: bool = False,
        row_tokens: int | None = None,
        rows: int | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """The format-aware SFT loss of draw ``draw`` under ``model`` (a scalar with its graph).
        ``fused``: through TRL's fused LM head (its temperature must be 1), else the LM head in chunks of
        ``chunk`` tokens (:func:`~prorag.models.logprobs.causal_lm_label_logprobs`; ``None``: the full
        logits). ``packed``: the batch's trajectories packed into rows of ``row_tokens``
        (:func:`~prorag.models.packing.pack_layout`), ``rows`` of them per forward, equal to the padded
        batch up to float rounding."""
        device = next(model.parameters()).device
        batch = {k: v.to(device) for k, v in self.batch(draw).items()}
        ids, mask, weights = batch["input_ids"], batch["attention_mask"], batch["loss_weights"]
        labels = torch.where(weights > 0, ids, torch.full_like(ids, IGNORE))
        if packed:
            layout = pack_layout(mask, row_tokens, one_row=packs_in_one_row(model))
            logp, _ = packed_label_logprobs(replay_forward(model, fused, chunk), layout, ids, labels, rows=rows)
            nll = -logp
        elif fused or chunk is None:
            nll, _, _ = target_nll(model, ids, mask, weights, fused=fused)
        else:
            nll = -causal_lm_label_logprobs(model, ids, labels, chunk=chunk, attention_mask=mask)
        return reduce_weighted_nll(nll, weights, self.config.reduction)


def replay_forward(model: Any, fused: bool, chunk: int | None) -> LabelForward:
    """The labels' log-probabilities of one packed forward of ``model``: TRL's fused LM head
    (``fused``), else the LM head in chunks of ``chunk`` tokens at temperature 1."""
    if fused:

        def forward(**inputs: Any) -> tuple[torch.Tensor, None]:
            return model(**inputs, fused_lm_head=True).log_probs, None

        return forward

    def chunked(input_ids: torch.Tensor, labels: torch.Tensor, **inputs: Any) -> tuple[torch.Tensor, None]:
        inputs.pop("use_cache", None)
        return causal_lm_label_logprobs(model, input_ids, labels, chunk=chunk, **inputs), None

    return chunked


def load_replay(
    config: SFTReplayConfig,
    tokenizer: Any,
    *,
    seed: int,
    retriever: Retriever | None = None,
    top_k: int = 3,
    prompt_style: Any = None,
) -> SFTReplay:
    """The replay set of ``config.file`` (gold trajectories, or records rendered with ``retriever``
    at ``top_k``), tokenised with the policy's prompt (``prompt_style``) and tag weights."""
    if not config.file:
        raise ValueError("RLConfig.sft_replay.coef > 0 needs `sft_replay.file` (the gold trajectories to replay)")
    trajectories, _ = load_trajectories(config.file, retriever, top_k)
    if config.limit is not None:
        trajectories = trajectories[: config.limit]
    table = tag_weight_table(tag_token_ids(tokenizer), config.weight_scheme, config.control_lambda)
    examples, stats = build_sft_examples(
        trajectories, tokenizer, table, prompt_style=prompt_style, max_length=config.max_length, overlong="drop"
    )
    log.info(
        "SFT replay: %d trajectories of %s (%s), %g x their loss in each RL loss", len(examples), config.file, stats, config.coef
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return SFTReplay(examples, int(pad), config, seed)


__all__ = ["SFTReplay", "SFTReplayConfig", "draw_index", "epoch_order", "load_replay", "replay_forward", "replay_indices"]
