"""The rollout contract: token-in/token-out, exact environment masks and spans, caps, seeds,
and KV caches (the engine's static slot cache, and a model's own cache with padding holes)
that give the same log-probabilities as a clean forward."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.kv_cache import SlotCache, supports_slot_cache
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.schema import TAGS, i_traj
from prorag.agent.trajectory import Trajectory
from prorag.data.records import Record, read_records
from prorag.retrieval.bm25 import BM25Retriever
from tests.fakes import CycleLM, ReplayLM


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "test.jsonl")[:12]


def _gold_targets(
    world_tokenizer: Any, engine: RolloutEngine, golds: list[Any]
) -> dict[tuple[int, ...], tuple[list[int], list[int]]]:
    out = {}
    for g in golds:
        ids, mask = tokenize_segments(world_tokenizer, g.segments)
        out[tuple(engine.prompt_ids(g.question))] = (ids, mask)
    return out


def test_replayed_gold_trajectories_come_out_token_exact(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    golds = render_gold(records, tiny_retriever, k=3)
    assert len(golds) == len(records)
    cfg = RolloutConfig(greedy=True, batch_size=5, max_action_tokens=64)
    engine = RolloutEngine(ReplayLM({}, len(world_tokenizer), world_tokenizer.eos_token_id), world_tokenizer, tiny_retriever, cfg)
    targets = _gold_targets(world_tokenizer, engine, golds)
    model = ReplayLM({p: ids for p, (ids, _) in targets.items()}, len(world_tokenizer), world_tokenizer.eos_token_id)
    # As saved policies do, list </answer> among the EOS ids: the stop reason must still be "answer".
    model.generation_config.eos_token_id = [world_tokenizer.eos_token_id, world_tokenizer.get_vocab()["</answer>"]]
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
    trajs = engine.rollout(records)
    assert model.off_script == 0
    for traj, gold in zip(trajs, golds, strict=True):
        ids, mask = targets[tuple(traj.prompt_ids)]
        assert traj.completion_ids == ids
        assert traj.env_mask == mask, "env mask must be 0 exactly on environment-inserted tokens"
        assert traj.stop_reason == "answer" and traj.valid and i_traj(traj.text)
        assert traj.text == gold.text
        assert traj.answer == gold.answer
        assert [r["doc_ids"] for r in traj.retrievals] == [r["doc_ids"] for r in gold.retrievals]
        assert [r["query"] for r in traj.retrievals] == [r["query"] for r in gold.retrievals]
        # Spans: one per action, covering exactly the model-written tokens.
        assert len(traj.actions) == 2 * len(gold.retrievals) + 1
        assert all(a.well_formed for a in traj.actions)
        covered = sorted(i for a in traj.actions for i in range(*a.span))
        assert covered == [i for i, m in enumerate(traj.env_mask) if m]
        assert [a.kind for a in traj.actions] == ["search", "conclude"] * len(gold.retrievals) + ["answer"]
        assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.env_mask, strict=True) if not m)


def _ids(world_tokenizer: Any, *words: str) -> list[int]:
    out = []
    for w in words:
        ids = world_tokenizer(w, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, (w, ids)
        out.append(ids[0])
    return out


def test_a_model_that_never_closes_is_cut_and_marked_malformed(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    (word,) = _ids(world_tokenizer, " is")
    model = CycleLM({}, word, len(world_tokenizer), world_tokenizer.eos_token_id)
    cfg = RolloutConfig(greedy=True, max_action_tokens=17)
    trajs = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg).rollout(records[:3])
    for t in trajs:
        assert t.stop_reason == "max_action_tokens"
        assert len(t.completion_ids) == 17 and all(t.env_mask)
        assert not t.valid and t.answer is None
        assert not any(a.well_formed for a in t.actions)  # tagless text is no well-formed action


def test_a_model_that_searches_forever_is_cut_at_max_actions(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    v = world_tokenizer.get_vocab()
    (word,) = _ids(world_tokenizer, " is")
    loop = {v["<step>"]: word, word: v["</step>"], v["</step>"]: v["<subquery>"], v["<subquery>"]: v["</step>"]}
    # After <subquery> the model writes " is" then </subquery>: route via a second word.
    (query_word,) = _ids(world_tokenizer, " city")
    loop[v["<subquery>"]] = query_word
    loop[query_word] = v["</subquery>"]
    model = CycleLM(loop, v["<step>"], len(world_tokenizer), world_tokenizer.eos_token_id)
    cfg = RolloutConfig(greedy=True, max_actions=4, max_action_tokens=32)
    trajs = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg).rollout(records[:4])
    for t in trajs:
        assert t.stop_reason == "max_actions"
        assert len(t.actions) == 4 and all(a.kind == "search" and a.well_formed for a in t.actions)
        assert t.num_searches == 3  # the last action is cut before the environment answers it
        assert all(r["query"] == "city" and len(r["doc_ids"]) == 3 for r in t.retrievals)
        assert not t.valid
    capped = RolloutEngine(
        model, world_tokenizer, tiny_retriever, RolloutConfig(greedy=True, max_actions=50, max_completion_tokens=150)
    ).rollout(records[:2])
    for t in capped:
        assert t.stop_reason == "max_completion_tokens" and len(t.completion_ids) <= 150


def _tiny_config(world_tokenizer: Any) -> dict[str, Any]:
    """Shape of the random test models: 2 layers, 4 query heads sharing 2 KV heads (GQA)."""
    return dict(
        vocab_size=len(world_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=world_tokenizer.pad_token_id,
        eos_token_id=world_tokenizer.eos_token_id,
    )


def _tiny_llama(world_tokenizer: Any, seed: int = 0) -> torch.nn.Module:
    """A random tiny Llama whose head leans towards the stop tags, so rollouts have several turns."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**_tiny_config(world_tokenizer), tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        v = world_tokenizer.get_vocab()
        for tag, bias in (("</subquery>", 3.5), ("</subanswer>", 2.5), ("</answer>", 1.0), ("<subquery>", 3.0)):
            head.bias[v[tag]] = bias
    model.lm_head = head
    return model


