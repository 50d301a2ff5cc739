"""Batched multi-turn rollouts: the policy writes actions, the environment retrieves.

The engine runs a batch of questions through the ProRAG loop (METHOD.md section 1): the model
writes an action; on ``</subquery>`` the environment searches and appends
``<retrieval>…</retrieval>`` and the next ``<step>`` opener; on ``</subanswer>`` it appends the
opener; ``</answer>`` or end-of-sequence ends the trajectory. What comes out is token-in /
token-out: the completion holds exactly the ids the model sampled, interleaved with the
environment's ids, which an ``env_mask`` marks 0. Nothing the model wrote is ever decoded and
re-encoded into the sequence.

How a batch runs (the choices a reader should know):

* **One KV cache for the whole batch, kept across turns.** After a retrieval only the new
  tokens (the model's stop tag plus the environment's text) are fed; the prefix is never
  re-encoded.
* **Turns are batch-synchronous.** Every row decodes one token per step until each active row
  has closed its action (or hit a cap); then all rows that go on get their environment tokens
  in a single forward pass (one retrieval call and one tokenizer call for the whole batch).
  On the static cache below, rows whose trajectory has ended leave the batch (and the cache)
  there, so later turns run only the rows still going.
* **A static, engine-owned cache** (:class:`SlotCache`) for full-attention transformers models
  (Llama, Qwen2/3, Mistral without sliding window; SDPA or eager attention, see
  :func:`supports_slot_cache`): per layer, key/value buffers ``(rows, heads, capacity,
  head_dim)`` allocated when a batch starts (at least 256 slots, doubled when full, so a few
  times per batch at most), written in place. Every row writes its token ``t`` at slot ``t`` of its own row, so a row's cache holds
  exactly its prompt and completion, without holes: a row that waits for the others in a
  decode step writes at its next slot without advancing (the next real token overwrites it),
  and the padding of a right-aligned environment chunk is written past the row's end. The
  attention mask is ``slot <= position of the query``, computed on the device against the
  used length rounded up to 32 slots, so shapes stay static for 32 steps at a time.
  Other models (sliding windows, flash attention, custom caches, the test doubles) keep their
  own cache: then rows feed the same number of positions per forward, and a row that waits or
  a shorter insertion leaves padding "holes" that the mask hides and position ids skip.
* **The decode step is per-row-loop free.** Sampling, log-probabilities, stop detection and
  caps are tensor operations with static shapes ``(B, 1)``, and the static cache's step copies
  nothing from the host (write slots, positions and mask come from a device tensor of lengths);
  the only host sync per step is "is any row still decoding". Python work per row happens
  only at turn boundaries (retrieval, tokenising the environment's text), which keeps the
  step ready for CUDA graphs.
* **Randomness per batch or per row.** By default one generator samples a whole batch. With
  ``row_seeds`` every row has its own stream (:class:`RowStreams`: uniforms drawn in blocks,
  one gather per step, inverse-CDF sampling), so a row samples the same trajectory whatever
  rows share its batch: what makes a distributed RL run sample what one process would.
* **Caps end runaway generations**: tokens per action, actions per trajectory (11 in RL, 13 at
  inference) and completion tokens per trajectory. A capped trajectory is kept, its
  ``stop_reason`` says why, and it is malformed (no final answer), which rewards penalise.

Log-probabilities are those of the sampled tokens under the temperature-scaled distribution
before top-p filtering (what TRL recomputes for its importance ratio); 0 on environment tokens.
"""

from __future__ import annotations

import inspect
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin

