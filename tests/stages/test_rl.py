"""The RL stage on the tiny built-in world: the trainer's loss is the project's reference PPO-clip
loss over the dual-granularity advantages (environment tokens carry none), a few steps move the
weights with a finite loss, the outcome-only baseline never calls the PRM, and runs resume."""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.trajectory import Trajectory
from prorag.core.config import apply_overrides, load_config
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import Record, read_records
from prorag.method.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs
from prorag.method.losses import ppo_clip_loss
from prorag.method.rewards.outcome import OUTCOME_REWARDS, OutcomeRewardConfig
from prorag.method.rewards.process import StepRewardConfig
from prorag.models.checkpoints import load_policy
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages import rl
from prorag.stages.rl import RLConfig, excluded_ids, length_sorted_groups, make_rl_trainer, rl_records, train_rl
from tests.fakes import ReplayLM

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "train.jsonl")[:4]


class FakePRM:
    """A stand-in PRM: a deterministic logit per action from its token ids; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        self.calls += 1
        return [[float(sum(t.completion_ids[a.span[0] : a.span[1]]) % 7 - 3) for a in t.actions] for t in trajectories]


class ForbiddenPRM:
    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        raise AssertionError("the outcome-only baseline must not call the PRM")


def fast_config(**kw: Any) -> RLConfig:
    base = dict(
        group_size=2,
        per_device_batch_size=4,
        rollout=RolloutConfig(max_action_tokens=12, max_actions=3, max_completion_tokens=48, batch_size=64),
        learning_rate=1e-3,
        max_steps=2,
        save_steps=1,
        logging_steps=1,
    )
    return RLConfig(**(base | kw))


#: Room for a whole replayed gold trajectory (up to 4 hops: 11 actions).
GOLD_ROLLOUT = RolloutConfig(max_action_tokens=64, max_actions=11, max_completion_tokens=1024, batch_size=64)


def two_groups(trainer: Any) -> list[dict[str, Any]]:
    """Dataset rows of records 0 and 1 interleaved (0, 1, 0, 1): two groups of G = 2 whose rows
    do not sit together, as TRL may order them."""
    return [dict(trainer.train_dataset[i]) for i in (0, 1, 0, 1)]


# ----------------------------------------------------------------------------- the loss


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]) -> None:
    """Rollouts replay the gold trajectories (searches, retrievals, answers), whatever the trained model."""
    golds = render_gold(records, tiny_retriever, k=3)
    engine = RolloutEngine(make_tiny_model(world_tokenizer), world_tokenizer, tiny_retriever)
    targets = {tuple(engine.prompt_ids(g.question)): tokenize_segments(world_tokenizer, g.segments)[0] for g in golds}
    replay = ReplayLM(targets, len(world_tokenizer), world_tokenizer.eos_token_id)
    for module in (rl.rollouts, rl.dev_eval):  # the rollouts and the dev evaluations
        monkeypatch.setattr(module, "unwrap_model_for_generation", lambda *a, **k: contextlib.nullcontext(replay))


def reference_logprobs(model: Any, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """Log-probabilities of the completion tokens, one unpadded row at a time (no TRL code)."""
    B, T = batch["completion_ids"].shape
    out = torch.zeros(B, T)
    for i in range(B):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] == 1]
        n = int(batch["completion_mask"][i].sum())
        ids = torch.cat([prompt, batch["completion_ids"][i, :n]])[None]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
        out[i, :n] = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
    return out


def test_trainer_loss_is_the_reference_ppo_clip_loss(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    cfg = fast_config(
        rollout=RolloutConfig(temperature=0.7, max_action_tokens=64, max_actions=11, max_completion_tokens=1024, batch_size=64)
    )
    model = make_tiny_model(world_tokenizer)
    prm = FakePRM()
    trainer = make_rl_trainer(cfg, tmp_path, model, world_tokenizer, records[:2], tiny_retriever, prm)
    rows = two_groups(trainer)
    model.train()
    batch = trainer._generate_and_score_completions(rows)
    mask = batch["completion_mask"] * batch["tool_mask"]
    adv = batch["advantages"]
    assert prm.calls == 1
    assert adv.shape == batch["completion_ids"].shape
    assert (mask == 0).sum() > (batch["completion_mask"] == 0).sum(), "replayed gold trajectories hold retrievals"
    assert (adv[mask == 0] == 0).all() and (adv[mask == 1] != 0).any()
    # Both samples of a question replay the same trajectory: equal outcomes, A_out = 0, so the
    # advantages are beta * A_proc: process supervision alone gives the signal here.
    assert torch.allclose(adv[0], adv[2]) and torch.allclose(adv[1], adv[3])

    with torch.no_grad():
        logp = reference_logprobs(model, batch, cfg.rollout.temperature)
    # pi_old differs from pi_theta, so some ratios leave [0.8, 1.2] and the clip binds.
    old = logp + 0.4 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0))
    batch["old_per_token_logps"] = old
    expected = ppo_clip_loss(logp, old, adv, mask, cfg.epsilon)
    trainer.current_gradient_accumulation_steps = 1
    got = trainer.compute_loss(trainer.model, dict(batch))
    assert torch.isfinite(got)
    assert got.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    ratio = torch.exp(logp - old)[mask == 1]
    assert ((ratio < 0.8) | (ratio > 1.2)).any()

    # Advantages on environment tokens change nothing; on a generated token they do.
    env = dict(batch, advantages=torch.where(mask == 0, torch.full_like(adv, 1e3), adv))
    assert trainer.compute_loss(trainer.model, env).item() == pytest.approx(got.item(), rel=1e-6, abs=1e-7)
    own = dict(batch, advantages=torch.where(mask == 1, adv + 1.0, adv))
    assert trainer.compute_loss(trainer.model, own).item() != pytest.approx(got.item(), rel=1e-3)


def test_kl_penalty_adds_beta_kl_times_the_k3_kl_on_policy_tokens_only(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    # beta_kl > 0: TRL keeps the reference model (pi_init) and the trainer keeps no copy of its own;
    # with token_mean the loss is Eq. 9's plus beta_kl times the k3 KL averaged over the policy's tokens.
    cfg = fast_config(beta_kl=0.5, rollout=GOLD_ROLLOUT)
    model = make_tiny_model(world_tokenizer)
    trainer = make_rl_trainer(cfg, tmp_path, model, world_tokenizer, records[:2], tiny_retriever, FakePRM())
    assert trainer.init_policy is None and trainer.ref_model is not None
    model.train()
    batch = trainer._generate_and_score_completions(two_groups(trainer))
    mask = batch["completion_mask"] * batch["tool_mask"]
    with torch.no_grad():
        logp = reference_logprobs(model, batch, cfg.rollout.temperature)
    # The reference model is pi_init, a copy of the untrained model: its log-probs are the policy's.
    ref = batch["ref_per_token_logps"]
    assert torch.allclose(ref[mask == 1], logp[mask == 1], atol=1e-5)

    noise = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    batch["ref_per_token_logps"] = logp + 0.5 * noise
    batch["old_per_token_logps"] = logp.clone()
    kl = rl.k3_kl(logp, batch["ref_per_token_logps"])
    expected = ppo_clip_loss(logp, logp, batch["advantages"], mask, cfg.epsilon) + 0.5 * (kl * mask).sum() / mask.sum()
    trainer.current_gradient_accumulation_steps = 1
    got = trainer.compute_loss(trainer.model, dict(batch))
    assert (kl[mask == 1] > 0.01).any(), "the penalty is not negligible here"
    assert got.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    # A reference far off on retrieved tokens changes nothing: the KL counts the policy's tokens only.
    off = dict(batch, ref_per_token_logps=torch.where(mask == 0, logp - 5.0, batch["ref_per_token_logps"]))
    assert trainer.compute_loss(trainer.model, off).item() == pytest.approx(got.item(), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("scoring_rows", [1, None], ids=["rows-cut-to-their-span", "micro-batch-as-is"])
def test_policy_token_scoring_keeps_the_loss_gradients_entropy_and_kl(
    tmp_path: Path,
    replayed: None,
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
    scoring_rows: int | None,
) -> None:
    # The compact path (only the policy's tokens through the LM head; with scoring_rows 1 each row
    # cut to its own span) against TRL's (every completion position of the padded batch): same loss,
    # gradients, logged entropy and kl_to_init; pi_old off pi_theta so the clip binds.
    cfg = fast_config(rollout=GOLD_ROLLOUT, scoring_rows=scoring_rows)
    model = make_tiny_model(world_tokenizer)
    trainer = make_rl_trainer(cfg, tmp_path, model, world_tokenizer, records[:2], tiny_retriever, FakePRM())
    trainer.current_gradient_accumulation_steps = 1
    rows = two_groups(trainer)
    model.train()
    batch = trainer._generate_and_score_completions(rows)
    mask = batch["completion_mask"] * batch["tool_mask"]
    assert (mask == 0).sum() > (batch["completion_mask"] == 0).sum(), "replayed gold trajectories hold retrievals"
    lengths = batch["completion_mask"].sum(1)
    assert lengths.min() < lengths.max(), "rows of different lengths, so cutting to a span removes padding"
    batch["old_per_token_logps"] = batch["sampling_per_token_logps"] + 0.3 * torch.randn(
        mask.shape, generator=torch.Generator().manual_seed(0)
    )
    results = {}
    for compact in (True, False):
        trainer.compact_logps = compact
        model.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
        with trainer._scoring(mask):
            init = trainer._init_logps(batch)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[compact] = loss.detach(), grads, trainer._metrics["train"]["entropy"][-1], init
    (loss, grads, entropy, init), (ref_loss, ref_grads, ref_entropy, ref_init) = results[True], results[False]
    assert torch.allclose(loss, ref_loss, rtol=0, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and grads
    for name, g in grads.items():
        assert torch.allclose(g, ref_grads[name], rtol=1e-5, atol=1e-6), name
    assert entropy == pytest.approx(ref_entropy, rel=1e-6)
    assert torch.allclose(init[mask == 1], ref_init[mask == 1], atol=1e-6)
    # Only the policy's tokens were scored: retrieved tokens are 0, not their log-probabilities.
    assert (init[mask == 0] == 0).all() and (ref_init[(mask == 0) & (batch["completion_mask"] == 1)] != 0).any()


def test_policy_scoring_forwards_run_without_cudnn_attention(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    # The loss's forwards (groups cut to their span: a new shape nearly every call) may not use cuDNN's
    # attention, which sets up each new shape on the host (prorag.core.kernels); after them
    # the setting is as it was.
    trainer = make_rl_trainer(
        fast_config(rollout=GOLD_ROLLOUT, scoring_rows=1),
        tmp_path,
        make_tiny_model(world_tokenizer),
        world_tokenizer,
        records[:2],
        tiny_retriever,
        FakePRM(),
    )
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions(two_groups(trainer))
    seen: list[bool] = []
    hook = trainer.model.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    try:
        trainer.compute_loss(trainer.model, batch).backward()
    finally:
        hook.remove()
    assert len(seen) >= 2 and not any(seen), "every group's forward runs without cuDNN attention"
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_length_sorted_groups_cut_each_group_to_its_rows_span() -> None:
    # Left-padded prompts, right-padded completions: real spans [2, 5), [0, 8), [1, 4), [2, 3).
    attention = torch.tensor(
        [
            [0, 0, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 1],
            [0, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0, 0, 0],
        ]
    )
    groups = length_sorted_groups(attention, 2)
    assert [(g.tolist(), lo, hi) for g, lo, hi in groups] == [([3, 0], 2, 5), ([2, 1], 0, 8)]
    assert [(g.tolist(), lo, hi) for g, lo, hi in length_sorted_groups(attention, 8)] == [([3, 0, 2, 1], 0, 8)]
    single = length_sorted_groups(attention, 1)
    assert [(lo, hi) for _, lo, hi in single] == [(2, 3), (2, 5), (1, 4), (0, 8)]


def test_reasoning_scope_leaves_the_answer_to_the_outcome_term(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    cfg = fast_config(
        rollout=GOLD_ROLLOUT,
        prm_scope="reasoning",
        step_reward=StepRewardConfig(form="paper"),  # RL's default is the bounded form
    )
    prm = FakePRM()
    trainer = make_rl_trainer(cfg, tmp_path, make_tiny_model(world_tokenizer), world_tokenizer, records[:2], tiny_retriever, prm)
    rows = two_groups(trainer)
    adv = trainer._generate_and_score_completions(rows)["advantages"]
    trajs: list[Trajectory] = [r["trajectory"] for r in rows]
    logits = prm.score_trajectories(trajs)
    for members in ((0, 2), (1, 3)):  # the two samples of a question replay one trajectory: A_out = 0
        # Eq. 5 (paper form, nu1 = 1, all well formed) over the group's searches and conclusions only
        rewards = [logits[i][k] + 1.0 for i in members for k, a in enumerate(trajs[i].actions) if a.kind != "answer"]
        mean = sum(rewards) / len(rewards)
        std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
        for i in members:
            kinds = [a.kind for a in trajs[i].actions]
            assert kinds[-1] == "answer" and kinds.count("answer") == 1
            for k, a in enumerate(trajs[i].actions):
                start, end = a.span
                if a.kind == "answer":
                    assert (adv[i, start:end] == 0).all(), "the answer gets A_out alone"
                else:
                    expected = cfg.beta * (logits[i][k] + 1.0 - mean) / (std + 1e-6)
                    assert torch.allclose(adv[i, start:end], torch.full((end - start,), expected), atol=1e-5)
    assert (adv != 0).any()


# ----------------------------------------------------------------------------- training


def _params(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_a_few_steps_move_the_weights_and_log_the_curve(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    model = make_tiny_model(world_tokenizer)
    before = _params(model)
    prm = FakePRM()
    cfg = fast_config(rollout=GOLD_ROLLOUT)
    out = train_rl(cfg, tmp_path, model=model, tokenizer=world_tokenizer, records=records, retriever=tiny_retriever, scorer=prm)
    assert prm.calls == 2
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "training must move the weights"
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "outcome_reward" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in (
            "loss",
            "outcome_reward",
            "process_reward",
            "format_valid_rate",
            "searches_per_trajectory",
            "answer_f1",
            "entropy",
        ):
            assert key in r and r[key] is not None and r[key] == r[key], key
    assert all(r["grad_norm"] > 0 for r in rows)
    assert all(r["searches_per_trajectory"] > 0 and r["format_valid_rate"] == 1.0 for r in rows)
    curve = list(csv.DictReader((tmp_path / "learning_curve.csv").open()))
    assert [int(c["step"]) for c in curve] == [1, 2]
    assert json.loads((tmp_path / "rl_config.json").read_text())["beta"] == 0.3
    assert load_config(tmp_path / "rl_config.json", RLConfig) == cfg  # the saved config reads back, method sections included
    reloaded, _ = load_policy(str(out))
    assert torch.equal(reloaded.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_outcome_only_baseline_never_calls_the_prm_and_resumes(
    tmp_path: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    # The untrained model writes no well-formed trajectory: every outcome reward is equal, every
    # outcome-only advantage 0, so the weights stay those of seed 0 throughout.
    cfg = fast_config(process_reward="none", max_steps=1)
    kw = dict(tokenizer=world_tokenizer, records=records, retriever=tiny_retriever, scorer=ForbiddenPRM())
    train_rl(cfg, tmp_path, model=make_tiny_model(world_tokenizer, seed=0), **kw)
    assert (tmp_path / "checkpoints" / "checkpoint-1").is_dir()
    # Resume with another model (seed 1), two steps in all: step 2 runs from checkpoint 1's weights.
    out = train_rl(
        fast_config(process_reward="none", max_steps=2), tmp_path, model=make_tiny_model(world_tokenizer, seed=1), **kw
    )
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "outcome_reward" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("process_reward" not in r and r["loss"] == 0.0 for r in rows)
    final = load_policy(str(out))[0].model.embed_tokens.weight
    assert torch.equal(final, make_tiny_model(world_tokenizer, seed=0).model.embed_tokens.weight)
    curve = list(csv.DictReader((tmp_path / "learning_curve.csv").open()))
    assert [int(c["step"]) for c in curve] == [1, 2]


def test_rl_questions_exclude_the_sft_questions(tmp_path: Path, records: list[Record]) -> None:
    sft = tmp_path / "sft.jsonl"
    write_jsonl(sft, [{"id": records[0].id, "segments": []}, {"question_id": records[2].id}])
    assert excluded_ids([sft]) == {records[0].id, records[2].id}
    kept = rl_records(records, excluded_ids([sft]))
    assert [r.id for r in kept] == [records[1].id, records[3].id]
    assert rl_records(records, set(), limit=1) == records[:1]


def test_config_checks_and_yaml(tmp_path: Path) -> None:
    from prorag.core.config import load_config

    with pytest.raises(ValueError, match="process_norm"):
        RLConfig(process_norm="tokens")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group_size"):
        RLConfig(group_size=1)
    path = tmp_path / "rl.yaml"
    path.write_text("beta: 0.5\nprocess_norm: token\noutcome_reward:\n  form: reference\nlearning_rate: 1e-5\n")
    cfg = load_config(path, RLConfig)
    assert cfg.beta == 0.5 and cfg.process_norm == "token" and cfg.outcome_reward.form == "reference"
    assert cfg.learning_rate == 1e-5 and cfg.group_size == 8 and cfg.epsilon == 0.2 and cfg.beta_kl == 0.0
    assert RLConfig(process_reward="none").effective_beta == 0.0
    # The shipped configs load: the tiny world's, and the paper's (LoRA r 16 alpha 32, lr 1e-5).
    repo = Path(__file__).resolve().parents[2]
    assert load_config(repo / "configs" / "stages" / "rl_world_tiny.yaml", RLConfig).group_size == 8
    paper = load_config(repo / "configs" / "stages" / "rl_paper.yaml", RLConfig)
    assert (paper.lora.enabled, paper.lora.r, paper.lora.alpha, paper.learning_rate, paper.beta) == (True, 16, 32, 1e-5, 0.3)


# ----------------------------------------------------------------------------- several processes


def test_row_seeds_follow_the_global_row_not_the_process() -> None:
    """Process p's local row j is global row p * local + j: two processes with 4 rows each
    get the seeds one process with 8 rows gets; steps, seeds and rows all change them."""
    one = rl.generation_row_seeds(0, 3, 0, 8)
    assert rl.generation_row_seeds(0, 3, 0, 4) + rl.generation_row_seeds(0, 3, 1, 4) == one
    assert len(set(one)) == 8 and all(0 <= s < 2**63 for s in one)
    assert not set(one) & set(rl.generation_row_seeds(0, 4, 0, 8)) and rl.generation_row_seeds(1, 3, 0, 8) != one
    assert rl.local_rows(1, 4) == slice(4, 8)


@pytest.mark.slow
def test_one_and_two_processes_train_alike(
    tmp_path: Path, tiny_world: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever
) -> None:
    """`prorag rl` on one process (8 trajectories per device) and under `torchrun
    --nproc_per_node 2` on CPU (gloo, 4 per device), with a real PRM and groups of 4, so a group
    spans both processes: every row samples the same trajectory (per-row seeds keyed by the
    global row), the advantages come from the whole groups and the loss is normalised over the
    global batch, so both runs log the same steps and end with the same weights up to float noise.

    The policy is a briefly fine-tuned one: it writes tags and searches, so its steps get
    different PRM scores and both RL steps carry a gradient (a random model's would be 0).
    """
    from safetensors.torch import load_file

    from tests.stages.test_sft_cli import assert_same_training, step_metrics

    policy, runs = one_and_two_process_runs(tmp_path, tiny_world, world_tokenizer, tiny_retriever, lambda n: "", port=29531)
    rows = step_metrics(runs[2])
    assert [r["step"] for r in rows] == [1, 2]  # written once (by the main process)
    assert all(r["grad_norm"] > 0 and r["searches_per_trajectory"] > 0 for r in rows), "both steps must carry signal"
    assert (runs[2] / "policy" / "config.json").is_file() and (runs[2] / "learning_curve.csv").is_file()
    keys = (
        "loss", "grad_norm", "outcome_reward", "process_reward", "searches_per_trajectory", "format_valid_rate",
        "answer_f1", "entropy", "num_tokens", "completions/mean_length",
    )  # fmt: skip
    # Adam's step is g / (|g| + eps): a weight whose gradient is near 0 moves by a share of the
    # learning rate that float noise in g can change (up to 6e-5 seen here); a different sample
    # or batch moves weights by about the learning rate (3e-3).
    assert_same_training(runs[1], runs[2], load_file(policy / "model.safetensors"), keys, weight_atol=3e-4)


def one_and_two_process_runs(
    tmp_path: Path,
    tiny_world: Path,
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    extra: Callable[[int], str],
    port: int,
) -> tuple[Path, dict[int, Path]]:
    """A briefly fine-tuned policy and its PRM, then `prorag rl` on one process (8 trajectories per
    device) and under `torchrun --nproc_per_node 2` on CPU (gloo, 4 per device), groups of 4, two
    optimiser steps; ``extra(n)`` adds YAML lines to the run on ``n`` processes. Returns the policy
    folder and each run's folder."""
    from prorag.retrieval.index import build_index
    from prorag.stages.sft import train_sft
    from prorag.stages.sft_config import SFTConfig
    from prorag.supervision.reward_model import ProcessRewardModel, reward_model_from_policy
    from tests.stages.test_sft_cli import run_cli

    sft = SFTConfig(
        model="tiny", per_device_batch_size=8, learning_rate=2e-2, max_steps=12, warmup_ratio=0.0, logging_steps=100,
        save_steps=100, eval_fraction=0.0, eval_samples=0, max_length=512,
    )  # fmt: skip
    gold = render_gold(read_records(tiny_world / "train.jsonl")[:64], tiny_retriever, k=3)
    policy = train_sft(sft, tmp_path / "sft", tokenizer=world_tokenizer, trajectories=gold)
    ProcessRewardModel(*reward_model_from_policy(policy)).save(tmp_path / "prm")
    build_index(tiny_world / "corpus.jsonl", tmp_path / "bm25")
    fields = (
        "group_size: 4\nrollout:\n  max_action_tokens: 16\n  max_actions: 3\n  max_completion_tokens: 160\n"
        "learning_rate: 3.0e-3\nsave_steps: 1\nlimit: 8\n"
    )
    runs = {}
    for n in (1, 2):
        config = tmp_path / f"rl{n}.yaml"
        config.write_text(fields + f"per_device_batch_size: {8 // n}\n" + extra(n))
        runs[n] = tmp_path / f"run{n}"
        run_cli(
            [
                "rl", "--policy", str(policy), "--prm", str(tmp_path / "prm"), "--data", str(tiny_world / "train.jsonl"),
                "--index", str(tmp_path / "bm25"), "--run-dir", str(runs[n]), "--config", str(config), "--max-steps", "2",
            ],
            processes=n,
            port=port,
        )  # fmt: skip
    return policy, runs


# ----------------------------------------------------------------------------- registries


def test_unknown_registry_names_are_clear_errors() -> None:
    with pytest.raises(
        ValueError, match=r"RLConfig.advantage: unknown advantage estimator 'ppo'; expected one of \['grpo', 'dual'"
    ):
        RLConfig(advantage="ppo")
    with pytest.raises(
        ValueError,
        match=r"RLConfig.process_reward: unknown step reward source 'orcale'; expected one of .*'none'.*'prm'.*'shuffled'.*'oracle'"
        r".*; did you mean 'oracle'\?$",
    ):
        RLConfig(process_reward="orcale")


def test_scale_advantages_reaches_the_estimator_and_trl(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    # `scale_advantages: batch` (LitePPO) is handed to the advantage estimator and to TRL's own
    # `scale_rewards`; a name neither knows is refused when the config is made.
    cfg = fast_config(rollout=GOLD_ROLLOUT, scale_advantages="batch")
    trainer = make_rl_trainer(
        cfg, tmp_path, make_tiny_model(world_tokenizer), world_tokenizer, records[:2], tiny_retriever, FakePRM()
    )
    seen: list[Any] = []
    estimator = trainer.estimator
    trainer.estimator = lambda inputs: (seen.append(inputs), estimator(inputs))[1]
    adv = trainer._generate_and_score_completions(two_groups(trainer))["advantages"]
    assert [i.scale for i in seen] == ["batch"] and trainer.args.scale_rewards == "batch"
    assert torch.isfinite(adv).all() and (adv != 0).any()
    with pytest.raises(ValueError, match="RLConfig.scale_advantages must be"):
        RLConfig(scale_advantages="global")


def test_oracle_source_by_name_with_step_kind_norm(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    """``process_reward: oracle`` is picked by name (no trainer edit): every step of the replayed
    gold trajectories is judged valid (+1), and ``process_norm: step_kind`` runs through the trainer."""
    from prorag.method.rewards.sources import STEP_REWARD_SOURCES

    cfg = fast_config(
        rollout=GOLD_ROLLOUT,
        process_reward="oracle",
        process_norm="step_kind",
    )
    source = STEP_REWARD_SOURCES.get(cfg.process_reward)(cfg)
    trainer = make_rl_trainer(
        cfg, tmp_path, make_tiny_model(world_tokenizer), world_tokenizer, records[:2], tiny_retriever, source
    )
    rows = two_groups(trainer)
    adv = trainer._generate_and_score_completions(rows)["advantages"]
    trajs = [r["trajectory"] for r in rows]
    verdicts = source(trajs, [records[int(r["record_index"])] for r in rows])
    assert all(v == [1.0] * len(t.actions) for v, t in zip(verdicts, trajs, strict=True)) and verdicts[0]
    assert torch.isfinite(adv).all()


def test_a_nan_step_reward_is_no_step_through_the_trainer(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    """A source's NaN (``oracle-first-error`` after a trajectory's first error) passes Eq. 5 and the
    advantage: that step's tokens keep the outcome advantage alone (0 here: a group of identical
    replayed trajectories), while the scored steps get +/- process advantages."""

    def first_error(trajectories: Any, records: Any = None, group_ids: Any = None) -> list[list[float]]:
        return [[1.0, -1.0] + [math.nan] * (len(t.actions) - 2) for t in trajectories]

    cfg = fast_config(
        rollout=GOLD_ROLLOUT,
        process_reward="oracle-first-error",
        beta=0.5,
    )
    trainer = make_rl_trainer(
        cfg, tmp_path, make_tiny_model(world_tokenizer), world_tokenizer, records[:2], tiny_retriever, first_error
    )
    rows = two_groups(trainer)
    adv = trainer._generate_and_score_completions(rows)["advantages"]
    assert torch.isfinite(adv).all()
    for row, traj in zip(adv, (r["trajectory"] for r in rows), strict=True):
        assert len(traj.actions) >= 3
        (a0, b0), (a1, b1) = traj.actions[0].span, traj.actions[1].span
        assert (row[a0:b0] > 0).all() and (row[a1:b1] < 0).all()
        for action in traj.actions[2:]:
            assert torch.equal(row[action.span[0] : action.span[1]], torch.zeros(action.span[1] - action.span[0]))


@ADVANTAGE_ESTIMATORS.register("test-signed-outcome", replace=True)
def signed_outcome(inputs: AdvantageInputs) -> torch.Tensor:
    """A toy estimator: the sign of each row's outcome reward minus 0.5 on its generated tokens."""
    return torch.sign(inputs.outcome - 0.5)[:, None] * inputs.loss_mask.float()


def test_a_registered_estimator_is_used_without_editing_the_trainer(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    cfg = fast_config(rollout=GOLD_ROLLOUT, advantage="test-signed-outcome")
    prm = FakePRM()
    trainer = make_rl_trainer(cfg, tmp_path, make_tiny_model(world_tokenizer), world_tokenizer, records[:2], tiny_retriever, prm)
    rows = two_groups(trainer)
    batch = trainer._generate_and_score_completions(rows)
    mask = batch["completion_mask"] * batch["tool_mask"]
    # Replayed gold trajectories answer right: outcome reward > 0.5, so +1 on every generated token.
    assert torch.equal(batch["advantages"], mask.float()) and prm.calls == 1


def test_several_iterations_per_rollout_batch_clip_and_log_kl_entropy_and_dev_eval(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_world: Path, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    # num_iterations 2: each rollout batch (steps 1, 3) is reused for a second optimiser step (2, 4)
    # with pi_old frozen, so at a large lr the ratio leaves the clip region on the second one only.
    dev = tmp_path / "dev.jsonl"
    write_jsonl(dev, [r.to_dict() for r in read_records(tiny_world / "dev.jsonl")[:3]])
    cfg = fast_config(
        num_iterations=2,
        learning_rate=0.05,
        max_steps=4,
        save_steps=10,
        eval_every=2,
        eval_file=str(dev),
        eval_questions=2,
        rollout=GOLD_ROLLOUT,
    )
    model = make_tiny_model(world_tokenizer)
    train_rl(
        cfg, tmp_path / "run", model=model, tokenizer=world_tokenizer, records=records, retriever=tiny_retriever, scorer=FakePRM()
    )
    rows = {r["step"]: r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r}
    assert sorted(rows) == [1, 2, 3, 4]
    assert ["outcome_reward" in rows[s] for s in (1, 2, 3, 4)] == [True, False, True, False], "one rollout per two steps"
    assert rows[1]["clip_fraction"] == 0.0, "the first pass over a batch has ratio 1"
    assert rows[2]["clip_fraction"] > 0 and rows[4]["clip_fraction"] > 0
    assert rows[1]["kl_to_init"] == pytest.approx(0.0, abs=1e-6), "the first batch is sampled by pi_init itself"
    assert rows[3]["kl_to_init"] > 0
    for r in rows.values():
        assert math.isfinite(r["entropy"])
    assert math.isfinite(rows[3]["kl_to_init"])
    # the agreeing-group shares: logged with each rollout batch, shares of whole groups
    assert ["groups_em_agree" in rows[s] for s in (1, 2, 3, 4)] == [True, False, True, False]
    assert all(0 <= rows[s][k] <= 1 for s in (1, 3) for k in ("groups_em_agree", "groups_reward_agree"))
    # what the advantages were made of: logged with each rollout batch; FakePRM's step rewards add to A_out
    shares = ("advantage_process_share", "advantage_silent_share")
    assert all(rows[s]["advantage_abs_mean"] > 0 and 0 <= rows[s]["advantage_silent_share"] <= 1 for s in (1, 3))
    assert all(0 < rows[s]["advantage_process_share"] <= 1 for s in (1, 3)) and all(k not in rows[2] for k in shares)
    evals = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "eval_em" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert all(0 <= r["eval_em"] <= 1 and 0 <= r["eval_f1"] <= 1 for r in evals)
    assert len(list(read_jsonl(tmp_path / "run" / "dev_eval" / "step-2" / "predictions.jsonl"))) == 2
    curve = list(csv.DictReader((tmp_path / "run" / "learning_curve.csv").open()))
    assert [int(c["step"]) for c in curve] == [0, 1, 2, 3, 4]
    assert [c["eval_em"] != "" for c in curve] == [True, False, True, False, True]
    assert curve[1]["clip_fraction"] != "" and curve[0]["outcome_reward"] == ""
    assert curve[1]["groups_em_agree"] != "" and curve[2]["groups_em_agree"] == ""


def test_dev_best_takes_the_highest_em_and_ties_to_the_earlier_step() -> None:
    evals = [
        {"step": 24, "eval_em": 0.26},
        {"step": 0, "eval_em": 0.225},
        {"step": 12, "eval_em": 0.26},
        {"step": 36, "eval_em": 0.2},
    ]
    assert rl.dev_best(evals)["step"] == 12
    # RL that never beats the initial policy on dev gives it back
    assert rl.dev_best([{"step": 0, "eval_em": 0.3}, {"step": 12, "eval_em": 0.3}, {"step": 24, "eval_em": 0.1}])["step"] == 0
    with pytest.raises(ValueError, match="no dev evaluation"):
        rl.dev_best([])


def test_select_policy_best_dev_needs_dev_evaluations() -> None:
    with pytest.raises(ValueError, match="select_policy='best_dev' needs dev evaluations"):
        RLConfig(select_policy="best_dev")
    with pytest.raises(ValueError, match="select_policy must be one of"):
        RLConfig(select_policy="best")
    assert RLConfig(select_policy="best_dev", eval_every=4).select_policy == "best_dev"


def test_best_dev_policy_holds_the_weights_of_the_dev_best_step_and_survives_a_resume(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replayed: None,
    world_tokenizer: Any,
    tiny_world: Path,
    tiny_retriever: BM25Retriever,
    records: list[Record],
) -> None:
    from safetensors.torch import load_file

    # Scripted dev scores: step 1 is best, step 2 ties it (the earlier wins), the last is worse.
    scores = {0: 0.25, 1: 0.5, 2: 0.5, 3: 0.0}

    def scripted(model: Any, tokenizer: Any, records: Any, retriever: Any, out: Path, config: Any, progress: bool) -> dict:
        em = scores[int(out.name.removeprefix("step-"))]
        return {"em": em, "f1": em}

    monkeypatch.setattr(rl.dev_eval, "evaluate", scripted)
    dev = tmp_path / "dev.jsonl"
    write_jsonl(dev, [r.to_dict() for r in read_records(tiny_world / "dev.jsonl")[:2]])
    cfg = fast_config(
        max_steps=3,
        save_steps=1,
        save_total_limit=None,
        eval_every=1,
        eval_file=str(dev),
        select_policy="best_dev",
        rollout=GOLD_ROLLOUT,
    )
    run = tmp_path / "run"
    model = make_tiny_model(world_tokenizer)
    kw = dict(tokenizer=world_tokenizer, records=records, retriever=tiny_retriever)
    train_rl(cfg, run, model=model, scorer=FakePRM(), **kw)
    chosen = json.loads((run / "dev_eval" / "best.json").read_text())
    assert chosen["best"] == {"step": 1, "eval_em": 0.5, "eval_f1": 0.5} == rl.dev_selection(run)
    assert rl.dev_selection(tmp_path) is None
    assert [e["step"] for e in chosen["evaluations"]] == [0, 1, 2, 3]
    policy = load_file(str(run / "policy" / "model.safetensors"))
    step1 = load_file(str(run / "checkpoints" / "checkpoint-1" / "model.safetensors"))
    last = load_file(str(run / "checkpoints" / "checkpoint-3" / "model.safetensors"))
    assert set(policy) == set(step1)
    assert all(torch.equal(policy[k], step1[k]) for k in policy)
    assert any(not torch.equal(policy[k], last[k]) for k in policy), "the last step moved the weights"

    # Rerunning the finished run trains nothing and still writes the step-1 weights.
    (run / "policy").rename(run / "policy_first")
    train_rl(cfg, run, model=make_tiny_model(world_tokenizer), scorer=FakePRM(), **kw)
    again = load_file(str(run / "policy" / "model.safetensors"))
    assert all(torch.equal(again[k], step1[k]) for k in again)
    assert max(r["step"] for r in read_jsonl(run / "metrics.jsonl")) == 3, "a finished run trains no step more"
    assert [int(c["step"]) for c in csv.DictReader((run / "learning_curve.csv").open())] == [0, 1, 2, 3]


def test_k3_kl_hand_computed() -> None:
    # r = pi_init / pi = 0.5: 0.5 - 1 - log 0.5 = 0.19315; equal log-probs: 0.
    kl = rl.k3_kl(torch.log(torch.tensor([0.4, 0.3])), torch.log(torch.tensor([0.2, 0.3])))
    assert kl.tolist() == pytest.approx([0.5 - 1 - math.log(0.5), 0.0], abs=1e-6)


def test_eval_every_needs_a_dev_file(
    tmp_path: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    with pytest.raises(ValueError, match="eval_file"):
        make_rl_trainer(
            fast_config(eval_every=2), tmp_path, make_tiny_model(world_tokenizer), world_tokenizer, records, tiny_retriever
        )


def test_kl_to_init_with_lora_switches_the_adapter_off(
    tmp_path: Path, replayed: None, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    # LoRA keeps no copy: pi_init is the model with its adapter off. num_iterations 2 and a large
    # lr move the adapter after step 1, so step 3's batch is sampled away from pi_init.
    from prorag.stages.training_config import LoRAConfig

    cfg = fast_config(
        num_iterations=2,
        learning_rate=0.05,
        max_steps=3,
        save_steps=10,
        lora=LoRAConfig(enabled=True, r=4, alpha=8, dropout=0.0),
        rollout=GOLD_ROLLOUT,
    )
    trainer = make_rl_trainer(
        cfg, tmp_path, make_tiny_model(world_tokenizer), world_tokenizer, records, tiny_retriever, FakePRM()
    )
    assert trainer.init_policy is None
    trainer.train()
    rows = {r["step"]: r for r in read_jsonl(tmp_path / "metrics.jsonl") if "kl_to_init" in r}
    assert sorted(rows) == [1, 3]
    assert rows[1]["kl_to_init"] == pytest.approx(0.0, abs=1e-6) and rows[3]["kl_to_init"] > 0


def test_cpsearch_with_cpgrpo_gives_abs_outcome_advantage_times_progressive_reward(
    tmp_path: Path,
    replayed: None,
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``process_reward: cpsearch`` + ``advantage: cpgrpo`` end to end: the token advantages are
    ``|A_out| * pr_t`` with ``pr_t`` the progressive reward of the segment's retrieval (Eq. 3-4),
    not Eq. 5 of it; environment tokens 0."""
    # Both samples of a question replay one trajectory; give them different outcomes (1 vs 0, 0 vs 0.5)
    # so that |A_out| = 0.5 / (std + eps) with std = sqrt(0.5) in both groups: a test outcome reward,
    # registered by name like any other, in row order for TRL's reward call and the trainer's.
    outcomes = itertools.cycle([1.0, 0.0, 0.0, 0.5])
    OUTCOME_REWARDS.register("test-fixed-outcomes", replace=True)(
        lambda config: lambda batch: [next(outcomes) for _ in batch.trajectories]
    )
    cfg = fast_config(
        rollout=GOLD_ROLLOUT,
        process_reward="cpsearch",
        advantage="cpgrpo",
        outcome_reward=OutcomeRewardConfig(form="test-fixed-outcomes"),
    )
    source = rl.STEP_REWARD_SOURCES.get(cfg.process_reward)(cfg)
    model = make_tiny_model(world_tokenizer)
    trainer = make_rl_trainer(cfg, tmp_path, model, world_tokenizer, records[:2], tiny_retriever, source)
    rows = two_groups(trainer)
    batch = trainer._generate_and_score_completions(rows)
    adv, mask = batch["advantages"], batch["completion_mask"] * batch["tool_mask"]
    magnitude = 0.5 / (math.sqrt(0.5) + 1e-6)
    chains = 0
    for i, row in enumerate(rows):
        traj: Trajectory = row["trajectory"]
        hops = [set(h["doc_ids"]) for h in records[int(row["record_index"])].metadata["decomposition"]]
        plus, minus, resolved, pr = 1.0, -1.0, set(), []
        for ret in traj.retrievals:  # Eq. 3 by hand: alpha 0.2, beta -0.3
            new = {h for h, ev in enumerate(hops) if h not in resolved and ev & set(ret["doc_ids"])}
            resolved |= new
            plus, minus = (plus + 0.2, minus) if new else (plus, minus - 0.3)
            pr.append(plus if new else minus)
        chains += sum(p > 1.3 for p in pr)
        where = [int(r["action"]) for r in traj.retrievals]
        for k, a in enumerate(traj.actions):
            seg = next((j for j, w in enumerate(where) if w >= k), len(where) - 1)  # tail: the last retrieval's pr
            start, end = a.span
            expected = torch.full((end - start,), magnitude * pr[seg]) * mask[i, start:end]
            assert torch.allclose(adv[i, start:end], expected, atol=1e-5), (i, k)
    assert chains > 0, "the gold trajectories chain valid retrievals (pr 1.4 and up)"
    assert (adv[mask == 0] == 0).all()
    # every action of a trajectory that retrieved has a progressive reward: logged per trajectory
    steps = trainer._metrics["train"]["process_steps_per_trajectory"]
    assert steps == [pytest.approx(sum(len(r["trajectory"].actions) for r in rows) / len(rows))]


def test_cpsearch_is_selected_by_name_with_set_overrides() -> None:
    from prorag.core.config import apply_overrides
    from prorag.method.rewards.cpsearch import CPSearchSteps

    sets = ["process_reward=cpsearch", "advantage=cpgrpo", "outcome_reward.form=f1_if_valid", "cpsearch.alpha=0.5"]
    cfg = apply_overrides(RLConfig(), sets)
    assert (cfg.process_reward, cfg.advantage, cfg.outcome_reward.form) == ("cpsearch", "cpgrpo", "f1_if_valid")
    source = rl.STEP_REWARD_SOURCES.get(cfg.process_reward)(cfg)
    assert isinstance(source, CPSearchSteps) and source.config.alpha == 0.5 and source.config.beta == -0.3
    with pytest.raises(
        ValueError,
        match=r"outcome_reward.form=f1: OutcomeRewardConfig.form: unknown outcome reward 'f1'; expected one of .*'f1_if_valid'",
    ):
        apply_overrides(RLConfig(), ["outcome_reward.form=f1"])


def test_hiprag_outcome_reward_by_name_reasks_with_the_policy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replayed: None,
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
) -> None:
    """``outcome_reward.form: hiprag`` is picked by name: the trainer hands the policy and records to
    the reward, which re-asks every search step of the batch in one call; the replayed gold
    trajectories (correct, well formed, every step searched) score 1 + 0.4 * N_opt / N."""
    from prorag.supervision import hiprag

    calls: list[tuple[Any, list[str]]] = []

    def fake_reask(policy: Any, tokenizer: Any, queries: list[str], config: Any = None) -> dict[str, str | None]:
        calls.append((policy, list(queries)))
        return {}  # the policy knows nothing without documents: no search step is over-search

    monkeypatch.setattr(hiprag, "reask", fake_reask)
    scored: list[Any] = []
    real = rl.score_batch
    monkeypatch.setattr(rl.trainer, "score_batch", lambda *a, **k: scored.append(real(*a, **k)) or scored[-1])
    cfg = fast_config(rollout=GOLD_ROLLOUT, process_reward="none", advantage="grpo")
    cfg = apply_overrides(cfg, ["outcome_reward.form=hiprag"])
    model = make_tiny_model(world_tokenizer)
    trainer = make_rl_trainer(cfg, tmp_path, model, world_tokenizer, records[:2], tiny_retriever)
    rows = two_groups(trainer)
    trainer._generate_and_score_completions(rows)
    assert len(calls) == 1 and calls[0][0] is model and len(calls[0][1]) == sum(r["trajectory"].num_searches for r in rows)
    assert scored[0].outcome == pytest.approx([1.4] * 4)


class NoisyReplayLM(ReplayLM):
    """:class:`ReplayLM` with a soft margin: each token leaves the script with probability about
    ``e^-5``, after which the row writes EOS (malformed), so a group's rows differ."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        out.logits = torch.where(out.logits > 0, math.log(self.vocab_size) + 5.0, 0.0)
        return out


def test_p2s_reward_trains_a_few_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    """``outcome_reward.form: p2s`` with outcome-only GRPO: gold rollouts that sometimes break off,
    against golds nobody reaches, so every well-formed row gets the path-faithfulness reward (K
    candidates synthesized by the policy, its likelihood passes); the loss is finite and the
    weights move."""
    from prorag.supervision import p2s

    golds = render_gold(records, tiny_retriever, k=3)
    engine = RolloutEngine(make_tiny_model(world_tokenizer), world_tokenizer, tiny_retriever)
    targets = {tuple(engine.prompt_ids(g.question)): tokenize_segments(world_tokenizer, g.segments)[0] for g in golds}
    replay = NoisyReplayLM(targets, len(world_tokenizer), world_tokenizer.eos_token_id)
    monkeypatch.setattr(rl.rollouts, "unwrap_model_for_generation", lambda *a, **k: contextlib.nullcontext(replay))
    paths: list[list[float]] = []
    real = p2s.P2SReward.path_rewards
    monkeypatch.setattr(p2s.P2SReward, "path_rewards", lambda self, *a, **k: paths.append(real(self, *a, **k)) or paths[-1])
    searched_with: list[Any] = []  # the gold-conditioned samples search like the rollouts: the trainer's retriever
    real_synthesize = p2s.synthesize
    streams: list[tuple[int, int]] = []  # (RL seed, trainer step) name the candidates' streams
    monkeypatch.setattr(
        p2s, "synthesize", lambda *a, **k: searched_with.append(a[4]) or streams.append(a[5:7]) or real_synthesize(*a, **k)
    )
    unreachable = [Record(r.id, r.question, ["Nobody"], r.metadata) for r in records]
    cfg = apply_overrides(
        fast_config(rollout=GOLD_ROLLOUT, process_reward="none", advantage="grpo", group_size=4, per_device_batch_size=8),
        [
            "outcome_reward.form=p2s",
            "outcome_reward.p2s.k=2",
            "outcome_reward.p2s.synthesis.max_actions=2",
            "outcome_reward.p2s.synthesis.max_action_tokens=8",
            "seed=3",
        ],
    )
    model = make_tiny_model(world_tokenizer)
    before = _params(model)
    train_rl(cfg, tmp_path, model=model, tokenizer=world_tokenizer, records=unreachable, retriever=tiny_retriever)
    assert len(paths) == 2 and all(math.isfinite(x) for xs in paths for x in xs) and any(paths)
    assert searched_with and all(r is tiny_retriever for r in searched_with)
    assert streams == [(3, 0), (3, 1)]
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "outcome_reward" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    assert any(n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])), "training must move the weights"


def test_hiprag_logs_its_over_and_under_search_rates(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replayed: None,
    world_tokenizer: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
) -> None:
    """HiPRAG's own signal reaches the RL log, not only its scalar reward: the re-ask answers every
    sub-query with the first hop's gold answer, so exactly the search aimed at hop 1 of each
    replayed gold trajectory is over-search (rate 4 / searches); they have no non-search step."""
    from prorag.supervision import hiprag
    from prorag.supervision.judge import oracle_hops, targets

    first_hops = [oracle_hops(r)[0] for r in records[:2]]
    asked: list[str] = []

    def fake_reask(policy: Any, tokenizer: Any, queries: list[str], config: Any = None) -> dict[str, str | None]:
        asked.extend(queries)
        return {q: next((h.answer for h in first_hops if targets(q, h)), "nobody") for q in queries}

    monkeypatch.setattr(hiprag, "reask", fake_reask)
    cfg = apply_overrides(
        fast_config(rollout=GOLD_ROLLOUT, process_reward="none", advantage="grpo"), ["outcome_reward.form=hiprag"]
    )
    trainer = make_rl_trainer(cfg, tmp_path, make_tiny_model(world_tokenizer), world_tokenizer, records[:2], tiny_retriever)
    rows = two_groups(trainer)
    trainer._generate_and_score_completions(rows)
    searches = sum(r["trajectory"].num_searches for r in rows)
    assert searches > 4 and len(asked) == searches
    logged = trainer._metrics["train"]
    assert logged["over_search_rate"] == [pytest.approx(4 / searches)]
    assert logged["under_search_rate"] == [0.0]


def test_one_rollout_engine_and_its_decode_graphs_serve_every_step(
    tmp_path: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's rollouts keep one engine per model across steps, so CUDA graphs captured at
    the first step serve the next ones (here the static step uncaptured, ``decode_graphs="eager"``)."""
    made: list[RolloutEngine] = []
    real = rl.rollouts.RolloutEngine

    def counted(*args: Any, **kw: Any) -> RolloutEngine:
        made.append(real(*args, **kw))
        return made[-1]

    monkeypatch.setattr(rl.rollouts, "RolloutEngine", counted)
    cfg = fast_config(rollout=RolloutConfig(max_action_tokens=12, max_actions=3, max_completion_tokens=48, decode_graphs="eager"))
    train_rl(
        cfg,
        tmp_path,
        model=make_tiny_model(world_tokenizer),
        tokenizer=world_tokenizer,
        records=records,
        retriever=tiny_retriever,
        scorer=FakePRM(),
    )
    assert len(made) == 1, "one engine for both steps"
    assert made[0].graphs is not None and made[0].graphs.shapes, "its decode graphs ran the steps"