@pytest.mark.parametrize("static_cache", [True, False], ids=["slot-cache", "model-cache"])
def test_kv_cache_matches_a_clean_forward_and_seeds_reproduce(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], static_cache: bool
) -> None:
    model = _tiny_llama(world_tokenizer)
    cfg = RolloutConfig(max_action_tokens=40, max_actions=6, batch_size=6, temperature=1.0, seed=3)
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
    assert engine.static_cache, "a full-attention Llama runs on the engine's slot cache"
    engine.static_cache = static_cache
    trajs = engine.rollout(records)
    assert sum(t.num_searches for t in trajs) >= 5, "the biased model should search several times"
    assert any(not all(t.env_mask) for t in trajs)
    assert len({len(t.actions) for t in trajs}) > 1, "rows should finish at different turns (and leave the batch)"
    assert _logprob_drift(model, trajs) < 1e-4
    for t in trajs:
        covered = sorted(i for a in t.actions for i in range(*a.span))
        assert set(covered) <= {i for i, m in enumerate(t.env_mask) if m}
    again = engine.rollout(records)
    assert [t.completion_ids for t in again] == [t.completion_ids for t in trajs]
    other = engine.rollout(records, seed=4)
    assert [t.completion_ids for t in other] != [t.completion_ids for t in trajs]


