"""What a trained PRM ranks better than the policy already does: held-out metrics and the fresh-sample audit.

The reference of every audit is the init policy's own mean step log-probability
(:func:`policy_step_likelihoods`): MCTS siblings are policy samples, and invalid ones are often its
unlikely draws, so a PRM must rank better than that to have learned a process signal.
:func:`fresh_sample_audit` labels the steps of fresh pi_sft samples on questions no stage trained on
with the oracle judge and ranks them by the PRM, over all steps and within each question (the
comparison the RL advantage makes, which the global ranking can overstate).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from prorag.agent.trajectory import Trajectory
from prorag.core.metrics import grouped_ranking_auc, ranking_auc
from prorag.data.records import Record
from prorag.method.rewards.process import StepScorer
from prorag.stages.prm.config import PRMConfig
from prorag.stages.prm.data import PointStep, StepPair
from prorag.stages.prm.loss import pair_metrics
from prorag.supervision.reward_model import (
    ProcessRewardModel,
    length_batches,
    pad_batch,
    span_means,
    step_token_count,
    token_logprobs,
    truncate_left,
)

#: The least share of a GPU a vLLM engine must leave to the PRM scored beside it (inference only:
#: its weights and one scoring batch's activations); docs/GPU.md.
PRM_GPU_SHARE = 0.2


@torch.inference_mode()
def policy_step_likelihoods(
    model: Any,
    pad_id: int,
    contexts: Sequence[Sequence[int]],
    steps: Sequence[Sequence[int]],
    *,
    max_length: int,
    batch_size: int = 16,
) -> torch.Tensor:
    """Each step's mean per-token log-probability under a causal LM (the policy), given its
    context: ``(N,)`` float32. Inputs are cut from the left as the PRM's are
    (:func:`~prorag.supervision.reward_model.truncate_left`); the mean, not the sum, so that a long step is
    not ranked below a short one for its length. A step whose tokens cannot be predicted (empty,
    or the whole input) scores 0.

    As a scorer of (context, step) pairs this is the free baseline of a PRM: it needs no
    training, and it is what the policy already prefers (and where the likelihood kind of PRM
    starts, with ``beta`` 1 and offset 0)."""
    inputs = [truncate_left(c, s, max_length) for c, s in zip(contexts, steps, strict=True)]
    counts = [step_token_count(len(s), len(ids)) for s, ids in zip(steps, inputs, strict=True)]
    out = torch.zeros(len(inputs), dtype=torch.float32)
    device = next(model.parameters()).device
    for rows in length_batches([len(x) for x in inputs], batch_size):
        ids, mask = pad_batch([inputs[i] for i in rows], pad_id)
        logp = token_logprobs(model, ids.to(device), mask.to(device))
        ends = [len(inputs[i]) for i in rows]
        means = span_means(logp, range(len(rows)), [e - counts[i] for e, i in zip(ends, rows, strict=True)], ends)
        out[torch.tensor(rows)] = means.cpu()
    return out


def step_ranking_audit(scorer: StepScorer, trajectories: Sequence[Trajectory], records: Sequence[Record]) -> dict[str, float]:
    """How the PRM ranks the valid against the invalid steps of trajectories it never saw
    (``trajectories[i]`` answers ``records[i]``; fresh samples of pi_sft): every action is
    labelled by the oracle judge in its context (:func:`prorag.supervision.judge.trajectory_verdicts`), then
    the PRM's logits of the valid ones are compared with those of the invalid ones by ROC AUC.
    Also the share of each class the PRM scores above 0 (the RFT filter's threshold), and
    ``within_question_auc`` / ``within_question_kind_auc`` (:func:`~prorag.core.metrics.grouped_ranking_auc`
    over the steps of one question's samples, and of one step kind among them, with their
    ``_pairs`` counts): the rankings the RL advantage uses, which the global AUC can overstate
    when a scorer mostly tells easy questions from hard ones. NaN where no question has both a
    valid and an invalid step (one sample per question rarely does).

    ``first_error_same`` / ``_prm_earlier`` / ``_prm_later``: the shares of trajectories where the
    first step the PRM scores below 0 is the oracle's first invalid step (none on both sides counts
    as the same), comes before it, or after it (or never): how well ``process_reward:
    prm-first-error`` places the cut that ``oracle-first-error`` places from the gold path."""
    from prorag.supervision.judge import trajectory_verdicts
    from prorag.supervision.step_rewards import ORACLE_INVALID, ORACLE_VALID, first_error_index

    logits = scorer.score_trajectories(trajectories)
    valid: list[float] = []
    invalid: list[float] = []
    # (valid, invalid) scores per question and per (question, step kind): the comparisons the
    # advantage makes (process_norm "group" and "step_kind").
    by_question: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    by_kind: dict[tuple[str, str | None], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    first_errors = Counter[str]()
    skipped = 0
    for traj, record, scores in zip(trajectories, records, logits, strict=True):
        verdicts = trajectory_verdicts(record, traj.text)
        if len(verdicts) != len(scores) or len(traj.actions) != len(scores):  # a lossy decode: no pairing
            skipped += 1
            continue
        never = len(scores)  # "no error" sorts after every step
        prm_first = first_error_index([float(x) for x in scores])
        oracle_first = first_error_index([ORACLE_VALID if ok else ORACLE_INVALID for ok, _ in verdicts])
        prm_at, oracle_at = never if prm_first is None else prm_first, never if oracle_first is None else oracle_first
        first_errors["same" if prm_at == oracle_at else "prm_earlier" if prm_at < oracle_at else "prm_later"] += 1
        for (ok, _), score, action in zip(verdicts, scores, traj.actions, strict=True):
            side = 0 if ok else 1
            (valid if ok else invalid).append(float(score))
            by_question[record.id][side].append(float(score))
            by_kind[(record.id, action.kind)][side].append(float(score))
    out = {
        "trajectories": float(len(trajectories) - skipped),
        "valid_steps": float(len(valid)),
        "invalid_steps": float(len(invalid)),
        "valid_above_0": sum(x > 0 for x in valid) / len(valid) if valid else float("nan"),
        "invalid_above_0": sum(x > 0 for x in invalid) / len(invalid) if invalid else float("nan"),
    }
    out["auc"] = ranking_auc(valid, invalid) if valid and invalid else float("nan")
    audited = sum(first_errors.values())
    for name in ("same", "prm_earlier", "prm_later"):
        out[f"first_error_{name}"] = first_errors[name] / audited if audited else float("nan")
    for name, groups in (("within_question", by_question), ("within_question_kind", by_kind)):
        pairs = sum(len(v) * len(x) for v, x in groups.values())
        out[f"{name}_pairs"] = float(pairs)
        out[f"{name}_auc"] = grouped_ranking_auc(groups.values()) if pairs else float("nan")
    return out


def fresh_sample_audit(
    scorer: StepScorer,
    policy: str | Path,
    records: Sequence[Record],
    retriever: Any,
    *,
    samples: int = 2,
    top_k: int = 3,
    seed: int = 0,
    device: str | None = None,
    rollout: Any = None,
) -> dict[str, float]:
    """:func:`step_ranking_audit` on ``samples`` fresh trajectories per record sampled from
    ``policy`` (pi_sft) through the rollout engine: how the PRM ranks the valid against the
    invalid steps of trajectories that no stage trained on (questions neither SFT, MCTS nor the
    PRM saw). Also ``policy_likelihood_auc``: the same steps ranked by the policy's own mean
    step log-probability, as recorded at sampling time (the baseline of
    ``eval_policy_likelihood_auc``), and ``policy_likelihood_within_question_auc``, its ranking
    within each question's samples.

    ``rollout``: the engine's settings (default ``RolloutConfig(top_k=top_k)``); on ``backend: vllm``
    the engine runs beside the PRM already loaded on the GPU, whose share it must leave
    (:func:`~prorag.agent.rollout_config.check_gpu_share`)."""
    from prorag.agent.context_budget import drop_over_long
    from prorag.agent.rollout import RolloutEngine
    from prorag.agent.rollout_config import RolloutConfig, check_gpu_share
    from prorag.agent.sampling import stream_seed
    from prorag.models.checkpoints import load_sampler

    rollout = rollout or RolloutConfig(top_k=top_k)
    if rollout.backend != "hf":
        check_gpu_share(rollout.vllm, PRM_GPU_SHARE, "the PRM", "prm-audit")
    model, tokenizer = load_sampler(str(policy), rollout, device=device)
    engine = RolloutEngine(model, tokenizer, retriever, rollout)
    records = drop_over_long(records, model, tokenizer, engine.config, "PRM audit")
    repeated = [r for r in records for _ in range(samples)]
    # Sample k of a question draws from its own stream: the audit does not change with the batching.
    streams = [stream_seed("prorag-prm-audit", seed, r.id, k) for r in records for k in range(samples)]
    trajectories = engine.rollout(repeated, row_seeds=streams, progress=True)
    del engine, model
    audit = step_ranking_audit(scorer, trajectories, repeated)
    baseline = step_ranking_audit(SampledLikelihood(), trajectories, repeated)
    audit["policy_likelihood_auc"] = baseline["auc"]
    audit["policy_likelihood_within_question_auc"] = baseline["within_question_auc"]
    return audit


class SampledLikelihood:
    """A :class:`~prorag.supervision.reward_model.StepScorer` that scores each action by the mean of the
    log-probabilities the policy gave its tokens when it sampled them (``Trajectory.logprobs``):
    the policy-likelihood baseline of an audit, at no model cost."""

    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        return [
            [
                sum(t.logprobs[a.span[0] : a.span[1]]) / (a.span[1] - a.span[0]) if a.span[1] > a.span[0] else 0.0
                for a in t.actions
            ]
            for t in trajectories
        ]


def likelihood_baseline_metrics(
    init: str | Path, pairs: Sequence[StepPair], scorer: ProcessRewardModel, config: PRMConfig
) -> dict[str, float]:
    """``eval_policy_likelihood_accuracy`` / ``_auc``: ``pairs`` ranked by the init policy's
    :func:`policy_step_likelihoods`, with the PRM's input length."""
    from prorag.models.checkpoints import load_policy

    policy, _ = load_policy(str(init), dtype=config.dtype, device=str(next(scorer.model.parameters()).device))
    policy.eval()
    contexts = [p.context_ids for p in pairs] * 2
    steps = [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]
    pad = int(scorer.tokenizer.pad_token_id)
    logp = policy_step_likelihoods(policy, pad, contexts, steps, max_length=scorer.max_length, batch_size=config.eval_batch_size)
    del policy
    metrics = pair_metrics(logp[: len(pairs)], logp[len(pairs) :])
    return {"eval_policy_likelihood_accuracy": metrics["accuracy"], "eval_policy_likelihood_auc": metrics["auc"]}


def pointwise_metrics(scorer: ProcessRewardModel, points: Sequence[PointStep], batch_size: int = 32) -> dict[str, float]:
    """Held-out pointwise labels ranked by the PRM across contexts: ``eval_pointwise_auc`` (valid
    against invalid steps) and ``eval_pointwise_points``."""
    logits = scorer.score([p.context_ids for p in points], [p.step_ids for p in points], batch_size).tolist()
    valid = [x for x, p in zip(logits, points, strict=True) if p.label]
    invalid = [x for x, p in zip(logits, points, strict=True) if not p.label]
    auc = ranking_auc(valid, invalid) if valid and invalid else float("nan")
    return {"eval_pointwise_auc": auc, "eval_pointwise_points": float(len(points))}
