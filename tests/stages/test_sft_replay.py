"""SFT replay in RL: the draws are a pure function of (seed, draw) that visits every example once an
epoch; the replay loss is the SFT stage's format-aware loss; the RL trainer adds ``coef`` times it to
its own loss (and only logs it at ``coef`` 0); a run with replay trains, logs ``replay_nll`` and
resumes into the same draws."""

from __future__ import annotations

import csv
import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.gold import render_gold
from prorag.core.config import apply_overrides
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import Record, read_records
from prorag.method.losses import tag_weight_table, weighted_lm_loss
from prorag.models.tags import tag_token_ids
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.rl import RLConfig, make_rl_trainer, train_rl
from prorag.stages.rl.config import SFTReplayConfig
from prorag.stages.sft import WeightedSFTCollator, build_sft_examples, load_trajectories
from prorag.stages.sft_replay import draw_index, epoch_order, load_replay, replay_indices
from tests.stages.test_rl import GOLD_ROLLOUT, fast_config, replayed, two_groups  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "train.jsonl")[:4]


@pytest.fixture(scope="module")
def replay_file(tmp_path_factory: pytest.TempPathFactory, tiny_world: Path, tiny_retriever: BM25Retriever) -> Path:
    """Gold trajectories of six training questions other than the RL ones (the SFT stage's file form)."""
    path = tmp_path_factory.mktemp("replay") / "trajectories.jsonl"
    gold = render_gold(read_records(tiny_world / "train.jsonl")[4:10], tiny_retriever, k=3)
    write_jsonl(path, (g.to_dict() for g in gold))
    return path


# ----------------------------------------------------------------------------- the draws


def test_epoch_order_is_a_seeded_permutation() -> None:
    order = epoch_order(7, seed=0, epoch=0)
    assert sorted(order) == list(range(7))
    assert order == epoch_order(7, seed=0, epoch=0)
    others = {tuple(epoch_order(7, seed=s, epoch=e)) for s, e in [(0, 1), (1, 0), (1, 1)]}
    assert len(others | {tuple(order)}) == 4, "each (seed, epoch) orders the set its own way"


def test_replay_indices_walk_the_epochs_in_order() -> None:
    # n 5, batches of 2: draws 0, 1 are epoch 0's first four, draw 2 its last and epoch 1's first.
    e0, e1 = epoch_order(5, 3, 0), epoch_order(5, 3, 1)
    stream = e0 + e1
    assert [replay_indices(5, 2, 3, d) for d in range(5)] == [stream[i : i + 2] for i in range(0, 10, 2)]
    assert replay_indices(5, 2, 3, 2) == [e0[4], e1[0]]
    # Every example once per epoch: five draws of 2 cover the set exactly twice.
    seen = list(itertools.chain.from_iterable(replay_indices(5, 2, 3, d) for d in range(5)))
    assert sorted(seen) == sorted(list(range(5)) * 2)
    # A batch larger than the set runs into the next epochs.
    assert replay_indices(2, 5, 0, 0) == (epoch_order(2, 0, 0) + epoch_order(2, 0, 1) + epoch_order(2, 0, 2))[:5]
    with pytest.raises(ValueError, match="at least one"):
        replay_indices(0, 2, 0, 0)
    with pytest.raises(ValueError, match="draw >= 0"):
        replay_indices(3, 2, 0, -1)


def test_draw_index_numbers_every_loss_computation_once() -> None:
    assert [draw_index(s, m, 2, 0, 1) for s in range(3) for m in range(2)] == [0, 1, 2, 3, 4, 5]
    grid = [draw_index(s, m, 3, p, 2) for s in range(4) for m in range(3) for p in range(2)]
    assert sorted(grid) == list(range(24))