@pytest.mark.parametrize("static_cache", [True, False], ids=["slot-cache", "model-cache"])
def test_row_seeds_make_a_rows_sample_independent_of_its_batch(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], static_cache: bool
) -> None:
    """With ``row_seeds`` a row writes the same trajectory alone, beside other rows (before or
    after it, in a batch of any size) and in another chunk of the records: what a distributed RL
    run relies on to sample what one process would."""
    model = _tiny_llama(world_tokenizer)
    cfg = RolloutConfig(max_action_tokens=24, max_actions=5, batch_size=8, temperature=1.0, top_p=0.95)
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
    engine.static_cache = static_cache
    seeds = [101 + 7 * i for i in range(6)]
    together = engine.rollout(records[:6], row_seeds=seeds, seed=1)
    assert len({len(t.actions) for t in together}) > 1, "rows finish at different turns"
    assert sum(t.num_searches for t in together) >= 3
    b = 4
    alone = engine.rollout([records[b]], row_seeds=[seeds[b]], seed=2)[0]
    reordered = engine.rollout([records[b], records[0]], row_seeds=[seeds[b], seeds[0]])
    for other in (alone, reordered[0]):
        assert other.completion_ids == together[b].completion_ids and other.env_mask == together[b].env_mask
        assert max(abs(x - y) for x, y in zip(other.logprobs, together[b].logprobs, strict=True)) < 1e-4
    assert reordered[1].completion_ids == together[0].completion_ids
    engine.config = replace(cfg, batch_size=2)  # rows 4 and 5 in a chunk of their own
    assert [t.completion_ids for t in engine.rollout(records[:6], row_seeds=seeds)] == [t.completion_ids for t in together]
    # Another seed, another trajectory; the shared generator's samples are not the per-row ones.
    assert engine.rollout([records[b]], row_seeds=[seeds[b] + 1])[0].completion_ids != together[b].completion_ids
    with pytest.raises(ValueError, match="row_seeds"):
        engine.rollout(records[:2], row_seeds=[1])


@pytest.fixture
def drops(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (rows, held) of every time :func:`~prorag.agent.rollout.should_drop` says yes: rows
    ended leave mid-turn (turn barrier), or rows waiting get the environment's reply (resume early)."""
    import prorag.agent.rollout as rollout_module

    said: list[tuple[int, int]] = []
    decide = rollout_module.should_drop

    def counted(rows: int, held: int) -> bool:
        if decide(rows, held):
            said.append((rows, held))
            return True
        return False

    monkeypatch.setattr(rollout_module, "should_drop", counted)
    return said


@pytest.mark.parametrize("resume_early", [True, False], ids=["resume-early", "turn-barrier"])
@pytest.mark.parametrize("max_actions", [1, 2], ids=["one-action", "two-actions"])
def test_rows_that_end_mid_turn_leave_the_slot_cache_and_nothing_else_changes(
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
    max_actions: int,
    resume_early: bool,
    drops: list[tuple[int, int]],
) -> None:
    """On the slot cache, rows whose trajectory ended leave the batch in the middle of a turn; with
    per-row seeds every trajectory (tokens, masks, log-probabilities, stop reasons) is what the
    model's own cache, which never drops a row, writes."""
    model = _tiny_llama(world_tokenizer)
    cfg = RolloutConfig(max_action_tokens=24, max_actions=max_actions, batch_size=12, temperature=1.0, resume_early=resume_early)
    seeds = [11 + 5 * i for i in range(12)]
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
    slot = engine.rollout(records, row_seeds=seeds)
    assert drops, "some rows should end while others still decode"
    engine.static_cache = False
    reference = engine.rollout(records, row_seeds=seeds)
    for a, b in zip(slot, reference, strict=True):
        assert (a.completion_ids, a.env_mask, a.stop_reason) == (b.completion_ids, b.env_mask, b.stop_reason)
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0) < 1e-4
    assert len({len(t.completion_ids) for t in slot}) > 1


def test_should_drop_waits_for_a_quarter_of_the_batch() -> None:
    from prorag.agent.rollout import should_drop

    assert [should_drop(e, 8) for e in (0, 1, 2, 3)] == [False, False, True, True]
    assert should_drop(1, 1) and not should_drop(0, 1)


def _logprob_drift(model: torch.nn.Module, trajs: list[Trajectory]) -> float:
    """Largest gap between recorded log-probabilities of model-written tokens and a clean forward."""
    worst = 0.0
    for t in trajs:
        with torch.no_grad():
            logp = model(torch.tensor([t.prompt_ids + t.completion_ids])).logits.float().log_softmax(-1)[0]
        p = len(t.prompt_ids)
        for i, (tid, m, lp) in enumerate(zip(t.completion_ids, t.env_mask, t.logprobs, strict=True)):
            if m:
                worst = max(worst, abs(logp[p + i - 1, tid].item() - lp))
    return worst


