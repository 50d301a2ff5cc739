"""Sampling one token per row: top-p, greedy, and per-row random streams.

Every token comes from one uniform per row by inverse-CDF sampling (a cumulative sum and a
binary search: measured much faster on a CPU than ``torch.multinomial`` at rollout batch sizes).
By default one generator draws the batch's uniforms. With per-row seeds every row has its own
stream (:class:`RowStreams`: uniforms drawn in blocks, one gather per step, inverse-CDF sampling),
so a row samples the same trajectory whatever rows share its batch: what makes a distributed RL
run sample what one process would. The log-probability returned is that of the temperature-scaled
distribution before top-p filtering. Temperature 0 is greedy decoding, as everywhere in the package.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from prorag.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")


#: Where a stage's sampled rows draw their randomness: ``row``, each from its own stream named by
#: what the row is (:func:`stream_seed`); ``batch``, one generator per engine call, whose draws a
#: row takes in the order the batch consumes them (so its samples change with batch size,
#: chunking, ``RolloutConfig.resume_early`` and CUDA graphs: the same distribution, other draws).
SampleStreams = Literal["row", "batch"]
SAMPLE_STREAMS: tuple[SampleStreams, ...] = ("row", "batch")


def check_sample_streams(value: str, owner: str) -> None:
    """Refuse a ``sample_streams`` that is neither ``row`` nor ``batch`` (``owner``: the config
    class, named in the error)."""
    if value not in SAMPLE_STREAMS:
        raise ValueError(f"{owner}.sample_streams must be one of {SAMPLE_STREAMS}, got {value!r}")


def stream_seed(namespace: str, *parts: object) -> int:
    """The seed of one row's random stream, named by what the row is: ``namespace`` (the stage)
    and ``parts`` (e.g. the run's seed, a question id, a sample index), joined with ``/`` and
    hashed to 63 bits.

    Why a hash of names and not ``seed + i``: the stream then depends on which sample the row is,
    not on where it sits in a batch, a chunk or a process, so batch size, chunking, early resumes,
    CUDA graphs and the number of processes all leave the samples as they are; and no two names
    share a stream by arithmetic accident (``seed 1, row 0`` against ``seed 0, row 1``)."""
    text = "/".join([namespace, *(str(p) for p in parts)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    greedy: bool,
    generator: torch.Generator | None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return ``(tokens, logprobs)``, both ``(B,)``.

    The log-probability is taken under ``softmax(logits / temperature)`` before top-p
    filtering (greedy: ``softmax(logits)``), the distribution a trainer recomputes. A
    ``temperature`` of 0 is greedy decoding, the limit of sampling as it falls (dividing by it
    would turn every logit into an infinity and the distribution into NaNs).

    Each row's token comes from one uniform (:func:`inverse_cdf_sample`): drawn for the batch
    from ``generator``, or given as ``uniforms`` (``(B,)``, in ``[0, 1)``); then a row's token
    depends on its own logits and uniform only, which is what per-row random streams
    (:class:`RowStreams`) need. Top-p: :func:`top_p_filter`.
    """
    logits = logits.float()
    if greedy or temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        probs = top_p_filter(probs, top_p)
    if uniforms is None:
        uniforms = torch.rand(probs.size(0), generator=generator, device=probs.device)
    tokens = inverse_cdf_sample(probs, uniforms)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def descending_values(probs: torch.Tensor) -> torch.Tensor:
    """Each row of ``probs`` sorted in descending order, values only. On a CPU, numpy's sort of
    the values measured several times faster than ``torch.sort``, which always computes the
    permutation too."""
    if probs.device.type == "cpu":
        import numpy as np

        return torch.from_numpy(np.ascontiguousarray(np.sort(probs.detach().numpy(), axis=-1)[:, ::-1]))
    return probs.sort(dim=-1, descending=True).values


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` (``(B, V)``) with every token outside each row's nucleus set to 0: the smallest
    set of most likely tokens whose mass reaches ``top_p`` (the most likely token always stays).

    The nucleus needs the sorted values, not the permutation: its size ``m`` comes from their
    cumulative sum, and the tokens kept are those above the ``m``-th value, plus as many tokens
    equal to it (the first ones by index) as make ``m``. The sizes, and the masses summed, are
    those of a full ``sort``; where probabilities tie at the threshold, which of the tied tokens
    stay is fixed by index here and arbitrary in a sort.
    """
    sorted_p = descending_values(probs)
    size = ((sorted_p.cumsum(-1) - sorted_p) < top_p).sum(-1, keepdim=True).clamp(min=1)
    threshold = sorted_p.gather(-1, size - 1)
    above = probs > threshold
    tied = probs == threshold
    room = size - above.sum(-1, keepdim=True)
    keep = above | (tied & (tied.long().cumsum(-1) <= room))
    return probs.masked_fill(~keep, 0.0)


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` (``(B, V)``, unnormalised weights >= 0) from one uniform
    per row (``(B,)``, in ``[0, 1)``): the token whose interval of the cumulative distribution
    holds ``u * total``. Batched (a cumulative sum and a binary search per row), and a row's
    token is a function of its own weights and its own uniform only.

    The point is cut just below the total, so rounding can never select past the last token;
    a token of weight 0 (cut by top-p) has an empty interval and is never selected.
    """
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    below_total = torch.nextafter(total, torch.zeros_like(total))
    point = torch.minimum(uniforms.to(cdf.dtype)[:, None] * total, below_total)
    return torch.searchsorted(cdf, point, right=True).squeeze(-1)


class RowStreams:
    """One random stream per row of a batch: row ``i``'s ``k``-th sampled token uses the
    ``k``-th uniform of ``torch.Generator().manual_seed(seeds[i])``, whichever rows share its
    batch, in which order, and however long they take.

    Why not one generator per batch: then a row's samples depend on which rows come before it
    and on how many tokens they draw, so the same question with the same seed is written
    differently in another batch (e.g. when a distributed run splits a batch over processes).

    How it stays batched: each row draws uniforms from its generator in blocks of ``block``
    (at least the draws of one action) into a ``(rows, width)`` buffer on the device; a decode
    step reads each row's next uniform with one gather and advances only the rows that kept
    their token (:meth:`draw`), so no Python loop runs per token. :meth:`reserve`, called at
    turn boundaries, tops up the rows about to decode; a row draws a new block exactly when its
    *own* stream runs short, so the blocks a row draws never depend on the other rows.
    """

    def __init__(self, seeds: Sequence[int], device: torch.device, block: int) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        self.device = device
        self.block = max(1, int(block))
        self.buffer = torch.zeros((len(seeds), 0), device=device)
        self.next = torch.zeros(len(seeds), dtype=torch.long, device=device)
        """Index in :attr:`buffer` of each row's next uniform."""
        self.filled = [0] * len(seeds)
        """Uniforms held in each row of :attr:`buffer` (host side)."""

    def reserve(self, rows: Sequence[int], n: int) -> None:
        """Make sure each of ``rows`` has at least ``n`` unused uniforms (one host sync)."""
        used = self.next.tolist()
        short = [r for r in rows if self.filled[r] - used[r] < n]
        if not short:
            return
        left = [self.buffer[r, used[r] : self.filled[r]] for r in range(len(used))]
        for r in short:
            while left[r].numel() < n:
                fresh = torch.rand(self.block, generator=self.generators[r], device=self.device)
                left[r] = torch.cat([left[r], fresh])
        self.filled = [x.numel() for x in left]
        self.buffer = torch.zeros((len(left), max(self.filled)), device=self.device)
        for r, x in enumerate(left):
            self.buffer[r, : x.numel()] = x
        self.next.zero_()

    def draw(self, rows: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """The next uniform of each stream in ``rows`` (``(B,)`` stream indices, distinct);
        only the streams where ``live`` is True advance (the others' draws are discarded, and a
        stream that is not live may be spent: it reads its last uniform)."""
        uniforms = self.buffer[rows, self.next[rows].clamp(max=self.buffer.shape[1] - 1)]
        self.next.index_add_(0, rows, live.long())
        return uniforms