def test_config_checks_and_overrides() -> None:
    with pytest.raises(ValueError, match="coef must be >= 0"):
        SFTReplayConfig(file="x.jsonl", coef=-0.1)
    with pytest.raises(ValueError, match="needs `sft_replay.file`"):
        load_replay(SFTReplayConfig(coef=0.5), None, seed=0)
    with pytest.raises(ValueError, match="weight_scheme"):
        SFTReplayConfig(file="x.jsonl", weight_scheme="flat")  # type: ignore[arg-type]
    assert not SFTReplayConfig().enabled and SFTReplayConfig(file="x.jsonl").enabled and SFTReplayConfig(coef=1.0).enabled
    cfg = apply_overrides(RLConfig(), ["sft_replay.file=t.jsonl", "sft_replay.coef=0.5", "sft_replay.batch_size=4"])
    assert (cfg.sft_replay.file, cfg.sft_replay.coef, cfg.sft_replay.batch_size) == ("t.jsonl", 0.5, 4)
    assert RLConfig().sft_replay.coef == 0.0 and not RLConfig().sft_replay.enabled


# ----------------------------------------------------------------------------- the loss


def test_replay_loss_is_the_sft_stages_loss_on_the_drawn_batch(world_tokenizer: Any, replay_file: Path) -> None:
    from trl.trainer.utils import add_fused_lm_head

    config = SFTReplayConfig(file=str(replay_file), coef=1.0, batch_size=3)
    replay = load_replay(config, world_tokenizer, seed=5)
    assert len(replay) == 6
    model = make_tiny_model(world_tokenizer)
    table = tag_weight_table(tag_token_ids(world_tokenizer), "reference")
    examples, _ = build_sft_examples(load_trajectories(replay_file)[0], world_tokenizer, table)
    picked = [examples[i] for i in replay_indices(6, 3, 5, 1)]
    batch = WeightedSFTCollator(world_tokenizer.pad_token_id)(picked)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        expected = weighted_lm_loss(logits, batch["input_ids"], batch["loss_weights"])
        plain = replay.loss(model, 1, fused=False)
        add_fused_lm_head(model)
        fused = replay.loss(model, 1, fused=True)
        other = replay.loss(model, 0, fused=True)
    assert plain.item() == pytest.approx(expected.item(), rel=1e-5)
    assert fused.item() == pytest.approx(expected.item(), rel=1e-4)
    assert other.item() != pytest.approx(expected.item(), rel=1e-4), "another draw holds other trajectories"


@pytest.mark.parametrize(("fused", "chunk"), [(True, None), (False, None), (False, 5)], ids=["fused", "full-logits", "chunked"])
def test_packed_and_chunked_replay_losses_equal_the_padded_one(
    world_tokenizer: Any, replay_file: Path, fused: bool, chunk: int | None
) -> None:
    # The loss and its gradients: the padded batch as before (TRL's fused head, or the full logits),
    # against the LM head in chunks of `chunk` tokens, and against packed rows (of the padded width,
    # and of 4096 tokens: the whole batch in one row).
    from trl.trainer.utils import add_fused_lm_head

    replay = load_replay(SFTReplayConfig(file=str(replay_file), coef=1.0, batch_size=4), world_tokenizer, seed=5)
    lengths = replay.batch(1)["attention_mask"].sum(1)
    assert lengths.min() < lengths.max(), "a padded batch"
    model = make_tiny_model(world_tokenizer)
    if fused:
        add_fused_lm_head(model)
    results = []
    for packed, row_tokens, size in ((False, None, None), (False, None, chunk), (True, None, chunk), (True, 4096, chunk)):
        model.zero_grad(set_to_none=True)
        loss = replay.loss(model, 1, fused=fused, packed=packed, row_tokens=row_tokens, chunk=size)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (want, want_grads), *others = results
    for got, grads in others:
        assert got.item() == pytest.approx(want.item(), rel=1e-5)
        for name, g in grads.items():
            assert torch.allclose(g, want_grads[name], rtol=1e-4, atol=1e-6), name


