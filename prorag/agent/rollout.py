"""Batched multi-turn rollouts: the policy writes actions, the environment retrieves.

The engine runs a batch of questions through the ProRAG loop (METHOD.md section 1): the model
writes an action; on ``</subquery>`` the environment searches and appends
``<retrieval>…</retrieval>`` and the next ``<step>`` opener; on ``</subanswer>`` it appends the
opener; ``</answer>`` or end-of-sequence ends the trajectory. Token-in / token-out: the
completion holds exactly the ids the model sampled, interleaved with the environment's ids
(``env_mask`` 0); nothing the model wrote is decoded and re-encoded. Caps (tokens per action,
actions per trajectory: 11 in RL, 13 at inference, completion tokens) end runaway generations; a
capped trajectory is kept, malformed, with its ``stop_reason``. Log-probabilities are those of the
sampled tokens under the temperature-scaled distribution (what TRL recomputes); 0 on env tokens.

The loop is one; what generates is a backend (``rollout.backend``, :mod:`prorag.agent.backends`).
The ``hf`` backend is driven one token step at a time: one KV cache serves the batch across turns
(:mod:`prorag.agent.kv_cache`), the decode step has no per-row Python loop, and a row that closed
its action gets the environment's reply and goes on while others still write theirs
(``resume_early``). Any other backend is driven one action at a time: every live row's context
(prompt, earlier actions and retrieved blocks, as ids) is continued to a stop id or the action cap
(:class:`~prorag.agent.backends.base.Continuation`), then the environment's turn runs, with the
same code, for every row. Turns are batch-synchronous (one retrieval call and one tokenizer call per turn).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from prorag.agent.backends import ROLLOUT_BACKENDS
from prorag.agent.backends.base import Continuation, GenerationBackend, Sampling
from prorag.agent.backends.hf import HFBackend
from prorag.agent.decode_graphs import DecodeGraphs
from prorag.agent.kv_cache import BatchState, SlotState
from prorag.agent.prompts import prompt_token_ids
from prorag.agent.rollout_config import DecodeGraphsMode, RolloutConfig  # noqa: F401  (re-exported: moved there)
from prorag.agent.sampling import RowStreams, stream_seed
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
from prorag.agent.trajectory import ActionRecord, Trajectory, decode_completion, perplexity  # noqa: F401  (re-exported: moved there)
from prorag.data.records import Record
from prorag.retrieval.base import Hit, Retriever

log = logging.getLogger(__name__)


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


# ----------------------------------------------------------------------------- the engine


class RolloutEngine:
    """Runs a policy with a retriever over batches of questions (see the module docstring).

    ``backend``: what generates (default: the one ``config.backend`` names, built on ``model``;
    the RL stage passes the vLLM engine TRL owns). ``model`` is the policy as the caller holds it:
    a Hugging Face model (its generation config gives the end-of-sequence ids), or, for a backend
    that loads its own weights, its folder."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        retriever: Retriever,
        config: RolloutConfig | None = None,
        *,
        backend: GenerationBackend | HFBackend | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.retriever = retriever
        self.config = config or RolloutConfig()
        self.backend = backend if backend is not None else ROLLOUT_BACKENDS.get(self.config.backend).build(model, self.config)
        self._model = model
        vocab = tokenizer.get_vocab()
        missing = [t for t in TAGS if t not in vocab]
        if missing:
            raise ValueError(
                f"the tokenizer lacks the trajectory tags {missing}; register them (prorag.models.tags.add_tag_tokens)"
            )
        self.tag_ids = {t: vocab[t] for t in TAGS}
        generation_config = getattr(model, "generation_config", None) or getattr(self.backend, "generation_config", None)
        eos = _eos_ids(generation_config, tokenizer)
        self.stop_ids = torch.tensor(sorted(eos | {self.tag_ids[t] for t in (SUBQUERY_CLOSE, SUBANSWER_CLOSE, ANSWER_CLOSE)}))
        self.eos_ids = eos
        self._stop_tuple = tuple(int(i) for i in self.stop_ids.tolist())
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
        self.pad_id = int(pad)
        if isinstance(self.backend, HFBackend):
            self.backend.pad_id = self.pad_id
        self.blank_ids = _blank_token_ids(tokenizer)

    @property
    def model(self) -> Any:
        """The policy the engine was made with (the ``hf`` backend's model)."""
        return self.backend.model if isinstance(self.backend, HFBackend) else self._model

    @property
    def steps_tokens(self) -> bool:
        """Whether the backend is driven one token step at a time (``hf``), else one action at a time."""
        return isinstance(self.backend, HFBackend)

    def _hf(self) -> HFBackend:
        if not isinstance(self.backend, HFBackend):
            raise AttributeError(f"the {type(self.backend).__name__} backend has no KV cache or decode graphs of the engine's")
        return self.backend

    @property
    def static_cache(self) -> bool:
        """Whether batches run on the engine's :class:`~prorag.agent.kv_cache.SlotCache` (set False to use the model's own cache)."""
        return self._hf().static_cache

    @static_cache.setter
    def static_cache(self, value: bool) -> None:
        self._hf().static_cache = value

    @property
    def graphs(self) -> DecodeGraphs | None:
        """The decode graphs of this engine's model, kept across batches and calls (see :meth:`decode_graphs_for`)."""
        return self._hf().graphs

    @graphs.setter
    def graphs(self, value: DecodeGraphs | None) -> None:
        self._hf().graphs = value

    @property
    def device(self) -> torch.device:
        return self._hf().device

    @property
    def sampling(self) -> Sampling:
        """The backend's sampling settings: the config's, with the ids that end an action."""
        cfg = self.config
        return Sampling(cfg.temperature, cfg.top_p, cfg.decodes_greedily, self._stop_tuple)

    def prompt_ids(self, question: str) -> list[int]:
        return prompt_token_ids(self.tokenizer, question, self.config.prompt_style)

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
        ``row_seeds`` gives each row its own stream instead (:class:`~prorag.agent.sampling.RowStreams`): a row's
        trajectory then depends only on its prompt, the model and its seed (up to the float noise
        of batched forward passes), whatever batch it is in; ``seed`` is then unused. The RL
        stage uses it so that a distributed run samples what a single process would. On a backend
        driven one action at a time (``vllm``), each continuation carries a seed
        (:func:`action_seed`): the row's own with ``row_seeds``, else the batch's plus the row's index.
        """
        if prompts is not None and len(prompts) != len(records):
            raise ValueError(f"{len(prompts)} prompts for {len(records)} records")
        if prompts is not None and prompt_ids is not None:
            raise ValueError("pass prompts or prompt_ids, not both")
        for name, per_row in (("prompt_ids", prompt_ids), ("max_actions", max_actions), ("row_seeds", row_seeds)):
            if per_row is not None and len(per_row) != len(records):
                raise ValueError(f"{len(per_row)} {name} for {len(records)} records")
        cfg = self.config
        generator = None
        if self.steps_tokens:
            # The generator lives on the model's device, so sampling never moves logits to the host.
            generator = torch.Generator(device=self.device).manual_seed(cfg.seed if seed is None else seed)
        out: list[Trajectory] = []
        bar = tqdm(total=len(records), desc="rollout", unit="q", disable=not progress)
        generating = self._hf().generating() if self.steps_tokens else contextlib.nullcontext()
        try:
            with generating:
                for start in range(0, len(records), cfg.batch_size):
                    batch = list(records[start : start + cfg.batch_size])
                    if prompt_ids is not None:
                        ids = [list(p) for p in prompt_ids[start : start + cfg.batch_size]]
                    elif prompts is None:
                        ids = [self.prompt_ids(r.question) for r in batch]
                    else:
                        ids = self.tokenizer(list(prompts[start : start + cfg.batch_size]), add_special_tokens=False)["input_ids"]
                    caps = list(max_actions[start : start + cfg.batch_size]) if max_actions is not None else None
                    if generator is None:
                        seeds = _action_seeds(
                            cfg,
                            len(batch),
                            start,
                            cfg.seed if seed is None else seed,
                            None if row_seeds is None else row_seeds[start : start + cfg.batch_size],
                        )
                        trajs = self._rollout_batch_by_action(batch, ids, caps, close_turn, seeds)
                    else:
                        streams = None
                        if row_seeds is not None and not cfg.decodes_greedily:
                            # A block holds at least one action's draws, so a turn never runs a row dry.
                            streams = RowStreams(
                                row_seeds[start : start + cfg.batch_size], self.device, 2 * cfg.max_action_tokens
                            )
                        trajs = self._rollout_batch(batch, ids, generator, caps, close_turn, streams)
                    out.extend(trajs)
                    if on_batch is not None:
                        on_batch(trajs)
                    bar.update(len(batch))
        finally:
            bar.close()
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
        state: SlotState | BatchState = self._hf().open_state(len(held), self.pad_id, expected, cfg)
        held_ids = torch.arange(len(held), device=dev)  # ``held`` on the device (the streams' indices)
        logits = state.feed([list(p) for p in prompts])
        decoding = torch.ones(len(held), dtype=torch.bool, device=dev)
        if streams is not None:
            streams.reserve(held, cfg.max_action_tokens)
        tok, lp = self._sample(logits, generator, streams, held_ids, decoding)
        # An action closed by one of these, with actions left, goes on after the environment's reply.
        going_on = torch.tensor(
            [t for t in (subquery_close, subanswer_close) if t not in self.eos_ids and t != self.tag_ids[ANSWER_CLOSE]],
            dtype=torch.long,
            device=dev,
        )

        def last_actions(held: list[int]) -> torch.Tensor:
            """Whether each held row's next action is its last."""
            return torch.tensor([rows[i].n_actions + 1 >= rows[i].max_actions for i in held], device=dev)

        turn_ids: dict[int, list[int]] = {i: [] for i in held}  # each row's action so far
        turn_lps: dict[int, list[float]] = {i: [] for i in held}
        step_tok, step_lp, step_on = [], [], []
        n_tok = torch.zeros(len(held), dtype=torch.long, device=dev)
        last_action = last_actions(held)
        ended = torch.zeros(len(held), dtype=torch.bool, device=dev)
        waiting = torch.zeros(len(held), dtype=torch.bool, device=dev)  # closed an action, awaits the environment
        while True:
            step_tok.append(tok)
            step_lp.append(lp)
            step_on.append(decoding)
            n_tok += decoding.long()
            stopped = decoding & (torch.isin(tok, stop_ids) | (n_tok >= cfg.max_action_tokens))
            decoding = decoding & ~stopped
            waiting |= stopped
            ended |= stopped & (last_action | ~torch.isin(tok, going_on))
            # One host sync per step: rows still decoding, rows waiting, and rows whose trajectory has ended.
            still, n_waiting, n_ended = torch.stack((decoding.sum(), waiting.sum(), ended.sum())).tolist()
            if still:
                if not cfg.resume_early and state.can_drop and should_drop(n_ended, len(held)):
                    # Rows whose trajectory this action ended leave now, not when the turn's longest action ends.
                    move_turn_tokens(held, step_tok, step_lp, step_on, turn_ids, turn_lps)
                    step_tok, step_lp, step_on = [], [], []
                    keep = (~ended).nonzero().squeeze(-1)
                    state.select(keep.tolist())
                    held = [held[j] for j in keep.tolist()]
                    held_ids = held_ids[keep]
                    tok, decoding, n_tok, last_action = tok[keep], decoding[keep], n_tok[keep], last_action[keep]
                    ended, waiting = ended[keep], waiting[keep]
                logits = state.feed_step(tok, decoding)
                tok, lp = self._sample(logits, generator, streams, held_ids, decoding)
                if not (cfg.resume_early and should_drop(n_waiting, len(held))):
                    continue
            # ---- the environment's turn: for every row once none decodes; with resume_early, as
            # soon as a quarter of the rows wait, for those rows, which then go on decoding beside
            # the rows still inside their action (every row's next token is pending here) instead
            # of waiting for the turn's longest action.
            move_turn_tokens(held, step_tok, step_lp, step_on, turn_ids, turn_lps)
            step_tok, step_lp, step_on = [], [], []
            if still:
                replied = [held[j] for j in waiting.nonzero().squeeze(-1).tolist()]
            else:  # rows dropped mid-turn included: their last action joins them here
                replied = [i for i, ids in turn_ids.items() if ids]
            chunks = self._environment_turn(records, rows, replied, turn_ids, turn_lps, close_turn)
            if not still and not chunks:
                break
            # Rows whose trajectory has ended leave the batch, when the cache can drop them.
            keep = [j for j, i in enumerate(held) if rows[i].stop_reason is None]
            if len(keep) < len(held) and state.can_drop:
                state.select(keep)
                index = torch.tensor(keep, dtype=torch.long, device=dev)
                held = [held[j] for j in keep]
                held_ids = held_ids[index]
                tok, lp, decoding, n_tok, last_action = (x[index] for x in (tok, lp, decoding, n_tok, last_action))
            if chunks:
                logits = state.feed([chunks.get(i) for i in held])
                resumed = torch.tensor([i in chunks for i in held], dtype=torch.bool, device=dev)
                if streams is not None:
                    streams.reserve(list(chunks), cfg.max_action_tokens)
                first, first_lp = self._sample(logits, generator, streams, held_ids, resumed)
                tok, lp = torch.where(resumed, first, tok), torch.where(resumed, first_lp, lp)
                decoding = decoding | resumed
                n_tok = n_tok.masked_fill(resumed, 0)
                last_action = torch.where(resumed, last_actions(held), last_action)
            # Every waiting row has had its reply (or ended, and stays idle where rows cannot leave).
            waiting = torch.zeros(len(held), dtype=torch.bool, device=dev)
            ended = torch.zeros(len(held), dtype=torch.bool, device=dev)

        return [self._finish(rec, row) for rec, row in zip(records, rows, strict=True)]

    def _environment_turn(
        self,
        records: list[Record],
        rows: list[_Row],
        replied: list[int],
        turn_ids: dict[int, list[int]],
        turn_lps: dict[int, list[float]],
        close_turn: bool,
    ) -> dict[int, list[int]]:
        """The environment's turn for the rows ``replied`` (indices into ``records``), each of
        which has just closed an action (``turn_ids``, emptied here): the action joins the row,
        its stop reason is decided, searches run in one batched retrieval, and each row that goes
        on gets its reply. Returns the chunk to feed per row that goes on: the stop tag the model
        sampled (not fed yet) followed by the reply."""
        cfg = self.config
        subquery_close, subanswer_close = self.tag_ids[SUBQUERY_CLOSE], self.tag_ids[SUBANSWER_CLOSE]
        searches: list[int] = []
        capped: list[int] = []  # rows the action cap ended that still get the environment's reply
        for i in replied:
            ids = turn_ids[i]
            row = rows[i]
            row.completion.extend(ids)
            row.mask.extend([1] * len(ids))
            row.logprobs.extend(turn_lps[i])
            turn_ids[i], turn_lps[i] = [], []
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
        going = [i for i in replied if rows[i].stop_reason is None]
        answered = going + capped
        env_texts = []
        for i in answered:
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
            answered, self.tokenizer(env_texts, add_special_tokens=False)["input_ids"] if answered else [], strict=True
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
        return chunks

    def decode_graphs_for(self, rows: int) -> DecodeGraphs | None:
        """The decode graphs a batch of ``rows`` rows runs its decode steps on (the ``hf`` backend's;
        see :meth:`~prorag.agent.backends.hf.HFBackend.decode_graphs_for`)."""
        return self._hf().decode_graphs_for(rows, self.config)

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
        return HFBackend.sample(logits, self.sampling, generator, streams, held, live)

    # ------------------------------------------------------------------ one batch, one action at a time

    def _rollout_batch_by_action(
        self,
        records: list[Record],
        prompts: list[list[int]],
        max_actions: list[int] | None,
        close_turn: bool,
        seed_of: Callable[[int, int], int | None],
    ) -> list[Trajectory]:
        """Roll out one batch on a backend that continues whole actions: each turn, every live
        row's context (prompt and completion so far, as ids) is continued to a stop id or the
        action cap (``seed_of(row, action)`` seeds it), then the environment's turn runs for every
        row at once; rows it does not answer (their trajectory ended) leave."""
        cfg = self.config
        caps = max_actions or [cfg.max_actions] * len(prompts)
        rows = [_Row(prompt=list(p), max_actions=cap) for p, cap in zip(prompts, caps, strict=True)]
        sampling = self.sampling
        live = list(range(len(rows)))
        while live:
            requests = [
                Continuation(tuple(rows[i].prompt + rows[i].completion), cfg.max_action_tokens, seed_of(i, rows[i].n_actions))
                for i in live
            ]
            results = self.backend.continue_batch(requests, sampling)
            if len(results) != len(requests) or any(not r.ids for r in results):
                raise RuntimeError(
                    f"the {cfg.backend} backend returned {len(results)} continuations for {len(requests)} requests"
                )
            turn_ids = {i: list(r.ids) for i, r in zip(live, results, strict=True)}
            turn_lps = {i: list(r.logprobs) for i, r in zip(live, results, strict=True)}
            chunks = self._environment_turn(records, rows, live, turn_ids, turn_lps, close_turn)
            live = [i for i in live if i in chunks]
        return [self._finish(rec, row) for rec, row in zip(records, rows, strict=True)]

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
        text = decode_completion(self.tokenizer, completion)
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


