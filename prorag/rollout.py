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
  in a single forward pass. Rows feed the same number of positions per forward, so a row
  that waits, or a shorter insertion, leaves padding "holes" in the cache that the attention
  mask hides and that position ids skip. Synchronising on turns bounds the holes to one
  action and one insertion per turn, where inserting as soon as any row stops would pad every
  row by a whole retrieval block at every stop.
* **The decode step is per-row-loop free.** Sampling, log-probabilities, stop detection and
  caps are tensor operations with static shapes ``(B, 1)``; the only host sync per step is
  "is any row still decoding". Python work per row happens only at turn boundaries
  (retrieval, tokenising the environment's text), which keeps the step ready for CUDA graphs.
* **Caps end runaway generations**: tokens per action, actions per trajectory (11 in RL, 13 at
  inference) and completion tokens per trajectory. A capped trajectory is kept, its
  ``stop_reason`` says why, and it is malformed (no final answer), which rewards penalise.

Log-probabilities are those of the sampled tokens under the temperature-scaled distribution
before top-p filtering (what TRL recomputes for its importance ratio); 0 on environment tokens.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from prorag.data.records import Record
from prorag.prompts import PromptStyle, build_prompt
from prorag.retrieval.base import Hit, Retriever
from prorag.schema import (
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

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    """Settings of the rollout engine (defaults: inference, METHOD.md section 1)."""

    max_actions: int = 13
    """Actions per trajectory: 13 at inference, 11 during RL."""
    max_action_tokens: int = 128
    """Tokens the model may write in one action before it is cut."""
    max_completion_tokens: int = 2048
    """Completion tokens (model and environment) per trajectory."""
    top_k: int = 3
    """Documents retrieved per sub-query."""
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    """Greedy decoding (temperature and top_p are then ignored)."""
    batch_size: int = 32
    seed: int = 0
    prompt_style: PromptStyle | None = None
    """``plain`` or ``chat``; by default chat when the tokenizer has a chat template."""


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


# ----------------------------------------------------------------------------- sampling


def sample_next(
    logits: torch.Tensor, *, temperature: float, top_p: float, greedy: bool, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return ``(tokens, logprobs)``, both ``(B,)``.

    The log-probability is taken under ``softmax(logits / temperature)`` before top-p
    filtering (greedy: ``softmax(logits)``), the distribution a trainer recomputes.
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
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


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

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_ids(self, question: str) -> list[int]:
        text = build_prompt(self.tokenizer, question, self.config.prompt_style)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def rollout(
        self,
        records: Sequence[Record],
        *,
        seed: int | None = None,
        prompts: Sequence[str] | None = None,
        progress: bool = False,
        on_batch: Callable[[list[Trajectory]], None] | None = None,
    ) -> list[Trajectory]:
        """Roll out every record, in batches of ``config.batch_size``; results keep input order.

        ``prompts`` overrides the ProRAG prompt of each record (the baselines use it, with
        ``max_actions=1``, to generate a single answer through the same engine). ``on_batch``
        receives each finished batch (to append results to a file as they come).
        """
        if prompts is not None and len(prompts) != len(records):
            raise ValueError(f"{len(prompts)} prompts for {len(records)} records")
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
                texts = prompts[start : start + cfg.batch_size] if prompts is not None else None
                trajs = self._rollout_batch(batch, generator, texts)
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
        self, records: list[Record], generator: torch.Generator, prompt_texts: Sequence[str] | None = None
    ) -> list[Trajectory]:
        cfg = self.config
        B, dev = len(records), self.device
        if prompt_texts is None:
            prompts = [self.prompt_ids(r.question) for r in records]
        else:
            prompts = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompt_texts]
        completion: list[list[int]] = [[] for _ in range(B)]
        mask: list[list[int]] = [[] for _ in range(B)]
        logprobs: list[list[float]] = [[] for _ in range(B)]
        retrievals: list[list[dict[str, Any]]] = [[] for _ in range(B)]
        n_actions = [0] * B
        stop_reason: list[str | None] = [None] * B

        state = _BatchState(self.model, B, self.pad_id, dev)
        logits = state.feed([list(p) for p in prompts])
        tok, lp = self._sample(logits, generator)
        decoding = torch.ones(B, dtype=torch.bool, device=dev)
        stop_ids = self.stop_ids.to(dev)

        while decoding.any():
            # ---- decode until every active row has closed its action (or hit a cap)
            step_tok, step_lp, step_on = [], [], []
            n_tok = torch.zeros(B, dtype=torch.long, device=dev)
            while True:
                step_tok.append(tok)
                step_lp.append(lp)
                step_on.append(decoding.clone())
                n_tok += decoding.long()
                stopped = decoding & (torch.isin(tok, stop_ids) | (n_tok >= cfg.max_action_tokens))
                decoding = decoding & ~stopped
                if not bool(decoding.any()):
                    break
                logits = state.feed_step(tok, decoding)
                tok, lp = self._sample(logits, generator)

            # ---- turn boundary: move this turn's tokens to the rows, decide what comes next
            toks, lps, ons = (torch.stack(x, 1).cpu() for x in (step_tok, step_lp, step_on))
            searches: list[int] = []
            for r in range(B):
                row_on = ons[r]
                if not bool(row_on.any()):
                    continue
                ids = toks[r][row_on].tolist()
                completion[r].extend(ids)
                mask[r].extend([1] * len(ids))
                logprobs[r].extend(lps[r][row_on].tolist())
                n_actions[r] += 1
                last = ids[-1]
                # </answer> first: policies list it among their EOS ids too.
                if last == self.tag_ids[ANSWER_CLOSE]:
                    stop_reason[r] = "answer"
                elif last in self.eos_ids:
                    stop_reason[r] = "eos"
                elif last not in (self.tag_ids[SUBQUERY_CLOSE], self.tag_ids[SUBANSWER_CLOSE]):
                    stop_reason[r] = "max_action_tokens"
                elif n_actions[r] >= cfg.max_actions:
                    stop_reason[r] = "max_actions"
                elif last == self.tag_ids[SUBQUERY_CLOSE]:
                    searches.append(r)
            hits = self._search(records, completion, searches)
            chunks: list[list[int] | None] = [None] * B
            for r in range(B):
                if stop_reason[r] is not None:
                    continue
                if completion[r][-1] == self.tag_ids[SUBQUERY_CLOSE]:
                    found = hits[r]
                    env_text = render_env_turn(found)
                    retrievals[r].append(
                        {"query": self._last_query(completion[r]), "doc_ids": [h.id for h in found], "action": n_actions[r] - 1}
                    )
                elif completion[r][-1] == self.tag_ids[SUBANSWER_CLOSE]:
                    env_text = render_env_turn()
                else:
                    continue
                env_ids = self.tokenizer(env_text, add_special_tokens=False)["input_ids"]
                if len(completion[r]) + len(env_ids) + 1 > cfg.max_completion_tokens:
                    stop_reason[r] = "max_completion_tokens"
                    continue
                completion[r].extend(env_ids)
                mask[r].extend([0] * len(env_ids))
                logprobs[r].extend([0.0] * len(env_ids))
                # The stop tag the model sampled has not been fed yet: it leads the chunk.
                chunks[r] = [completion[r][-len(env_ids) - 1]] + env_ids
            if not any(c is not None for c in chunks):
                break
            logits = state.feed(chunks)
            tok, lp = self._sample(logits, generator)
            decoding = torch.tensor([c is not None for c in chunks], dtype=torch.bool, device=dev)

        return [
            self._finish(rec, prompts[r], completion[r], mask[r], logprobs[r], retrievals[r], stop_reason[r] or "max_actions")
            for r, rec in enumerate(records)
        ]

    def _sample(self, logits: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        return sample_next(logits, temperature=cfg.temperature, top_p=cfg.top_p, greedy=cfg.greedy, generator=generator)

    def _last_query(self, ids: list[int]) -> str:
        """Text between the last ``<subquery>`` and the final ``</subquery>`` (empty if the opener is missing)."""
        open_id = self.tag_ids[SUBQUERY_OPEN]
        try:
            start = len(ids) - 1 - ids[::-1].index(open_id)
        except ValueError:
            return ""
        return self.tokenizer.decode(ids[start + 1 : -1], skip_special_tokens=True).strip()

    def _search(self, records: list[Record], completion: list[list[int]], rows: list[int]) -> dict[int, list[Hit]]:
        """One batched retrieval for every row that searched this turn; an empty query finds nothing."""
        asked = [(r, self._last_query(completion[r])) for r in rows]
        nonempty = [(r, q) for r, q in asked if q]
        found: dict[int, list[Hit]] = {r: [] for r in rows}
        if nonempty:
            results = self.retriever.search(
                [q for _, q in nonempty], k=self.config.top_k, partitions=[records[r].partition for r, _ in nonempty]
            )
            for (r, _), hits in zip(nonempty, results, strict=True):
                found[r] = hits
        return found

    def _finish(
        self,
        record: Record,
        prompt: list[int],
        completion: list[int],
        mask: list[int],
        logprobs: list[float],
        retrievals: list[dict[str, Any]],
        stop_reason: str,
    ) -> Trajectory:
        text = self.tokenizer.decode(completion, skip_special_tokens=False)
        actions = [
            ActionRecord(a.kind.value if a.kind is not None else None, a.span, a.well_formed)
            for a in parse_token_actions(completion, self.tag_ids, mask, blank_ids=self.blank_ids)
        ]
        parsed = parse_trajectory(_strip_eos(text, self.tokenizer))
        return Trajectory(
            id=record.id, question=record.question, prompt_ids=prompt, completion_ids=completion, env_mask=mask,
            logprobs=logprobs, actions=actions, retrievals=retrievals, stop_reason=stop_reason, text=text,
            answer=extract_answer(text), valid=parsed.valid and stop_reason in ("answer", "eos"),
            metadata={"partition": record.partition} if record.partition else {},
        )


# ----------------------------------------------------------------------------- KV-cache state


class _BatchState:
    """The batch's KV cache, its attention mask (with holes) and each row's next position."""

    def __init__(self, model: Any, batch: int, pad_id: int, device: torch.device) -> None:
        self.model = model
        self.pad_id = pad_id
        self.device = device
        self.cache: Any = None
        self.mask = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)

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
            input_ids=ids, attention_mask=self.mask, position_ids=positions, past_key_values=self.cache, use_cache=True
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