from prorag.agent.prompts import PromptStyle, prompt_token_ids
from prorag.agent.schema import (
    ANSWER_CLOSE,
    SUBANSWER_CLOSE,
    SUBQUERY_CLOSE,
    SUBQUERY_OPEN,
    TAGS,
    extract_answer,
    parse_token_actions,
    parse_trajectory,
    render_env_turn,
)
from prorag.data.records import Record
from prorag.retrieval.base import Hit, Retriever

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    """Settings of the rollout engine (defaults: inference, METHOD.md section 1)."""

    max_actions: int = field(default=13, metadata={"help": "Actions per trajectory: 13 at inference, 11 during RL."})
    max_action_tokens: int = field(default=128, metadata={"help": "Tokens the model may write in one action before it is cut."})
    max_completion_tokens: int = field(
        default=2048, metadata={"help": "Completion tokens (model and environment) per trajectory."}
    )
    top_k: int = field(default=3, metadata={"help": "Documents retrieved per sub-query."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass (1.0: off)."})
    greedy: bool = field(default=False, metadata={"help": "Greedy decoding (temperature and top_p are then ignored)."})
    batch_size: int = field(default=32, metadata={"help": "Trajectories the engine decodes together."})
    seed: int = field(default=0, metadata={"help": "Seed of the sampling."})
    prompt_style: PromptStyle | None = field(
        default=None, metadata={"help": "`plain` or `chat`; by default chat when the tokenizer has a chat template."}
    )


@dataclass
class ActionRecord:
    """One action of a trajectory: its kind, token span (over the completion) and I_step."""

    kind: str | None
    span: tuple[int, int]
    well_formed: bool


@dataclass
class Trajectory:
    """One rollout, token-in/token-out, with the decoded text beside the ids."""

    id: str
    question: str
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]
    actions: list[ActionRecord]
    retrievals: list[dict[str, Any]]
    """One entry per search: ``{"query", "doc_ids", "action"}`` (action index)."""
    stop_reason: str
    """answer | eos | max_action_tokens | max_actions | max_completion_tokens"""
    text: str = ""
    """The completion decoded with special tokens kept (for people and text metrics)."""
    answer: str | None = None
    valid: bool = False
    """I_traj of the completion."""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_searches(self) -> int:
        return len(self.retrievals)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["actions"] = [{"kind": a.kind, "span": list(a.span), "well_formed": a.well_formed} for a in self.actions]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["actions"] = [ActionRecord(a["kind"], tuple(a["span"]), a["well_formed"]) for a in d["actions"]]
        return cls(**d)


@dataclass
class _Row:
    """A trajectory being written: what the engine has collected for one record so far."""

    prompt: list[int]
    completion: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    retrievals: list[dict[str, Any]] = field(default_factory=list)
    n_actions: int = 0
    max_actions: int = 13
    stop_reason: str | None = None


# ----------------------------------------------------------------------------- sampling


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
    filtering (greedy: ``softmax(logits)``), the distribution a trainer recomputes.

    The randomness comes from ``generator`` (``torch.multinomial`` over the whole batch), or,
    when ``uniforms`` (``(B,)``, in ``[0, 1)``) is given, from one number per row
    (:func:`inverse_cdf_sample`): then a row's token depends on its own logits and uniform only,
    which is what per-row random streams (:class:`RowStreams`) need.
    """
    logits = logits.float()
    if greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    if uniforms is None:
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    else:
        tokens = inverse_cdf_sample(probs, uniforms)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


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


# ----------------------------------------------------------------------------- the engine


class RolloutEngine:
    """Runs a policy with a retriever over batches of questions (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, retriever: Retriever, config: RolloutConfig | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.retriever = retriever
        self.config = config or RolloutConfig()
        vocab = tokenizer.get_vocab()
        missing = [t for t in TAGS if t not in vocab]
        if missing:
            raise ValueError(f"the tokenizer lacks the trajectory tags {missing}; register them (prorag.models.add_tag_tokens)")
        self.tag_ids = {t: vocab[t] for t in TAGS}
        eos = _eos_ids(model, tokenizer)
        self.stop_ids = torch.tensor(sorted(eos | {self.tag_ids[t] for t in (SUBQUERY_CLOSE, SUBANSWER_CLOSE, ANSWER_CLOSE)}))
        self.eos_ids = eos
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
        self.pad_id = int(pad)
        self.blank_ids = _blank_token_ids(tokenizer)
        self.static_cache = supports_slot_cache(model)
        """Whether batches run on the engine's :class:`SlotCache` (set False to use the model's own cache)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_ids(self, question: str) -> list[int]:
        return prompt_token_ids(self.tokenizer, question, self.config.prompt_style)

    @torch.no_grad()
    def rollout(
        self,
        records: Sequence[Record],
        *,
        seed: int | None = None,
        prompts: Sequence[str] | None = None,
        prompt_ids: Sequence[Sequence[int]] | None = None,
        max_actions: Sequence[int] | None = None,
        close_turn: bool = False,
        progress: bool = False,
        on_batch: Callable[[list[Trajectory]], None] | None = None,
        row_seeds: Sequence[int] | None = None,
    ) -> list[Trajectory]:
        """Roll out every record, in batches of ``config.batch_size``; results keep input order.

        ``prompts`` overrides the ProRAG prompt of each record (the baselines use it, with
        ``max_actions=1``, to generate a single answer through the same engine). ``on_batch``
        receives each finished batch (to append results to a file as they come).

        Continuing from a state (tree search): ``prompt_ids`` gives each row's context as token
        ids (prompt plus the completion so far, environment tokens included), fed as they are,
        so the returned completion holds only what comes next; ``max_actions`` caps the actions
        of each row (default ``config.max_actions``); with ``close_turn`` a row that the action
        cap ends after a search or a conclusion still gets the environment's reply (the
        retrieval and the next ``<step>`` opener), so it ends exactly where its next action
        would begin.

        Randomness: by default one generator, seeded with ``seed`` (else ``config.seed``), samples
        every row of a batch, so a row's trajectory depends on the rows it is batched with.
        ``row_seeds`` gives each row its own stream instead (:class:`RowStreams`): a row's
        trajectory then depends only on its prompt, the model and its seed (up to the float noise
        of batched forward passes), whatever batch it is in; ``seed`` is then unused. The RL
        stage uses it so that a distributed run samples what a single process would.
        """
        if prompts is not None and len(prompts) != len(records):
            raise ValueError(f"{len(prompts)} prompts for {len(records)} records")
        if prompts is not None and prompt_ids is not None:
            raise ValueError("pass prompts or prompt_ids, not both")
        for name, per_row in (("prompt_ids", prompt_ids), ("max_actions", max_actions), ("row_seeds", row_seeds)):
            if per_row is not None and len(per_row) != len(records):
                raise ValueError(f"{len(per_row)} {name} for {len(records)} records")
        cfg = self.config
        # The generator lives on the model's device, so sampling never moves logits to the host.
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed if seed is None else seed)
        was_training = self.model.training
        self.model.eval()
        out: list[Trajectory] = []
        bar = tqdm(total=len(records), desc="rollout", unit="q", disable=not progress)
        try:
            for start in range(0, len(records), cfg.batch_size):
                batch = list(records[start : start + cfg.batch_size])
                if prompt_ids is not None:
                    ids = [list(p) for p in prompt_ids[start : start + cfg.batch_size]]
                elif prompts is None:
                    ids = [self.prompt_ids(r.question) for r in batch]
                else:
                    ids = self.tokenizer(list(prompts[start : start + cfg.batch_size]), add_special_tokens=False)["input_ids"]
                caps = list(max_actions[start : start + cfg.batch_size]) if max_actions is not None else None
                streams = None
                if row_seeds is not None and not cfg.greedy:
                    # A block holds at least one action's draws, so a turn never runs a row dry.
                    streams = RowStreams(row_seeds[start : start + cfg.batch_size], self.device, 2 * cfg.max_action_tokens)
                trajs = self._rollout_batch(batch, ids, generator, caps, close_turn, streams)
                out.extend(trajs)
                if on_batch is not None:
                    on_batch(trajs)
                bar.update(len(batch))
        finally:
            bar.close()
            self.model.train(was_training)
        return out

    # ------------------------------------------------------------------ one batch

    def _rollout_batch(
        self,
        records: list[Record],
        prompts: list[list[int]],
        generator: torch.Generator,
        max_actions: list[int] | None = None,
        close_turn: bool = False,
        streams: RowStreams | None = None,
    ) -> list[Trajectory]:
        """Roll out one batch. With ``streams`` (one per row, indexed like ``records``), each
        sample draws from the streams of the rows held, and only rows that keep their token
        (``decoding``) advance theirs; otherwise ``generator`` samples the batch."""
        cfg = self.config
        dev = self.device
        subquery_close, subanswer_close = self.tag_ids[SUBQUERY_CLOSE], self.tag_ids[SUBANSWER_CLOSE]
        stop_ids = self.stop_ids.to(dev)
        caps = max_actions or [cfg.max_actions] * len(prompts)
        rows = [_Row(prompt=p, max_actions=cap) for p, cap in zip(prompts, caps, strict=True)]
        held = list(range(len(records)))  # the record each row of the batch holds (finished rows leave)
        # A row holds its prompt, at most max_completion_tokens, and at most one action past them.
        expected = max(map(len, prompts)) + cfg.max_completion_tokens + cfg.max_action_tokens
        state: _SlotState | _BatchState = (_SlotState if self.static_cache else _BatchState)(
            self.model, len(held), self.pad_id, dev, expected
        )
        held_ids = torch.arange(len(held), device=dev)  # ``held`` on the device (the streams' indices)
        logits = state.feed([list(p) for p in prompts])
        decoding = torch.ones(len(held), dtype=torch.bool, device=dev)
        if streams is not None:
            streams.reserve(held, cfg.max_action_tokens)
        tok, lp = self._sample(logits, generator, streams, held_ids, decoding)

        while True:
            # ---- decode until every active row has closed its action (or hit a cap)
            step_tok, step_lp, step_on = [], [], []
            n_tok = torch.zeros(len(held), dtype=torch.long, device=dev)
            while True:
                step_tok.append(tok)
                step_lp.append(lp)
                step_on.append(decoding)
                n_tok += decoding.long()
                decoding = decoding & ~(torch.isin(tok, stop_ids) | (n_tok >= cfg.max_action_tokens))
                if not bool(decoding.any()):
                    break
                logits = state.feed_step(tok, decoding)
                tok, lp = self._sample(logits, generator, streams, held_ids, decoding)

            # ---- turn boundary: move this turn's tokens to the rows, decide what comes next
            toks, lps, ons = (torch.stack(x, 1).cpu().tolist() for x in (step_tok, step_lp, step_on))
            searches: list[int] = []
            capped: list[int] = []  # rows the action cap ended this turn that still get the environment's reply
            for j, i in enumerate(held):
                ids = [t for t, on in zip(toks[j], ons[j], strict=True) if on]
                if not ids:
                    continue
                row = rows[i]
                row.completion.extend(ids)
                row.mask.extend([1] * len(ids))
                row.logprobs.extend(x for x, on in zip(lps[j], ons[j], strict=True) if on)
                row.n_actions += 1
                last = ids[-1]
                # </answer> first: policies list it among their EOS ids too.
                if last == self.tag_ids[ANSWER_CLOSE]:
                    row.stop_reason = "answer"
                elif last in self.eos_ids:
                    row.stop_reason = "eos"
                elif last not in (subquery_close, subanswer_close):
                    row.stop_reason = "max_action_tokens"
                elif row.n_actions >= row.max_actions:
                    row.stop_reason = "max_actions"
                    if close_turn:
                        capped.append(i)
                        if last == subquery_close:
                            searches.append(i)
                elif last == subquery_close:
                    searches.append(i)
            hits = self._search(records, {i: rows[i].completion for i in searches})
            going = [i for i in held if rows[i].stop_reason is None]
            replied = going + capped
            env_texts = []
            for i in replied:
                row = rows[i]
                if row.completion[-1] == subquery_close:
                    found = hits[i]
                    env_texts.append(render_env_turn(found))
                    row.retrievals.append(
                        {"query": self._last_query(row.completion), "doc_ids": [h.id for h in found], "action": row.n_actions - 1}
                    )
                else:
                    env_texts.append(render_env_turn())
            chunks: dict[int, list[int]] = {}
            for i, env_ids in zip(
                replied, self.tokenizer(env_texts, add_special_tokens=False)["input_ids"] if replied else [], strict=True
            ):
                row = rows[i]
                if len(row.completion) + len(env_ids) + 1 > cfg.max_completion_tokens:
                    row.stop_reason = row.stop_reason or "max_completion_tokens"
                    continue
                row.completion.extend(env_ids)
                row.mask.extend([0] * len(env_ids))
                row.logprobs.extend([0.0] * len(env_ids))
                if row.stop_reason is not None:  # capped: the reply is the trajectory's end, not fed
                    continue
                # The stop tag the model sampled has not been fed yet: it leads the chunk.
                chunks[i] = [row.completion[-len(env_ids) - 1], *env_ids]
            if not chunks:
                break
            # Rows whose trajectory has ended leave the batch, when the cache can drop them.
            keep = [j for j, i in enumerate(held) if i in chunks]
            if len(keep) < len(held) and state.can_drop:
                state.select(keep)
                held = [held[j] for j in keep]
                held_ids = torch.tensor(held, dtype=torch.long, device=dev)
            logits = state.feed([chunks.get(i) for i in held])
            decoding = torch.tensor([i in chunks for i in held], dtype=torch.bool, device=dev)
            if streams is not None:
                streams.reserve(list(chunks), cfg.max_action_tokens)
            tok, lp = self._sample(logits, generator, streams, held_ids, decoding)

        return [self._finish(rec, row) for rec, row in zip(records, rows, strict=True)]

    def _sample(
        self,
        logits: torch.Tensor,
        generator: torch.Generator,
        streams: RowStreams | None = None,
        held: torch.Tensor | None = None,
        live: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample the next token of every held row: from ``generator``, or from the ``streams``
        of the rows ``held`` (advancing those of the ``live`` rows, whose token is kept)."""
        cfg = self.config
        uniforms = streams.draw(held, live) if streams is not None and held is not None and live is not None else None
        return sample_next(
            logits, temperature=cfg.temperature, top_p=cfg.top_p, greedy=cfg.greedy, generator=generator, uniforms=uniforms
        )

    def _last_query(self, ids: list[int]) -> str:
        """Text between the last ``<subquery>`` and the final ``</subquery>`` (empty if the opener is missing)."""
        open_id = self.tag_ids[SUBQUERY_OPEN]
        try:
            start = len(ids) - 1 - ids[::-1].index(open_id)
        except ValueError:
            return ""
        return self.tokenizer.decode(ids[start + 1 : -1], skip_special_tokens=True).strip()

    def _search(self, records: list[Record], completions: dict[int, list[int]]) -> dict[int, list[Hit]]:
        """One batched retrieval for every record that searched this turn; an empty query finds nothing."""
        asked = [(r, self._last_query(ids)) for r, ids in completions.items()]
        nonempty = [(r, q) for r, q in asked if q]
        found: dict[int, list[Hit]] = {r: [] for r in completions}
        if nonempty:
            results = self.retriever.search(
                [q for _, q in nonempty], k=self.config.top_k, partitions=[records[r].partition for r, _ in nonempty]
            )
            for (r, _), hits in zip(nonempty, results, strict=True):
                found[r] = hits
        return found

    def _finish(self, record: Record, row: _Row) -> Trajectory:
        completion, mask, stop_reason = row.completion, row.mask, row.stop_reason or "max_actions"
        text = self.tokenizer.decode(completion, skip_special_tokens=False)
        actions = [
            ActionRecord(a.kind.value if a.kind is not None else None, a.span, a.well_formed)
            for a in parse_token_actions(completion, self.tag_ids, mask, blank_ids=self.blank_ids)
        ]
        parsed = parse_trajectory(_strip_eos(text, self.tokenizer))
        return Trajectory(
            id=record.id,
            question=record.question,
            prompt_ids=row.prompt,
            completion_ids=completion,
            env_mask=mask,
            logprobs=row.logprobs,
            actions=actions,
            retrievals=row.retrievals,
            stop_reason=stop_reason,
            text=text,
            answer=extract_answer(text),
            valid=parsed.valid and stop_reason in ("answer", "eos"),
            metadata={"partition": record.partition} if record.partition else {},
        )


# ----------------------------------------------------------------------------- KV-cache state

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


class _SlotLayer(CacheLayerMixin):
    """One layer of a :class:`SlotCache`: preallocated buffers written in place at given slots."""

    is_sliding = False

    def __init__(self, owner: SlotCache) -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, Dk = key_states.shape
        cap = self.owner.capacity
        self.keys = key_states.new_zeros((B, H, cap, Dk))
        self.values = value_states.new_zeros((B, H, cap, value_states.shape[-1]))
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.owner.slots[:, None, :, None]
        self.keys.scatter_(2, slots.expand_as(key_states), key_states)
        self.values.scatter_(2, slots.expand(-1, value_states.shape[1], -1, value_states.shape[-1]), value_states)
        width = self.owner.width
        return self.keys[:, :, :width], self.values[:, :, :width]

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
        if self.is_initialized:
            self.keys = self.keys.index_select(0, rows)
            self.values = self.values.index_select(0, rows)


class SlotCache(Cache):
    """The engine's static KV cache (a ``transformers`` ``Cache``): per layer, buffers
    ``(rows, kv_heads, capacity, head_dim)`` written in place at the slots the engine sets
    before each forward (``slots``, ``(rows, q)``: a row's slot is the position of its token),
    read back over the first ``width`` slots.

    ``rows`` holds, for each row, its index in the batch the cache was made for; dropping
    finished rows (:meth:`select`) keeps it in step, so a model that keeps per-row state can
    follow its rows.
    """

    def __init__(self, batch: int, device: torch.device, expected: int = 0) -> None:
        super().__init__(layer_class_to_replicate=lambda: _SlotLayer(self))
        self.expected = expected
        """Slots a row is expected to need at most: growth by doubling stops there (unless more is needed)."""
        self.capacity = 0
        self.width = 0
        self.seen = 0
        self.slots = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.rows = torch.arange(batch, device=device)

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` slots (doubling, so that growth is rare, up to :attr:`expected`)."""
        if capacity > self.capacity:
            self.capacity = max(capacity, min(max(2 * self.capacity, _SLOT_MIN_CAPACITY), self.expected))
            for layer in self.layers:
                layer.resize(self.capacity)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current rows), in that order."""
        for layer in self.layers:
            layer.select(rows)
        self.rows = self.rows.index_select(0, rows)


class _SlotState:
    """A batch on a :class:`SlotCache`: each row's length (its next slot and position) and the mask.

    A row's token ``t`` is at slot ``t``: a fed chunk is right-aligned, its real tokens go to the
    row's next slots and its left padding past them; a decode step writes every row at its next
    slot and advances only the rows that decode. Query ``i`` of row ``b`` attends to the slots
    up to its own, ``slot <= slots[b, i]``; padding and waiting rows only ever see their own row's
    real tokens and stale values past its end, never anything a real token attends to.
    """

    def __init__(self, model: Any, batch: int, pad_id: int, device: torch.device, expected: int = 0) -> None:
        self.model = model
        self.pad_id = pad_id
        self.device = device
        self.cache = SlotCache(batch, device, expected)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.longest = 0
        """An upper bound of ``length.max()`` kept on the host (exact after each chunk)."""
        self.slot_ids = torch.arange(0, device=device)
        dtype = next(model.parameters()).dtype
        # SDPA takes a boolean mask; eager attention adds the mask to its scores.
        self.additive = model.config._attn_implementation != "sdpa"
        self.mask_dtype = dtype if dtype.is_floating_point else torch.float32

    can_drop = True

    def feed(self, chunks: Sequence[list[int] | None]) -> torch.Tensor:
        """Feed a chunk of tokens per row (None: nothing), right-aligned; return last-position logits ``(B, V)``."""
        n = [len(c) if c else 0 for c in chunks]
        width = max(n)
        ids = torch.full((len(chunks), width), self.pad_id, dtype=torch.long)
        for r, c in enumerate(chunks):
            if c:
                ids[r, width - len(c) :] = torch.tensor(c)
        count = torch.tensor(n)[:, None]
        col = torch.arange(width)[None, :]
        # Real tokens (the last n columns) go to the next n slots, the padding after them.
        offset = torch.where(col >= width - count, col - (width - count), count + col)
        before = self.length.tolist()
        slots = self.length[:, None] + offset.to(self.device)
        logits = self._forward(ids.to(self.device), slots, max(before) + width)
        after = [a + b for a, b in zip(before, n, strict=True)]
        self.length = torch.tensor(after, dtype=torch.long, device=self.device)
        self.longest = max(after)
        return logits

    def feed_step(self, tokens: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``live`` False: written at the row's next slot, not kept); the decode step."""
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
        allowed = self.slot_ids[:width] <= slots[:, None, :, None]
        mask = (
            allowed
            if not self.additive
            else torch.zeros(allowed.shape, dtype=self.mask_dtype, device=self.device).masked_fill_(
                ~allowed, torch.finfo(self.mask_dtype).min
            )
        )
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=slots, past_key_values=self.cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[:, -1, :]


class _BatchState:
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
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            **self.extra,
        )
        self.cache = out.past_key_values
        self.next_pos = self.next_pos + live.sum(1)
        return out.logits[:, -1, :]


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update([source] if isinstance(source, int) else list(source))
    return ids


def _blank_token_ids(tokenizer: Any) -> list[int]:
    """Ids of tokens that decode to whitespace only (the token parser treats them as layout)."""
    vocab = tokenizer.get_vocab()
    return sorted(i for i in vocab.values() if not tokenizer.decode([i]).strip() and i not in _special_ids(tokenizer))


def _special_ids(tokenizer: Any) -> set[int]:
    return set(getattr(tokenizer, "all_special_ids", []) or [])


def _strip_eos(text: str, tokenizer: Any) -> str:
    eos = tokenizer.eos_token
    return re.sub(re.escape(eos) + r"\s*$", "", text) if eos else text


def perplexity(logprobs: Sequence[float], mask: Sequence[int]) -> float:
    """Perplexity of the model-written tokens (environment tokens excluded)."""
    own = [lp for lp, m in zip(logprobs, mask, strict=True) if m]
    return math.exp(-sum(own) / len(own)) if own else float("nan")