def should_drop(rows: int, held: int) -> bool:
    """Whether to act on ``rows`` of the ``held`` rows before the rest of the batch closes its
    action: when they are at least a quarter of the batch. With ``resume_early`` the rows are those
    waiting (they get the environment's reply and go on); under the turn barrier, those whose
    trajectory has ended (they leave). Until then every held row is fed at every step; with 160
    rows and a 32-token cap, a sampled batch fed about eight positions per token it kept
    (benchmarks/mcts.py). Both copy the cache's rows or feed a chunk, so they wait until enough
    rows are idle to pay for it."""
    return rows > 0 and 4 * rows >= held


def move_turn_tokens(
    held: Sequence[int],
    step_tok: list[torch.Tensor],
    step_lp: list[torch.Tensor],
    step_on: list[torch.Tensor],
    turn_ids: dict[int, list[int]],
    turn_lps: dict[int, list[float]],
) -> None:
    """Append the decoded steps (``(B,)`` tensors, one per step, rows as in ``held``) to each
    row's tokens and log-probabilities of this turn, keeping only the steps it decoded."""
    if not step_tok:
        return
    toks, lps, ons = (torch.stack(x, 1).cpu().tolist() for x in (step_tok, step_lp, step_on))
    for j, i in enumerate(held):
        turn_ids[i].extend(t for t, on in zip(toks[j], ons[j], strict=True) if on)
        turn_lps[i].extend(x for x, on in zip(lps[j], ons[j], strict=True) if on)


def action_seed(stream: int, action: int) -> int:
    """The seed of a row's ``action``-th continuation on an action-grain backend, from its stream
    (a row seed, or a batch's): a 61-bit hash, so a batch's rows can add their index to it
    (consecutive seeds, which vLLM's ``n`` reproduces) without leaving 63 bits."""
    return stream_seed("prorag-action", int(stream), int(action)) >> 2


def _action_seeds(
    config: RolloutConfig, rows: int, start: int, seed: int, row_seeds: Sequence[int] | None
) -> Callable[[int, int], int | None]:
    """``seed_of(row, action)`` for one batch of an action-grain backend: ``None`` when decoding
    greedily; from each row's own seed with ``row_seeds`` (a row's trajectory then depends on its
    seed only); else the batch's stream (``seed`` and the batch's first record ``start``) plus the
    row's index, so rows with one context draw as vLLM's ``n`` would."""
    if config.decodes_greedily:
        return lambda row, action: None
    if row_seeds is not None:
        own = [int(s) for s in row_seeds]
        return lambda row, action: action_seed(own[row], action)
    stream = stream_seed("prorag-batch", int(seed), int(start))
    return lambda row, action: action_seed(stream, action) + row


def _eos_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
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