def test_load_replay_renders_record_files_and_refuses_an_empty_set(
    tmp_path: Path, world_tokenizer: Any, tiny_world: Path, tiny_retriever: BM25Retriever, replay_file: Path
) -> None:
    records = tmp_path / "records.jsonl"
    write_jsonl(records, list(read_jsonl(tiny_world / "train.jsonl"))[4:10])
    from_records = load_replay(SFTReplayConfig(file=str(records)), world_tokenizer, seed=0, retriever=tiny_retriever)
    from_gold = load_replay(SFTReplayConfig(file=str(replay_file)), world_tokenizer, seed=0)
    assert [e["input_ids"] for e in from_records.examples] == [e["input_ids"] for e in from_gold.examples]
    assert len(load_replay(SFTReplayConfig(file=str(replay_file), limit=2), world_tokenizer, seed=0)) == 2
    with pytest.raises(ValueError, match="no trajectory left"):
        load_replay(SFTReplayConfig(file=str(replay_file), max_length=8), world_tokenizer, seed=0)
    with pytest.raises(ValueError, match="retriever"):
        load_replay(SFTReplayConfig(file=str(records)), world_tokenizer, seed=0)


# ----------------------------------------------------------------------------- the trainer


@pytest.mark.parametrize("coef", [0.0, 2.5])
def test_trainer_adds_coef_times_the_replay_loss(
    tmp_path: Path,
    replayed: None,  # noqa: F811 - the fixture
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
    replay_file: Path,
    coef: float,
) -> None:
    cfg = fast_config(rollout=GOLD_ROLLOUT, process_reward="none", sft_replay=SFTReplayConfig(file=str(replay_file), coef=coef))
    model = make_tiny_model(world_tokenizer)
    trainer = make_rl_trainer(cfg, tmp_path, model, world_tokenizer, records[:2], tiny_retriever)
    assert trainer.replay is not None and len(trainer.replay) == 6
    model.train()
    batch = trainer._generate_and_score_completions(two_groups(trainer))
    batch["old_per_token_logps"] = torch.zeros_like(batch["advantages"])
    trainer.current_gradient_accumulation_steps = 2
    replay, trainer.replay = trainer.replay, None
    without = trainer.compute_loss(trainer.model, dict(batch))
    trainer.replay = replay
    trainer._metrics["train"].clear()
    first = trainer.compute_loss(trainer.model, dict(batch))  # draw 0 of step 0
    second = trainer.compute_loss(trainer.model, dict(batch))  # draw 1: the step's second micro-batch
    with torch.no_grad():
        nll0, nll1 = replay.loss(trainer.model, 0, fused=True), replay.loss(trainer.model, 1, fused=True)
    assert first.item() == pytest.approx(without.item() + coef * nll0.item() / 2, rel=1e-4, abs=1e-6)
    assert second.item() == pytest.approx(without.item() + coef * nll1.item() / 2, rel=1e-4, abs=1e-6)
    assert trainer._metrics["train"]["replay_nll"] == pytest.approx([nll0.item(), nll1.item()], rel=1e-4)
    trainer.state.global_step = 1  # a new optimiser step numbers its draws from 2 * 1
    trainer.compute_loss(trainer.model, dict(batch))
    assert trainer.replay_draws == (1, 1)
    with torch.no_grad():
        nll2 = replay.loss(trainer.model, 2, fused=True)
    assert trainer._metrics["train"]["replay_nll"][-1] == pytest.approx(nll2.item(), rel=1e-4)
    assert nll2.item() != pytest.approx(nll0.item(), rel=1e-4), "draw 2 holds other trajectories than draw 0"
    # The gradient of the replay term reaches the weights only with coef > 0.
    model.zero_grad()
    trainer.replay_draws = (-1, 0)
    (trainer.compute_loss(trainer.model, dict(batch)) - without.detach()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert bool(grads and any(g.abs().sum() > 0 for g in grads)) == (coef > 0)


def test_rl_with_replay_trains_logs_replay_nll_and_resumes_into_the_same_draws(
    tmp_path: Path,
    replayed: None,  # noqa: F811 - the fixture
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
    replay_file: Path,
) -> None:
    replay = SFTReplayConfig(file=str(replay_file), coef=1.0, batch_size=2)
    kw = dict(tokenizer=world_tokenizer, records=records, retriever=tiny_retriever)
    whole = tmp_path / "whole"
    model = make_tiny_model(world_tokenizer, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_rl(fast_config(process_reward="none", max_steps=2, rollout=GOLD_ROLLOUT, sft_replay=replay), whole, model=model, **kw)
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
    rows = [r for r in read_jsonl(whole / "metrics.jsonl") if "replay_nll" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["replay_nll"] > 0 and r["loss"] == r["loss"] for r in rows)
    curve = list(csv.DictReader((whole / "learning_curve.csv").open()))
    assert all(float(c["replay_nll"]) > 0 for c in curve)
    # Stopped after step 1 and resumed: step 2 draws what the whole run drew, so the weights agree.
    parts = tmp_path / "parts"
    cfg1 = fast_config(process_reward="none", max_steps=1, rollout=GOLD_ROLLOUT, sft_replay=replay)
    train_rl(cfg1, parts, model=make_tiny_model(world_tokenizer, seed=0), **kw)
    cfg2 = fast_config(process_reward="none", max_steps=2, rollout=GOLD_ROLLOUT, sft_replay=replay)
    out = train_rl(cfg2, parts, model=make_tiny_model(world_tokenizer, seed=0), **kw)
    resumed = [r for r in read_jsonl(parts / "metrics.jsonl") if "replay_nll" in r]
    assert [r["replay_nll"] for r in resumed] == pytest.approx([r["replay_nll"] for r in rows], rel=1e-4)
    from prorag.models.checkpoints import load_policy

    final = load_policy(str(out))[0].model.embed_tokens.weight
    assert torch.allclose(final, model.model.embed_tokens.weight, atol=1e-5)


def test_replay_only_is_the_zero_advantage_run_without_its_rollouts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
    replay_file: Path,
) -> None:
    """With every advantage 0 and no KL the policy gradient is exactly 0: `replay_only` must land on
    the same weights, bit for bit, as the run that samples and scores its rollouts, without sampling."""
    replay = SFTReplayConfig(file=str(replay_file), coef=1.0, batch_size=2)
    kw = dict(tokenizer=world_tokenizer, records=records, retriever=tiny_retriever)
    sampled = make_tiny_model(world_tokenizer, seed=0)
    before = {n: p.detach().clone() for n, p in sampled.named_parameters()}
    train_rl(fast_config(process_reward="none", advantage="zero", sft_replay=replay), tmp_path / "sampled", model=sampled, **kw)

    from prorag.stages.rl import ProcessSupervisedGRPOTrainer

    def no_rollouts(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("replay_only generated rollouts")

    monkeypatch.setattr(ProcessSupervisedGRPOTrainer, "_generate_and_score_completions", no_rollouts)
    alone = make_tiny_model(world_tokenizer, seed=0)
    cfg = fast_config(process_reward="none", advantage="zero", sft_replay=replay, replay_only=True)
    train_rl(cfg, tmp_path / "alone", model=alone, **kw)
    assert any(not torch.equal(p.detach(), before[n]) for n, p in alone.named_parameters()), "the replay moved nothing"
    for (name, a), b in zip(alone.named_parameters(), sampled.parameters(), strict=True):
        assert torch.equal(a.detach(), b.detach()), name
    logged = [
        [r["replay_nll"] for r in read_jsonl(tmp_path / run / "metrics.jsonl") if "replay_nll" in r]
        for run in ("sampled", "alone")
    ]
    assert len(logged[0]) == 2 and logged[0] == logged[1]
    assert not any("outcome_reward" in r for r in read_jsonl(tmp_path / "alone" / "metrics.jsonl"))
    trainer = make_rl_trainer(cfg, tmp_path / "built", make_tiny_model(world_tokenizer), world_tokenizer, records, tiny_retriever)
    assert trainer.init_policy is None, "no rollouts to score: no frozen copy of pi_init kept for kl_to_init"


@pytest.mark.parametrize(
    ("override", "named"),
    [({"advantage": "grpo"}, "advantage='zero'"), ({"beta_kl": 0.1}, "beta_kl=0"), ({"coef": 0.0}, "coef > 0")],
)
def test_replay_only_refuses_a_run_whose_policy_gradient_is_not_zero(override: dict[str, Any], named: str) -> None:
    kw: dict[str, Any] = {"advantage": "zero", "beta_kl": 0.0, "replay_only": True}
    coef = override.pop("coef", 1.0)
    kw |= override
    with pytest.raises(ValueError, match=re.escape(named)):
        RLConfig(sft_replay=SFTReplayConfig(file="t.jsonl", coef=coef), **kw)