class _Steered(torch.nn.Module):
    """A real model whose last-position argmax is moved to the gold next token (one logit over
    the row's maximum): gold trajectories come out of the real forward passes and caches.

    A row's gold is found from its prompt at the first forward of a run; the last fed token of a
    row is real and its position id is its index, which gives the next gold token; on the slot
    cache, ``forward_rows`` follows the rows as finished ones leave and says which ones a chunk feeds.
    """

    def __init__(self, model: torch.nn.Module, golds: dict[tuple[int, ...], list[int]], eos_id: int) -> None:
        super().__init__()
        self.model, self.config, self.generation_config = model, model.config, model.generation_config
        self.golds, self.eos_id = golds, eos_id
        self.cache: Any = None
        self.full: list[list[int]] = []
        self.dropped_rows = False

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, past_key_values: Any = None, **kw: Any) -> Any:
        out = self.model(input_ids=input_ids, position_ids=position_ids, past_key_values=past_key_values, **kw)
        last = position_ids[:, -1].tolist()
        if past_key_values is None or past_key_values is not self.cache:
            self.cache = out.past_key_values
            prompts = [tuple(input_ids[r, input_ids.shape[1] - last[r] - 1 :].tolist()) for r in range(len(last))]
            self.full = [list(p) + self.golds.get(p, []) for p in prompts]
        held = getattr(self.cache, "forward_rows", None)
        held = held.tolist() if held is not None else list(range(len(last)))
        self.dropped_rows |= len(held) < len(self.full)
        logits = out.logits[:, -1, :]
        nxt = [self.full[i][pos + 1] if pos + 1 < len(self.full[i]) else self.eos_id for i, pos in zip(held, last, strict=True)]
        out.logits[:, -1, :] = logits.scatter(1, torch.tensor(nxt)[:, None], logits.max(-1, keepdim=True).values + 1.0)
        return out


def _small_model(world_tokenizer: Any, arch: str, attn: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = _tiny_config(world_tokenizer)
    torch.manual_seed(0)
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**common, head_dim=16, attn_implementation=attn)).eval()
    return LlamaForCausalLM(LlamaConfig(**common, attn_implementation=attn)).eval()


@pytest.mark.parametrize(("arch", "attn"), [("llama", "sdpa"), ("llama", "eager"), ("qwen3", "sdpa")])
def test_slot_cache_writes_gold_trajectories_exactly_as_the_model_cache(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], arch: str, attn: str
) -> None:
    """A real model steered along the gold trajectories: both caches must write them token for
    token (insertions, masks, dropped rows), with the log-probabilities of a clean forward."""
    golds = render_gold(records, tiny_retriever, k=3)
    cfg = RolloutConfig(greedy=True, batch_size=5, max_action_tokens=64)
    model = _small_model(world_tokenizer, arch, attn)
    probe = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
    targets = _gold_targets(world_tokenizer, probe, golds)
    steered = _Steered(model, {p: ids for p, (ids, _) in targets.items()}, world_tokenizer.eos_token_id)
    runs = {}
    for static in (True, False):
        engine = RolloutEngine(steered, world_tokenizer, tiny_retriever, cfg)
        assert engine.static_cache and supports_slot_cache(steered)
        engine.static_cache = static
        steered.dropped_rows = False
        runs[static] = engine.rollout(records)
        assert steered.dropped_rows == static, "finished rows leave the slot cache (and stay in the model's)"
        assert isinstance(steered.cache, SlotCache) == static
    for slot, own, gold in zip(runs[True], runs[False], golds, strict=True):
        ids, mask = targets[tuple(slot.prompt_ids)]
        assert slot.completion_ids == own.completion_ids == ids
        assert slot.env_mask == own.env_mask == mask
        assert slot.stop_reason == "answer" and slot.text == gold.text
        assert max(abs(a - b) for a, b in zip(slot.logprobs, own.logprobs, strict=True)) < 1e-4
    # The steered log-probabilities depend on every real logit: compare with a clean forward.
    worst = 0.0
    for t in runs[True]:
        with torch.no_grad():
            logits = model(torch.tensor([t.prompt_ids + t.completion_ids])).logits[0].float()
        p = len(t.prompt_ids)
        for i, (tid, m, lp) in enumerate(zip(t.completion_ids, t.env_mask, t.logprobs, strict=True)):
            if m:
                row = logits[p + i - 1].clone()
                row[tid] = logits[p + i - 1].max() + 1.0
                worst = max(worst, abs(row.log_softmax(-1)[tid].item() - lp))
    assert worst < 1e-4, f"slot-cache log-probabilities drift from a clean forward by {worst}"


def test_models_without_plain_full_attention_keep_their_own_cache(world_tokenizer: Any) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    assert not supports_slot_cache(ReplayLM({}, len(world_tokenizer), world_tokenizer.eos_token_id))
    assert supports_slot_cache(_small_model(world_tokenizer, "llama", "sdpa"))
    windowed = MistralForCausalLM(
        MistralConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            sliding_window=16,
        )
    )
    assert not supports_slot_cache(windowed)


def test_trajectory_serialises_round_trip(world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]) -> None:
    model = _tiny_llama(world_tokenizer)
    (t,) = RolloutEngine(model, world_tokenizer, tiny_retriever, RolloutConfig(max_action_tokens=20)).rollout(records[:1])
    d = t.to_dict()
    import json

    back = Trajectory.from_dict(json.loads(json.dumps(d)))
    assert back == t and d["text"] == world_tokenizer.decode(t.completion_ids)


def test_missing_tags_are_a_clear_error(tiny_retriever: BM25Retriever) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"a": 0, "<eos>": 1}, unk_token="a"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")
    with pytest.raises(ValueError, match="tags"):
        RolloutEngine(ReplayLM({}, 2, 1), tok, tiny_retriever)
    assert TAGS


@pytest.mark.parametrize("static_cache", [True, False], ids=["slot-cache", "model-cache"])
def test_rows_resumed_early_write_what_they_write_at_the_turns_end(
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
    static_cache: bool,
    monkeypatch: Any,
    drops: list[tuple[int, int]],
) -> None:
    """With per-row seeds, a row that gets the environment's reply as soon as a quarter of the batch
    waits (``resume_early``) writes the same trajectory (tokens, masks, log-probabilities, stop
    reasons, retrievals) as when every row waits for the turn's longest action, and the batch
    takes fewer decode steps."""
    import prorag.agent.rollout as rollout_module

    state_cls = rollout_module.SlotState if static_cache else rollout_module.BatchState
    step, calls = state_cls.feed_step, [0]

    def counting(self: Any, *a: Any, **k: Any) -> Any:
        calls[0] += 1
        return step(self, *a, **k)

    monkeypatch.setattr(state_cls, "feed_step", counting)
    model = _tiny_llama(world_tokenizer)
    seeds = [21 + 3 * i for i in range(len(records))]
    steps: dict[bool, int] = {}
    out = {}
    for early in (True, False):
        cfg = RolloutConfig(max_action_tokens=40, max_actions=6, batch_size=12, temperature=1.0, resume_early=early)
        engine = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
        engine.static_cache = static_cache
        calls[0] = 0
        drops.clear()
        out[early] = engine.rollout(records, row_seeds=seeds)
        steps[early] = calls[0]
        if early:
            assert drops, "some rows should resume while others still decode"
    for a, b in zip(out[True], out[False], strict=True):
        assert (a.completion_ids, a.env_mask, a.stop_reason, a.retrievals) == (
            b.completion_ids,
            b.env_mask,
            b.stop_reason,
            b.retrievals,
        )
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0) < 1e-4
    assert sum(t.num_searches for t in out[True]) >= 5 and len({len(t.actions) for t in out[True]}) > 1
    assert steps[True] < steps[False], steps
