"""Stage 4 of ProRAG: GRPO with the dual-granularity advantage (docs/METHOD.md §2, Eq. 5-9) -> ``pi_theta``.

Each question gets G trajectories from the rollout engine; an outcome reward each (Eq. 6) and a
frozen-PRM step reward per action (Eq. 5), standardised in the group and combined per token as
``A = A_out + beta * A_proc`` (Eq. 7-8), zero on retrieved tokens; PPO-clip, no value net, no KL by
default (Eq. 9). ``process_reward="none"`` (or beta 0) is the outcome-only GRPO baseline on the same code.

:class:`ProcessSupervisedGRPOTrainer` subclasses TRL's ``GRPOTrainer`` (trl==1.16.0): ``rollout_func``
is the engine (:class:`EngineRollout`: ids never re-encoded, ``env_mask`` becomes TRL's ``tool_mask``);
rewards are read from token ids, since TRL's decoded completions lose the special-token tags;
``_generate_and_score_completions`` swaps in ``(B, T)`` advantages, gathered across processes
because a group may span them; ``</answer>`` counts as EOS. Rows sample from streams keyed by
(seed, step, global row), so N processes train as one (``test_one_and_two_processes_train_alike``).
Keep RL questions disjoint from SFT's (``exclude_ids_from``): an all-correct group has no signal.
Writes ``rl_config.json``, ``checkpoints/``, ``metrics.jsonl``, ``learning_curve.csv``, ``policy/``
(and ``dev_eval/step-N/`` with ``eval_every``, ``screening.jsonl`` with ``question_filter``). With
``select_policy="best_dev"``, ``policy/`` holds the weights of the dev evaluation with the highest EM
(:func:`dev_best`; early stopping chosen on dev), kept in ``dev_eval/best.safetensors`` and
``dev_eval/best.json`` while training runs.

Diagnostics logged per step: ``clip_fraction`` (share of policy tokens whose ratio left the clip
region in the direction the advantage pushes; TRL's ``clip_ratio/region_mean``, 0 whenever
``num_iterations`` is 1), ``entropy`` (TRL's mean token entropy on the policy's tokens) and
``kl_to_init`` (:func:`k3_kl`: KL(pi_theta || pi_init) on the sampled tokens, pi_theta as it sampled
them; one no-grad forward of the initial policy per generation batch: a frozen copy of the model
in memory for full fine-tuning, the adapter switched off with LoRA), and per generation batch
``groups_em_agree`` and ``groups_reward_agree`` (:func:`~prorag.method.advantages.agreeing_group_share`:
the share of questions whose G samples were all right or all wrong, and whose outcome rewards
were all equal, i.e. gave GRPO nothing to learn from), and what the batch's advantages are made of
(:func:`~prorag.method.advantages.advantage_composition`: ``advantage_abs_mean``, the share the
step rewards add to outcome GRPO's, ``advantage_process_share``, and the share on groups GRPO is
silent on, ``advantage_silent_share``; every process logs the same gathered values).

``sft_replay`` adds the warm-up's format-aware loss on a batch of its gold trajectories to every RL
loss (InstructGPT's ptx; :mod:`prorag.stages.sft_replay`) and logs it per step as ``replay_nll``.
``replay_only`` trains on that term alone without generating rollouts: the replay-alone control
(``advantage: zero``), whose weights it reproduces exactly at a fraction of the cost.

Log-probabilities (loss, entropy, ``kl_to_init``) are computed on the tokens read only: the
policy's, through TRL's fused LM head in its compact form on CPU too
(:meth:`ProcessSupervisedGRPOTrainer._get_per_token_logps_and_entropies`). With ``num_iterations``
1, TRL already takes ``pi_old`` as the detached ``pi_theta`` (no second forward).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import functools
import hashlib
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.models import unwrap_model_for_generation

from prorag.agent.rollout import RolloutConfig, RolloutEngine, Trajectory
from prorag.agent.sampling import stream_seed
from prorag.core.config import earlier_forms, setting
from prorag.core.kernels import training_attention
from prorag.core.metrics import exact_match, f1_score
from prorag.data.jsonl import atomic_writer, read_json, read_jsonl, write_json
from prorag.data.records import Record, read_records
from prorag.evaluation.harness import EvalConfig, EvalRolloutConfig, evaluate
from prorag.method.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_SCALES,
    PROCESS_NORMS,
    AdvantageInputs,
    AdvantageScale,
    ProcessNorm,
    advantage_composition,
    agreeing_group_share,
    scale_name,
)
from prorag.method.losses import PPO_AGGREGATIONS, PPOAggregation
from prorag.method.rewards.cpsearch import CPSearchConfig
from prorag.method.rewards.outcome import (
    OUTCOME_REWARDS,
    OutcomeReward,
    OutcomeRewardConfig,
    RewardInputs,
    trajectory_answer,
    trajectory_format_valid,
)
from prorag.method.rewards.process import PRM_SCOPES, PRMScope, StepRewardConfig, prm_judged_actions, trajectory_step_rewards
from prorag.method.rewards.sources import STEP_REWARD_SOURCES, StepRewardSource, as_step_source
from prorag.models.checkpoints import load_trainable_state, save_trainable_state
from prorag.retrieval.base import Retriever
from prorag.stages.question_filter import QUESTION_FILTERS, SCREENING_STEP, screen_questions
from prorag.stages.sft_replay import SFTReplay, SFTReplayConfig, draw_index, load_replay
from prorag.stages.training import LoRAConfig, MetricsFile, TrainerKernels, TrainingConfig, resume_training, save_trained_policy

log = logging.getLogger(__name__)

#: TRL's ``loss_type`` computing each :func:`~prorag.method.losses.ppo_clip_loss` aggregation.
TRL_LOSS_TYPES: dict[str, str] = {"token_mean": "dapo", "sequence_mean": "grpo", "sum": "dr_grpo"}

#: What ``policy/`` holds (:attr:`RLConfig.select_policy`).
POLICY_SELECTIONS: tuple[str, ...] = ("last", "best_dev")


@dataclass
class RLConfig(TrainingConfig):
    """Settings of the RL stage. Defaults are the paper's (G = 8, beta = 0.3, 1 epoch) and its
    reference code's (PPO-clip 0.2, no KL, lr 1e-5, temperature 1.0, LoRA r 16 alpha 32,
    11 actions per trajectory); the rest follow TRL.

    ``learning_rate`` 1e-5 is for LoRA on a real pretrained model; a tiny built-in model
    trained fully needs a higher one (the world configs set it).
    """

    # --- models
    policy: str | None = setting(
        None,
        help='The policy to train (`pi_rft`, or `pi_sft` for the "w/o refinement" ablation): a checkpoint folder '
        "or a training run folder (its `policy/`), loaded with load_policy.",
    )
    prm: str | None = setting(
        None,
        help='The frozen PRM (`prorag prm` output), loaded with ProcessRewardModel.load; unused with `process_reward="none"`.',
    )

    # --- data
    train_file: str | None = setting(
        None,
        help="Record file (FlashRAG JSONL) of the RL questions; must not hold the SFT questions (see "
        "`exclude_ids_from` and the module docstring).",
    )
    exclude_ids_from: list[str] = setting(
        factory=list,
        help="JSONL files whose questions are dropped from `train_file`: each row's `question_id`, else its `id` "
        "(record files, SFT trajectory files, step-pair files).",
    )
    limit: int | None = setting(
        None, help="Only the first N questions (after the exclusion; with `question_filter`, the first N kept)."
    )
    question_filter: str = setting(
        "none",
        help="`mixed`: before training, sample `group_size` trajectories per question from the initial policy and "
        "keep only questions whose EM outcomes disagree (DAPO's dynamic sampling, done once: all-right and "
        "all-wrong groups give outcome GRPO zero advantage); screens in order until `limit` are kept; rows in "
        "`screening_file`. See prorag/stages/question_filter.py. `none`: every question.",
    )
    screening_strata: str | None = setting(
        None,
        help="With `question_filter` and `limit`: a metadata field (e.g. `type`) whose values keep their share of "
        "the candidate questions among the kept ones (a quota each, left short where too few are mixed), so that "
        "screening does not favour the questions a guess can answer. See prorag/stages/question_filter.py.",
    )
    screening_file: str | None = setting(
        None,
        help="Where `question_filter` keeps its screening rows (default RUN/screening.jsonl). RL runs from one "
        "policy with one seed can share a file (the pipeline's arms of a seed do): a row is reused only when it "
        "was sampled under the same key (policy, seed, group size, rollout settings).",
    )
    index: str | None = setting(None, help="Retrieval index folder or `http(s)://` URL (open_retriever).")

    # --- rollouts
    group_size: int = setting(8, help="G, trajectories sampled per question (the paper's 8).")
    rollout: RolloutConfig = setting(
        factory=lambda: RolloutConfig(max_actions=11, batch_size=64),
        help="The engine's sampling settings (METHOD.md: 11 actions during RL); its `seed` and `greedy` are not "
        "used: `seed` drives the sampling.",
    )

    # --- rewards and advantages
    process_reward: str = setting(
        "prm",
        help="Where step rewards come from, a name in STEP_REWARD_SOURCES: `prm` (ProRAG's learned PRM), `none` "
        "(outcome only, the GRPO baseline; `beta` is then ignored and no PRM called), `oracle` (the oracle judge's "
        "+1/-1 verdict per step: needs gold decompositions), `oracle-first-error` (the oracle's verdicts up to a "
        "trajectory's first wrong step, none after), `prm-first-error` (the PRM's scores up to the first step it "
        "scores below 0, none after), `shuffled` (the PRM's scores permuted within each "
        "group: the control arm), `oracle-first-error-shuffled` / `prm-first-error-shuffled` (the first-error "
        "scores, permuted the same way: their controls) or `cpsearch` (CP-Search's chain progressive reward from gold evidence per hop; "
        "pair with `advantage: cpgrpo`).",
    )
    advantage: str = setting(
        "dual",
        help="How rewards become token advantages, a name in ADVANTAGE_ESTIMATORS: `dual` (Eq. 7-8, ProRAG), "
        "`grpo` (outcome only), `cpgrpo` (CP-Search's |A| * pr), `dual_silent` (`dual` on the groups whose outcome "
        "rewards all agree, where GRPO is silent; `grpo` on the others), `dual_informative` (its complement: `dual` on "
        "the groups whose outcome rewards disagree, `grpo` on the silent ones), `dual_signed` (`dual` with each step's "
        "advantage kept on its trajectory's side of 0: the step term never reverses the outcome's sign), `zero` (every "
        "token 0: the control for a term beside the policy gradient, e.g. `sft_replay` alone).",
    )
    beta: float = setting(0.3, help="Weight of the process advantage, `A = A_out + beta * A_proc` (Eq. 8; the paper's 0.3).")
    # See prm_judged_actions.
    prm_scope: PRMScope = setting(
        "all",
        help='Which actions get a process term: `"all"` (the paper: every step, the answer included) or '
        '`"reasoning"` (a well-formed answer is left to the outcome term: its tokens get `A_out` alone and '
        "its step reward is not in the group's step statistics).",
    )
    process_norm: ProcessNorm = setting(
        "step",
        help='`"step"`: step rewards standardised over the group\'s steps (the paper\'s Eq. 7); `"token"`: over the '
        "group's generated tokens (the reference code; long steps weigh more); `step_kind`: over the group's "
        "steps of the same kind (search, conclude, answer).",
    )
    scale_advantages: bool | AdvantageScale = setting(
        True,
        help="What the group-centred rewards are divided by: `group` (or `true`), each group's std (GRPO, Eq. 7); "
        "`batch`, the std of the whole batch's rewards (LitePPO; TRL's `scale_rewards: batch`): groups whose "
        "rewards barely differ push less; `none` (or `false`): nothing (Dr. GRPO).",
    )
    outcome_reward: OutcomeRewardConfig = setting(
        factory=OutcomeRewardConfig, help="Eq. 6's form (`paper`: F1 + nu2 I_traj; `reference`: the code's thresholded form)."
    )
    step_reward: StepRewardConfig = setting(
        factory=lambda: StepRewardConfig(form="bounded"),
        help="Eq. 5's form: `bounded` (default: sigmoid(logit) + nu1 I_step), `paper` (logit + nu1 I_step, unbounded) "
        "or `reference` (sigmoid(logit) + 1 / -2).",
    )
    prm_batch_size: int = setting(32, help="Trajectories per batch the PRM scores.")
    scoring_rows: int | None = setting(
        None,
        help="Rows per forward when the policy's log-probabilities are computed (loss, pi_old, pi_init): rows "
        "sorted by length, each forward cut to its rows' own span, so short trajectories carry less padding "
        "(about 2x faster scoring on CPU); None (default): TRL's micro-batches as they come, the path the "
        "published tables were measured on. Equal per step up to float rounding, which RL amplifies: GRPO "
        "runs whose numerics differ (8 here, or padding added) end several EM away (docs/LOG.md, 2026-11-25).",
    )
    cpsearch: CPSearchConfig = setting(
        factory=CPSearchConfig, help="The accumulators of `process_reward: cpsearch` (alpha, beta, initial gamma_plus/minus)."
    )

    # --- loss (Eq. 9)
    epsilon: float = setting(0.2, help="PPO clip: ratios outside `[1 - epsilon, 1 + epsilon_high]` stop pushing.")
    epsilon_high: float | None = setting(
        None, help="Upper clip (DAPO's clip-higher); default `epsilon` (symmetric, as in Eq. 9)."
    )
    beta_kl: float = setting(
        0.0,
        help="Weight of a KL penalty to the initial policy in the loss (TRL's k3 estimate on the policy's tokens; "
        "the reference is a frozen copy of the policy, or the policy with its LoRA adapter off); 0 as in the "
        "reference code (no reference model kept).",
    )
    sft_replay: SFTReplayConfig = setting(
        factory=SFTReplayConfig,
        help="SFT replay (InstructGPT's ptx): `coef` x the format-aware SFT loss on a batch of gold trajectories "
        "from `file` added to every RL loss; off by default (the paper has none). See prorag/stages/sft_replay.py.",
    )
    replay_only: bool = setting(
        False,
        help="Train on the SFT replay alone and generate no rollouts: the replay-alone control (`advantage: zero` "
        "with `sft_replay`) at the cost of its replay. With every advantage 0 and no KL the policy gradient is exactly "
        "0, so the weights are those of the same run with rollouts; dev evaluations still run, no rollout metric is "
        "logged. Needs `advantage: zero`, `beta_kl` 0 and `sft_replay.coef` > 0.",
    )
    loss_aggregation: PPOAggregation = setting(
        "token_mean",
        help="How per-token losses are reduced (ppo_clip_loss): `token_mean` weighs every token alike, as Eq. 9's "
        "sum over tokens does, at a length-free scale; `sequence_mean` is TRL's `grpo`; `sum` is Eq. 9 up to "
        "a constant (TRL's `dr_grpo`).",
    )
    num_iterations: int = setting(
        1,
        help="PPO epochs over each generation batch; with 1 the ratio is 1 at the only update and clipping never "
        "binds (on-policy GRPO); more make `pi_old` differ from `pi_theta`.",
    )
    mask_truncated_completions: bool = setting(
        False, help="Drop the loss of trajectories cut by a cap; off: they keep their (penalised) rewards."
    )
    log_kl_to_init: bool = setting(
        True,
        help="Log `kl_to_init` (k3 estimate of KL(pi_theta || pi_init) on the sampled tokens): one no-grad forward "
        "of the initial policy per generation batch, and a frozen copy of the model without LoRA.",
    )

    # --- held-out evaluation during training (the learning curve's `eval_em`/`eval_f1`)
    eval_every: int = setting(
        0,
        help="Greedy evaluation on `eval_file` before the first step and every this many optimiser steps (and "
        "at the last); 0: off.",
    )
    eval_file: str | None = setting(None, help="Record file of the fixed dev set of `eval_every` (never the test set).")
    eval_questions: int | None = setting(None, help="Only the first N questions of `eval_file`.")
    select_policy: str = setting(
        "last",
        help="Which weights `policy/` holds: 'last' (after the last step) or 'best_dev' (those of the `eval_every` "
        "evaluation with the highest dev EM, the initial policy's at step 0 included, ties to the earlier step: "
        "early stopping chosen on dev; the last step's stay in `checkpoints/`).",
    )

    # --- optimisation (the shared fields are TrainingConfig's; these defaults differ)
    per_device_batch_size: int = setting(
        8,
        help="Trajectories per process per micro-step. Questions per optimiser step = `per_device_batch_size * "
        "processes * gradient_accumulation_steps / group_size`.",
    )
    learning_rate: float = setting(1e-5, help="Peak learning rate (the reference code's, for LoRA on a real pretrained model).")
    lr_scheduler_type: str = setting("constant", help="Constant, as RL libraries (verl, OpenRLHF) run it by default.")
    warmup_ratio: float = setting(0.0, help="No warm-up.")
    save_steps: int = setting(50, help="Checkpoint every this many optimiser steps.")
    logging_steps: int = setting(1, help="Log every step: the learning curve is per step.")
    lora: LoRAConfig = setting(
        factory=LoRAConfig,
        help="A LoRA adapter (the paper's setting for Qwen3-8B, all projections), merged into the saved policy.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        choices = {
            "process_reward": STEP_REWARD_SOURCES.names(),
            "advantage": ADVANTAGE_ESTIMATORS.names(),
            "process_norm": PROCESS_NORMS,
            "prm_scope": PRM_SCOPES,
            "loss_aggregation": PPO_AGGREGATIONS,
            "question_filter": QUESTION_FILTERS,
            "select_policy": POLICY_SELECTIONS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"RLConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        try:
            scale_name(self.scale_advantages)
        except ValueError:
            raise ValueError(
                f"RLConfig.scale_advantages must be true, false or one of {ADVANTAGE_SCALES}, got {self.scale_advantages!r}"
            ) from None
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"RLConfig.limit must be >= 1 (or null: every question), got {self.limit}")
        if self.screening_strata is not None and (self.question_filter == "none" or self.limit is None):
            raise ValueError(
                "RLConfig.screening_strata needs a question_filter other than 'none' and a limit (the quotas are "
                f"shares of it), got question_filter={self.question_filter!r}, limit={self.limit}"
            )
        if self.group_size < 2:
            raise ValueError(f"RLConfig.group_size must be >= 2 (a group of one has no baseline), got {self.group_size}")
        if self.beta < 0:
            raise ValueError(f"RLConfig.beta must be >= 0, got {self.beta}")
        if self.beta_kl < 0:
            raise ValueError(f"RLConfig.beta_kl must be >= 0 (a negative KL weight rewards drifting away), got {self.beta_kl}")
        if not 0 < self.epsilon < 1:
            raise ValueError(f"RLConfig.epsilon must be in (0, 1), got {self.epsilon}")
        if self.eval_every < 0:
            raise ValueError(f"RLConfig.eval_every must be >= 0, got {self.eval_every}")
        if self.replay_only and (self.advantage != "zero" or self.beta_kl != 0 or not self.sft_replay.coef > 0):
            raise ValueError(
                "RLConfig.replay_only trains on the replay alone, exactly as a run whose policy gradient is 0: it needs "
                f"advantage='zero' (got {self.advantage!r}), beta_kl=0 (got {self.beta_kl}) and sft_replay.coef > 0 "
                f"(got {self.sft_replay.coef})"
            )
        if self.select_policy == "best_dev" and not self.eval_every:
            # eval_file is checked when the trainer is built: the pipeline fills in its dev split
            raise ValueError("RLConfig.select_policy='best_dev' needs dev evaluations: set `eval_every` (> 0) and `eval_file`")

    @property
    def uses_prm(self) -> bool:
        """Whether step rewards are computed (any source but ``"none"``; they only matter with
        ``beta > 0`` for ``dual``, but are logged whenever a source is in use)."""
        return self.process_reward != "none"

    @property
    def effective_beta(self) -> float:
        """``beta``, or 0 for the outcome-only baseline."""
        return self.beta if self.uses_prm else 0.0

    def rollout_config(self) -> RolloutConfig:
        """The engine's settings during RL: :attr:`rollout`, sampling, seeded by :attr:`seed`."""
        return replace(self.rollout, greedy=False, seed=self.seed)

    def dev_eval_config(self) -> EvalConfig:
        """The evaluation of ``eval_every``: :attr:`rollout`'s caps and documents, greedy (the
        evaluation harness's inference setting), the first ``eval_questions``."""
        return EvalConfig(limit=self.eval_questions, rollout=EvalRolloutConfig(**{**asdict(self.rollout), "greedy": True}))


# ----------------------------------------------------------------------------- data


def excluded_ids(paths: Sequence[str | Path]) -> set[str]:
    """The question ids of JSONL files: each row's ``question_id`` if it has one, else its ``id``."""
    out: set[str] = set()
    for path in paths:
        for row in read_jsonl(path):
            qid = row.get("question_id", row.get("id"))
            if qid is not None:
                out.add(str(qid))
    return out


def rl_records(records: Sequence[Record], exclude: set[str], limit: int | None = None) -> list[Record]:
    """The RL questions: ``records`` minus the ids in ``exclude``, then the first ``limit``."""
    kept = [r for r in records if r.id not in exclude]
    return kept[:limit] if limit is not None else kept


def screening_strata(records: Sequence[Record], field: str) -> list[str]:
    """Each record's ``metadata[field]`` as a stratum label (``(none)`` where it has none); a
    field that no record has is a typo, not a stratum, and is refused."""
    if not any(field in r.metadata for r in records):
        raise ValueError(f"RLConfig.screening_strata: no RL question has metadata field {field!r}")
    return [str(r.metadata.get(field, "(none)")) for r in records]


def screening_key(config: RLConfig) -> str:
    """What a screening row was sampled under: the policy, the seed, G and the rollout settings
    (a digest), so that a shared ``screening_file`` never serves rows of another policy or setting.

    The policy counts by its weights (:func:`~prorag.models.checkpoints.weights_digest`), not its
    path: a policy retrained in place must be screened again, and one policy reached by a relative
    and an absolute path (a probe and the pipeline) shares its rows. A hub id counts by its name
    (and a model handed to :func:`train_rl` in memory, with no ``policy``, as ``None``)."""
    return screening_keys(config)[0]


def screening_keys(config: RLConfig) -> list[str]:
    """:func:`screening_key`, then the keys that earlier versions gave the same settings (before a
    rollout setting of :data:`~prorag.core.config.LATER_FIELDS` existed): rows written under any of
    them were sampled as these settings sample, and are reused rather than screened again."""
    from prorag.models.checkpoints import resolve_policy_path, weights_digest

    policy = resolve_policy_path(config.policy) if config.policy is not None else None
    weights = weights_digest(policy) if policy is not None else None
    rollout = asdict(config.rollout)
    keys: list[str] = []
    for form in [rollout, *earlier_forms(rollout)]:
        what = {"policy": weights or policy, "seed": config.seed, "group_size": config.group_size, "rollout": form}
        key = hashlib.blake2b(json.dumps(what, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
        if key not in keys:
            keys.append(key)
    return keys


def rl_dataset(records: Sequence[Record]) -> Any:
    """TRL's training dataset: one row per question, ``prompt`` (the question, which TRL logs and
    hands to ``rollout_func``), ``record_index`` (the row's record, for :class:`EngineRollout`
    and the advantage groups) and ``golden_answers`` (for the outcome reward)."""
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": r.question, "record_index": i, "golden_answers": list(r.golden_answers)} for i, r in enumerate(records)]
    )


# ----------------------------------------------------------------------------- rollouts


def local_rows(process_index: int, num_local: int) -> slice:
    """Where this process's rows sit in the step's global generation batch.

    TRL 1.16's ``RepeatSampler`` yields the *global* generation batch (``generation_batch_size``
    rows: each question G times in a row), the same sequence on every process (same seed), and
    the dataloader is built with batches of ``per_device_train_batch_size * steps_per_generation``
    rows; accelerate (``split_batches=False``) then hands process ``p`` the ``p``-th of each run
    of ``num_processes`` consecutive batches. So process ``p``'s local row ``j`` is global row
    ``p * num_local + j``: one process with the whole batch holds the same rows in the same order.
    """
    return slice(process_index * num_local, (process_index + 1) * num_local)


def row_seed(seed: int, step: int, row: int) -> int:
    """The sampling seed of global row ``row`` of the generation batch of optimiser step ``step``
    (a 63-bit hash, so no two (step, row) pairs share a stream by arithmetic accident).

    Keyed by the global row (:func:`local_rows`), not by process, so that the same row is
    sampled alike whatever the number of processes; the G rows of a group differ by row."""
    return stream_seed("prorag-rl", int(seed), int(step), int(row))


def generation_row_seeds(seed: int, step: int, process_index: int, num_local: int) -> list[int]:
    """:func:`row_seed` of each of this process's ``num_local`` rows."""
    rows = local_rows(process_index, num_local)
    return [row_seed(seed, step, g) for g in range(rows.start, rows.stop)]


class EngineRollout:
    """TRL's ``rollout_func``: runs the rows of a generation batch through the rollout engine.

    Called as ``rollout(prompts, trainer)`` with the prompts of this process's rows (each
    question already repeated G times by TRL's sampler); the rows themselves come from
    ``trainer.generation_rows``. Returns the engine's ``prompt_ids``, ``completion_ids``,
    ``logprobs`` and ``env_mask`` (1 on tokens the policy wrote, 0 on the environment's), plus
    ``trajectory`` (the :class:`~prorag.agent.rollout.Trajectory` of each row), which TRL forwards to
    the reward functions and merges into the rows. ``seconds`` holds the last call's duration.

    Each row samples from its own stream, seeded by (``config.seed``, optimiser step, the row's
    index in the step's *global* generation batch; :func:`generation_row_seeds`), so a row's
    trajectory does not depend on how the batch is split over processes or rollout batches.
    """

    def __init__(self, records: Sequence[Record], retriever: Retriever, config: RolloutConfig) -> None:
        self.records = list(records)
        self.retriever = retriever
        self.config = config
        self.seconds = 0.0
        self._engine: RolloutEngine | None = None

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        rows = getattr(trainer, "generation_rows", None)
        if rows is None or len(rows) != len(prompts):
            raise RuntimeError("EngineRollout needs the trainer's generation_rows (use ProcessSupervisedGRPOTrainer)")
        records = [self.records[int(r["record_index"])] for r in rows]
        for p, rec in zip(prompts, records, strict=True):
            if p != rec.question:
                raise RuntimeError(f"prompt {p!r} does not match record {rec.id!r}")
        acc = trainer.accelerator
        seeds = generation_row_seeds(self.config.seed, trainer.state.global_step, acc.process_index, len(rows))
        start = time.perf_counter()
        with unwrap_model_for_generation(
            trainer.model_wrapped, acc, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation
        ) as model:
            if self._engine is None or self._engine.model is not model or self._engine.config is not self.config:
                # One engine per model, kept across steps: its decode graphs (CUDA) are captured once.
                self._engine = RolloutEngine(model, trainer.processing_class, self.retriever, self.config)
            engine = self._engine
            trajs = engine.rollout(records, row_seeds=seeds)
        self.seconds = time.perf_counter() - start
        return {
            "prompt_ids": [t.prompt_ids for t in trajs],
            "completion_ids": [t.completion_ids for t in trajs],
            "logprobs": [t.logprobs for t in trajs],
            "env_mask": [t.env_mask for t in trajs],
            "trajectory": trajs,
        }


def outcome_reward_function(
    prompts: list[Any],
    completions: list[Any],
    *,
    trajectory: list[Trajectory],
    golden_answers: list[list[str]],
    tokenizer: Any,
    config: OutcomeRewardConfig,
    **_: Any,
) -> list[float]:
    """TRL reward function: the configured outcome reward (``config.form`` in OUTCOME_REWARDS) of each
    row's :class:`~prorag.agent.rollout.Trajectory` (TRL's ``completions`` are ignored: they are decoded
    without the special tokens, i.e. the tags). Logged only: without records and policy, ``hiprag``
    here judges no step; the advantages use :func:`score_batch`'s full reward."""
    return OUTCOME_REWARDS.get(config.form)(config)(RewardInputs(trajectory, golden_answers, tokenizer))


def outcome(**kwargs: Any) -> list[float]:
    """The outcome reward, under the name TRL logs it by (``rewards/outcome/mean``)."""
    return outcome_reward_function(**kwargs)


# ----------------------------------------------------------------------------- the trainer


@dataclass
class ScoredBatch:
    """What one generation batch (this process's rows) scored: per-row outcome rewards, step
    rewards (one per action, empty without a PRM) and the statistics logged per step."""

    outcome: list[float]
    step_rewards: list[list[float]]
    f1: list[float]
    em: list[float]
    format_valid: list[float]
    searches: list[float]
    prm_seconds: float = 0.0
    ratios: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Further per-step metrics as (numerator, denominator) sums over this process's rows, summed
    over processes before dividing: the outcome reward's own (``last_ratios``, e.g. HiPRAG's
    over/under-search rates) and ``process_steps_per_trajectory`` (actions with a finite step
    reward: 0 says the logged ``process_reward`` mean had no step, e.g. cpsearch without retrievals)."""


def score_batch(
    trajectories: Sequence[Trajectory],
    golds: Sequence[Sequence[str]],
    tokenizer: Any,
    config: RLConfig,
    scorer: StepRewardSource | None,
    records: Sequence[Record] | None = None,
    group_ids: Sequence[int] | None = None,
    policy: Any = None,
    retriever: Any = None,
    outcome_fn: OutcomeReward | None = None,
    step: int | None = None,
) -> ScoredBatch:
    """Rewards and statistics of rolled-out trajectories: Eq. 6 per trajectory, Eq. 5 per action
    (the step-reward source, e.g. the PRM, scores every action of every trajectory in one batched
    call; skipped without a source), answer F1/EM and I_traj as the outcome reward reads them,
    searches per trajectory. ``records`` and ``group_ids`` (one per trajectory) go to the source;
    ``records``, ``policy`` (unwrapped, for HiPRAG's re-ask) and ``retriever`` (P2S's
    gold-conditioned samples search like the rollouts) to the outcome reward ``outcome_fn`` (the
    trainer builds it once, so a judge's cache and a reward's counters live across batches; else
    ``config.outcome_reward.form`` in OUTCOME_REWARDS is built for this call), with the run's seed
    and the trainer's ``step`` (P2S's candidates draw from streams named by them)."""
    answers = [trajectory_answer(t, tokenizer) for t in trajectories]
    f1 = [f1_score(a, list(g)) if a is not None else 0.0 for a, g in zip(answers, golds, strict=True)]
    em = [exact_match(a, list(g)) if a is not None else 0.0 for a, g in zip(answers, golds, strict=True)]
    valid = [float(trajectory_format_valid(t, tokenizer, strict=config.outcome_reward.strict)) for t in trajectories]
    if outcome_fn is None:
        outcome_fn = OUTCOME_REWARDS.get(config.outcome_reward.form)(config.outcome_reward)
    rewards = outcome_fn(
        RewardInputs(list(trajectories), golds, tokenizer, records, policy, retriever, seed=config.seed, step=step)
    )
    steps: list[list[float]] = [[] for _ in trajectories]
    seconds = 0.0
    if scorer is not None:
        start = time.perf_counter()
        logits = scorer(list(trajectories), records, **({"group_ids": list(group_ids)} if group_ids is not None else {}))
        final = getattr(scorer, "final", False)  # e.g. cpsearch: step rewards already, NaN = none
        steps = (
            [list(map(float, r)) for r in logits]
            if final
            else trajectory_step_rewards(list(trajectories), logits, config.step_reward)
        )
        seconds = time.perf_counter() - start
    ratios = dict(getattr(outcome_fn, "last_ratios", {}))
    if scorer is not None:
        ratios["process_steps_per_trajectory"] = (
            float(sum(math.isfinite(r) for rs in steps for r in rs)),
            float(len(trajectories)),
        )
    return ScoredBatch(rewards, steps, f1, em, valid, [float(t.num_searches) for t in trajectories], seconds, ratios)


def length_sorted_groups(attention: torch.Tensor, rows: int) -> list[tuple[torch.Tensor, int, int]]:
    """The rows of a padded batch (``attention`` ``(B, L)``, 1 on real tokens) in groups of at
    most ``rows``, sorted by the span of their real tokens, each with the columns ``[lo, hi)``
    its rows' real tokens lie in.

    Why: a GRPO batch pads every trajectory to the longest (left-padded prompts, right-padded
    completions), and trajectories of a search agent differ in length by their retrievals, so a
    forward over the whole batch spends much of its arithmetic on padding. Groups of similar
    length, each cut to its own span, do the same per-row arithmetic on fewer positions; the
    columns cut are padding in every row of the group, and a causal model's real tokens never
    read padding, so nothing a real token computes changes (rotary positions are relative)."""
    real = attention.bool()
    width = real.shape[1]
    cols = torch.arange(width, device=real.device)
    first = torch.where(real, cols, width).min(1).values
    last = torch.where(real, cols, -1).max(1).values + 1
    order = torch.argsort((last - first).clamp(min=0), stable=True)
    groups = []
    for start in range(0, len(order), max(1, rows)):
        index = order[start : start + rows]
        lo, hi = int(first[index].min()), int(last[index].max())
        groups.append((index, min(lo, hi), max(lo, hi)))  # rows without a real token: lo = width, hi = 0
    return groups


@contextlib.contextmanager
def compact_fused_head() -> Iterator[None]:
    """TRL's fused LM head, scoring only the positions with a label on CPU too.

    TRL 1.16 projects only the labelled positions through the LM head where its Triton kernel runs;
    elsewhere it projects every position (prompt, padding, retrieved tokens), to keep tile shapes
    fixed for compilers such as Neuron's. Eager CPU recompiles nothing, so there the compact path is
    the same per-row arithmetic on fewer rows (benchmarks/rl_step_profile.py). Other devices keep TRL's choice."""
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: device.type == "cpu" or original(device)
    try:
        yield
    finally:
        trl_utils._use_triton = original


class ProcessSupervisedGRPOTrainer(TrainerKernels, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with rollouts from the rollout engine and ProRAG's ``(B, T)``
    dual-granularity advantages (see the module docstring for what is overridden and why).

    ``rl_config`` gives the advantage estimator and its settings (``advantage``, ``beta``,
    ``process_norm``, ``scale_advantages``) and the reward forms; ``scorer`` gives the step rewards:
    a step-reward source (:data:`~prorag.method.rewards.sources.STEP_REWARD_SOURCES`) or any object
    with ``score_trajectories`` (e.g. a :class:`~prorag.supervision.reward_model.ProcessRewardModel`),
    ``None`` for the outcome-only baseline.
    """

    def __init__(
        self, *args: Any, rl_config: RLConfig, scorer: Any | None = None, replay: SFTReplay | None = None, **kwargs: Any
    ) -> None:
        if rl_config.uses_prm and scorer is None:
            raise ValueError(
                f"process_reward={rl_config.process_reward!r} needs a step-reward source (or set process_reward='none')"
            )
        self.rl_config = rl_config
        self.scorer = as_step_source(scorer, rl_config.prm_batch_size) if rl_config.uses_prm else None
        self.estimator = ADVANTAGE_ESTIMATORS.get(rl_config.advantage)
        self.outcome_fn = OUTCOME_REWARDS.get(rl_config.outcome_reward.form)(rl_config.outcome_reward)
        self.generation_rows: list[dict[str, Any]] | None = None
        """The dataset rows of the batch being generated (read by :class:`EngineRollout`)."""
        self.replay = replay
        """The SFT replay set (``rl_config.sft_replay``), ``None`` without one."""
        self.replay_draws: tuple[int, int] = (-1, 0)
        """(optimiser step, replay batches drawn in it so far): numbers each micro-batch's draw."""
        self.pending_logs: dict[str, float] = {}
        """Values merged into the next log row (the dev evaluation's ``eval_em``/``eval_f1``)."""
        self.compact_logps = True
        """Score only the tokens the loss reads (:meth:`_get_per_token_logps_and_entropies`); ``False``:
        TRL's path (every completion position through the LM head on CPU), kept for the benchmark."""
        self.score_mask: torch.Tensor | None = None
        """``(B, T)`` completion positions whose log-probabilities are read (the policy's tokens) while
        the loss or ``kl_to_init`` is computed; ``None``: every completion token."""
        model = kwargs.get("model")
        # pi_init as a frozen copy, under full fine-tuning only (with LoRA it is the adapter off): TRL's
        # reference model when beta_kl > 0 (whose log-probs _init_logps reuses), else kept for kl_to_init.
        full = kwargs.get("peft_config") is None and isinstance(model, torch.nn.Module)
        wanted = rl_config.beta_kl > 0 or (rl_config.log_kl_to_init and not rl_config.replay_only)  # no rollouts to score
        frozen = copy.deepcopy(model).eval().requires_grad_(False) if full and wanted else None
        self.init_policy: Any = frozen if rl_config.beta_kl == 0 else None
        """pi_init for ``kl_to_init`` without a KL penalty: a frozen copy (full fine-tuning); ``None`` with LoRA."""
        with trl_reference(frozen if rl_config.beta_kl > 0 else None):
            super().__init__(*args, **kwargs)
        if self.init_policy is not None:  # scored as TRL scores its reference model
            from trl.trainer.utils import add_fused_lm_head

            add_fused_lm_head(self.init_policy, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        # A trajectory ending in </answer> has finished: TRL must not count it as truncated.
        from prorag.models.tags import answer_eos_ids

        for eos in answer_eos_ids(self.processing_class):
            if eos not in self.eos_token_ids:
                self.eos_token_ids.append(eos)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self.generation_rows = inputs
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self.generation_rows = None
        trajectories = [row.get("trajectory") for row in inputs]
        if any(t is None for t in trajectories):
            raise RuntimeError("the rollout function returned no trajectories (TRL merges them into the rows)")
        rollout = self.rollout_func
        records = [rollout.records[int(row["record_index"])] for row in inputs] if isinstance(rollout, EngineRollout) else None
        groups = torch.tensor([int(row["record_index"]) for row in inputs], dtype=torch.long)
        golds = [row["golden_answers"] for row in inputs]
        policy = self.accelerator.unwrap_model(self.model)
        retriever = rollout.retriever if isinstance(rollout, EngineRollout) else None
        scored = score_batch(
            trajectories,
            golds,
            self.processing_class,
            self.rl_config,
            self.scorer,
            records,
            groups.tolist(),
            policy,
            retriever,
            self.outcome_fn,
            self.state.global_step,
        )
        loss_mask = output["completion_mask"]
        if "tool_mask" in output:
            loss_mask = loss_mask * output["tool_mask"]
        output["advantages"] = self._advantages(trajectories, scored, groups, loss_mask)
        self._log_rollout_metrics(scored, groups)
        if self.rl_config.log_kl_to_init:
            self._log_kl_to_init(output, loss_mask)
        return output

    @property
    def replay_alone(self) -> bool:
        """A ``replay_only`` training step: no rollouts, the replay term is the whole loss."""
        return self.rl_config.replay_only and self.model.training

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        """TRL's (generate every ``steps_per_generation * num_iterations`` micro-batches, then serve the
        buffer), except that under ``replay_only`` training generates nothing: its loss reads no rollout."""
        if self.replay_alone:
            return {}
        return super()._prepare_inputs(generation_batch)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's loss, with log-probabilities (and the logged entropy) computed on the policy's tokens only;
        under ``replay_only`` the replay term alone (the policy gradient it stands for is exactly 0)."""
        if self.replay_alone:
            return self._replay_term(model)
        mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else None
        with self._scoring(mask):
            loss = super()._compute_loss(model, inputs)
        if self.replay is not None and self.model.training:
            loss = loss + self._replay_term(model)
        return loss

    def _replay_term(self, model: Any) -> torch.Tensor:
        """``coef`` x the SFT loss of this micro-batch's replay draw, divided by the gradient
        accumulation as TRL divides its own loss (``coef`` 0: computed without gradients, only
        logged). Logs ``replay_nll``."""
        cfg = self.rl_config.sft_replay
        step, drawn = self.replay_draws
        if step != self.state.global_step:
            step, drawn = self.state.global_step, 0
        self.replay_draws = (step, drawn + 1)
        accumulation = self.current_gradient_accumulation_steps
        draw = draw_index(step, drawn, accumulation, self.accelerator.process_index, self.accelerator.num_processes)
        fused = self.temperature == 1.0  # TRL's fused head divides the logits by the sampling temperature
        with torch.set_grad_enabled(cfg.coef > 0), compact_fused_head(), self.accelerator.autocast():
            nll = self.replay.loss(model, draw, fused=fused)
        self._metrics["train"]["replay_nll"].append(self.accelerator.gather(nll.detach().view(1)).mean().item())
        if cfg.coef == 0:
            return nll.new_zeros(())
        return cfg.coef * nll / accumulation

    @contextlib.contextmanager
    def _scoring(self, mask: torch.Tensor | None) -> Iterator[None]:
        """:attr:`score_mask` set to ``mask`` for the duration."""
        self.score_mask = mask
        try:
            yield
        finally:
            self.score_mask = None

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """TRL's per-token log-probabilities and entropies of the completion, only on the tokens that
        are read: labels are ``-100`` off :attr:`score_mask` (retrieved tokens, padding) and the fused
        LM head projects only the labelled positions (:func:`compact_fused_head`); rows run in groups
        of similar length, each cut to its span (``scoring_rows``, :func:`length_sorted_groups`).
        Equal to TRL's on the scored tokens, 0 elsewhere (where every use of them is masked).
        Text-only models; others, MoE auxiliary losses and ``compact_logps = False`` take TRL's path."""
        if not self.compact_logps or compute_aux_loss or any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **multimodal
            )
        rows = batch_size or input_ids.size(0)
        if self.rl_config.scoring_rows:
            rows = min(rows, self.rl_config.scoring_rows)
            groups = length_sorted_groups(attention_mask, rows)
        else:
            groups = [
                (torch.arange(s, min(s + rows, len(input_ids)), device=input_ids.device), 0, input_ids.size(1))
                for s in range(0, len(input_ids), rows)
            ]
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        labels[:, :-logits_to_keep] = -100
        if self.score_mask is not None:
            keep = self.score_mask.to(labels.device).bool()
            labels[:, -logits_to_keep:] = labels[:, -logits_to_keep:].masked_fill(~keep, -100)
        width = input_ids.size(1)
        logps, entropies = [], []
        with compact_fused_head(), training_attention(self.cudnn_attention):  # every group is a new (rows, width)
            for index, lo, hi in groups:
                with self.accelerator.autocast():
                    out = model(
                        input_ids=input_ids[index, lo:hi],
                        attention_mask=attention_mask[index, lo:hi],
                        labels=labels[index, lo:hi],
                        fused_lm_head=True,
                    )
                # Column c of the fused head's output scores the label at c + 1: back to (rows, width - 1).
                logps.append(torch.nn.functional.pad(out.log_probs, (lo, width - hi)))
                if compute_entropy:
                    entropies.append(torch.nn.functional.pad(out.entropy, (lo, width - hi)))
        order = torch.argsort(torch.cat([index for index, _, _ in groups]))
        logp = torch.cat(logps).index_select(0, order)[:, -logits_to_keep:]
        entropy = torch.cat(entropies).index_select(0, order)[:, -logits_to_keep:] if compute_entropy else None
        return logp, entropy, None

    def _init_logps(self, output: dict[str, Any]) -> torch.Tensor:
        """pi_init's log-probabilities of the sampled completion tokens (TRL's reference ones when
        ``beta_kl > 0`` already computed them), at the sampling temperature."""
        if "ref_per_token_logps" in output:
            return output["ref_per_token_logps"]
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        width = output["completion_ids"].size(1)
        with torch.no_grad():
            if self.init_policy is not None:
                self.init_policy.to(ids.device)
                logps, _, _ = self._get_per_token_logps_and_entropies(self.init_policy, ids, attention, width)
                return logps
            with self.accelerator.unwrap_model(self.model).disable_adapter():
                logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention, width)
            return logps

    def _log_kl_to_init(self, output: dict[str, Any], loss_mask: torch.Tensor) -> None:
        """Log ``kl_to_init``, :func:`k3_kl` over this step's policy tokens (all processes)."""
        # pi_theta's log-probs as it sampled: TRL's recomputed ones when it keeps them (num_iterations > 1), else the engine's
        sampled = output.get("old_per_token_logps", output.get("sampling_per_token_logps"))
        if sampled is None:
            return
        with self._scoring(loss_mask):
            init = self._init_logps(output)
        kl = k3_kl(sampled, init)
        mask = loss_mask.to(kl.dtype)
        total = self.accelerator.gather(torch.stack([(kl * mask).sum(), mask.sum()]).double().view(1, 2)).sum(0)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["kl_to_init"].append((total[0] / total[1].clamp(min=1)).item())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log, plus ``clip_fraction`` (TRL's ``clip_ratio/region_mean`` under a plain name)
        and whatever :attr:`pending_logs` holds (the dev evaluation)."""
        for metrics in self._metrics.values():
            if "clip_ratio/region_mean" in metrics:
                metrics["clip_fraction"] = list(metrics["clip_ratio/region_mean"])
        logs = {**logs, **self.pending_logs}
        self.pending_logs = {}
        super().log(logs, start_time)

    def _advantages(
        self, trajectories: list[Trajectory], scored: ScoredBatch, groups: torch.Tensor, loss_mask: torch.Tensor
    ) -> torch.Tensor:
        """The ``(B, T)`` advantages of this process's rows: the configured estimator
        (``rl_config.advantage``) on the whole groups, gathered over all processes (a group's G
        rows may live on different processes; loss masks are padded to the longest), then this
        process's rows and columns."""
        from accelerate.utils import gather_object

        cfg = self.rl_config
        judged = [prm_judged_actions(t.actions, cfg.prm_scope) if cfg.uses_prm else [] for t in trajectories]
        # A NaN step reward (a source's "no process reward here") is no step: its tokens keep A_out.
        judged = [[i for i in keep if math.isfinite(r[i])] for r, keep in zip(scored.step_rewards, judged, strict=True)]
        spans = [[t.actions[i].span for i in keep] for t, keep in zip(trajectories, judged, strict=True)]
        step_rewards = [[r[i] for i in keep] for r, keep in zip(scored.step_rewards, judged, strict=True)]
        kinds = [[t.actions[i].kind for i in keep] for t, keep in zip(trajectories, judged, strict=True)]
        mask = loss_mask.cpu()
        local, width = mask.shape
        if self.accelerator.num_processes > 1:
            outcome_all = gather_object(scored.outcome)
            groups_all = gather_object(groups.tolist())
            steps_all = gather_object(step_rewards)
            spans_all = gather_object(spans)
            kinds_all = gather_object(kinds)
            masks = gather_object(mask.tolist())
            mask_all = torch.zeros(len(masks), max(len(m) for m in masks), dtype=mask.dtype)
            for i, row in enumerate(masks):
                mask_all[i, : len(row)] = torch.tensor(row, dtype=mask.dtype)
        else:
            outcome_all, groups_all, steps_all, spans_all, mask_all = scored.outcome, groups.tolist(), step_rewards, spans, mask
            kinds_all = kinds
        inputs = AdvantageInputs(
            outcome=torch.tensor(outcome_all, dtype=torch.float32),
            group_ids=torch.tensor(groups_all, dtype=torch.long),
            loss_mask=mask_all,
            step_rewards=[torch.tensor(s, dtype=torch.float32) for s in steps_all],
            step_spans=[[tuple(x) for x in row] for row in spans_all],
            beta=cfg.effective_beta,
            process_norm=cfg.process_norm,
            scale=cfg.scale_advantages,
            step_kinds=kinds_all,
        )
        mine = local_rows(self.accelerator.process_index, local)
        advantages = self.estimator(inputs)
        mode = "train" if self.model.training else "eval"
        composition = advantage_composition(
            advantages, inputs.outcome, inputs.group_ids, inputs.loss_mask, scale=cfg.scale_advantages
        )
        for name, value in composition.items():
            self._metrics[mode][name].append(value)
        return advantages[mine, :width].to(loss_mask.device)

    def _log_rollout_metrics(self, scored: ScoredBatch, groups: torch.Tensor) -> None:
        """Per-step means over every process's rows (averaged again over logging steps by TRL), and
        the shares of agreeing groups over whole groups (gathered: a group's rows may sit on
        several processes)."""
        from accelerate.utils import gather_object

        mode = "train" if self.model.training else "eval"
        rows = list(zip(groups.tolist(), scored.em, scored.outcome, strict=True))
        if self.accelerator.num_processes > 1:
            rows = gather_object(rows)
        ids = torch.tensor([r[0] for r in rows], dtype=torch.long)
        for name, column in (("groups_em_agree", 1), ("groups_reward_agree", 2)):
            values = torch.tensor([float(r[column]) for r in rows], dtype=torch.float32)
            self._metrics[mode][name].append(agreeing_group_share(values, ids))
        steps = [r for rs in scored.step_rewards for r in rs if math.isfinite(r)]
        columns = {
            "outcome_reward": scored.outcome,
            "answer_f1": scored.f1,
            "answer_em": scored.em,
            "format_valid_rate": scored.format_valid,
            "searches_per_trajectory": scored.searches,
        }
        device = self.accelerator.device
        sums = {name: (float(sum(values)), float(len(values))) for name, values in columns.items()} | scored.ratios
        for name, (num, den) in sums.items():
            total = self.accelerator.gather(torch.tensor([num, den], dtype=torch.float64, device=device))
            total = total.view(-1, 2).sum(0)
            self._metrics[mode][name].append((total[0] / total[1].clamp(min=1)).item())
        if self.scorer is not None:
            total = self.accelerator.gather(torch.tensor([sum(steps), len(steps)], dtype=torch.float64, device=device))
            total = total.view(-1, 2).sum(0)
            self._metrics[mode]["process_reward"].append((total[0] / total[1].clamp(min=1)).item())
            self._metrics[mode]["time/prm_seconds"].append(scored.prm_seconds)
        rollout = self.rollout_func
        if isinstance(rollout, EngineRollout):
            self._metrics[mode]["time/generation_seconds"].append(rollout.seconds)


@contextlib.contextmanager
def trl_reference(reference: torch.nn.Module | None) -> Iterator[None]:
    """While TRL's trainer is built, its reference model is ``reference`` (a frozen copy of the
    policy as passed in), not a reload of the path the policy's config names: a policy built in
    memory (tests, a stage handing its model on) has no such path, and one whose weights changed
    after loading would silently get another reference. TRL then treats the copy as its own
    (dropout off, fused head, ``accelerator.prepare``). ``None``: TRL's own behaviour."""
    if reference is None:
        yield
        return
    import trl.trainer.grpo_trainer as grpo_module

    loader = grpo_module.create_model_from_path
    grpo_module.create_model_from_path = lambda *args, **kwargs: reference
    try:
        yield
    finally:
        grpo_module.create_model_from_path = loader


def k3_kl(logps: torch.Tensor, init_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_init) on tokens sampled from ``pi``:
    ``r - 1 - log r`` with ``r = pi_init / pi`` (Schulman's k3: unbiased, never negative, lower
    variance than ``-log r``). ``logps`` are the sampling policy's own log-probabilities."""
    log_ratio = init_logps - logps
    return torch.exp(log_ratio) - 1 - log_ratio


def dev_best(evaluations: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The evaluation to keep among ``evaluations`` (``{"step", "eval_em", ...}`` each): the highest
    dev EM, ties to the earlier step.

    EM is the metric the tables report, so it is the one early stopping optimises; the tie goes to
    the step nearer the initial policy, the smaller change that did as well. Step 0 (the initial
    policy) competes like any other: RL that never beats it on dev gives it back."""
    if not evaluations:
        raise ValueError("no dev evaluation to select from")
    return max(sorted(evaluations, key=lambda e: e["step"]), key=lambda e: e["eval_em"])


def dev_selection(run_dir: str | Path) -> dict[str, Any] | None:
    """The evaluation whose weights a ``select_policy="best_dev"`` run's ``policy/`` holds
    (``{"step", "eval_em", "eval_f1"}``, from ``dev_eval/best.json``); ``None`` for another run."""
    path = Path(run_dir) / "dev_eval" / "best.json"
    return read_json(path)["best"] if path.is_file() else None


class DevEvaluation(TrainerCallback):
    """Greedy evaluation of the policy on a fixed dev set (:func:`~prorag.evaluation.harness.evaluate`)
    before the first step, every ``every`` optimiser steps and at the last; ``eval_em`` and
    ``eval_f1`` go into that step's log row (so ``metrics.jsonl`` and the learning curve) and each
    evaluation's files into ``out_dir/step-N/`` (a resumed run reuses a finished one).

    With ``keep_best`` it also keeps the weights of the :func:`dev_best` evaluation so far in
    ``out_dir/best.safetensors`` (the trainable parameters only) and its step and scores, with every
    evaluation's, in ``out_dir/best.json``; a resumed run reads them back. :meth:`restore_best` puts
    those weights into the model once training is over."""

    def __init__(
        self,
        trainer: ProcessSupervisedGRPOTrainer,
        records: Sequence[Record],
        retriever: Retriever,
        config: EvalConfig,
        every: int,
        out_dir: Path,
        *,
        keep_best: bool = False,
    ) -> None:
        self.trainer, self.records, self.retriever = trainer, list(records), retriever
        self.config, self.every, self.out_dir, self.keep_best = config, every, out_dir, keep_best
        self.evaluations: list[dict[str, Any]] = []
        if keep_best and (out_dir / "best.json").is_file() and (out_dir / "best.safetensors").is_file():
            self.evaluations = list(read_json(out_dir / "best.json")["evaluations"])

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Add the evaluation of ``step``; when it is the new :func:`dev_best`, save the current
        weights (a resumed run evaluating a step again replaces its earlier entry)."""
        self.evaluations = [e for e in self.evaluations if e["step"] != step] + [{"step": step, **metrics}]
        best = dev_best(self.evaluations)
        if best["step"] == step:
            save_trainable_state(self.trainer.accelerator.unwrap_model(self.trainer.model), self.out_dir / "best.safetensors")
        write_json(self.out_dir / "best.json", {"best": best, "evaluations": sorted(self.evaluations, key=lambda e: e["step"])})

    def restore_best(self) -> dict[str, Any]:
        """Load the dev-best weights into the trainer's model (main process); return that evaluation."""
        best = dev_best(self.evaluations)
        load_trainable_state(self.trainer.accelerator.unwrap_model(self.trainer.model), self.out_dir / "best.safetensors")
        return best

    def run(self, step: int) -> dict[str, float]:
        """Evaluate the current policy on the main process (the others wait: one set of files, and
        only the main process logs; so not under DeepSpeed ZeRO-3, whose parameter gather needs every
        process); ``{"eval_em", "eval_f1"}`` there, ``{}`` elsewhere."""
        trainer = self.trainer
        if not trainer.accelerator.is_main_process:
            trainer.accelerator.wait_for_everyone()
            return {}
        was_training = trainer.model.training
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation
        ) as model:
            metrics = evaluate(
                model,
                trainer.processing_class,
                self.records,
                self.retriever,
                self.out_dir / f"step-{step}",
                self.config,
                progress=False,
            )
        trainer.model.train(was_training)
        scores = {"eval_em": metrics["em"], "eval_f1": metrics["f1"]}
        if self.keep_best:
            self.record(step, scores)
        trainer.accelerator.wait_for_everyone()
        return scores

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 0:
            self.trainer.pending_logs.update(self.run(0))
            self.trainer.log({})

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step % self.every == 0 or state.global_step >= state.max_steps:
            self.trainer.pending_logs.update(self.run(state.global_step))
            control.should_log = True
        return control


# ----------------------------------------------------------------------------- the stage


def rl_training_args(config: RLConfig, run_dir: str | Path) -> GRPOConfig:
    """TRL's ``GRPOConfig`` for ``config``: checkpoints in ``run_dir/checkpoints``, CPU and bf16
    chosen from the hardware, the loss and sampling settings of the stage."""
    return GRPOConfig(
        **config.training_arguments(run_dir),
        # --- GRPO
        num_generations=config.group_size,
        max_completion_length=config.rollout.max_completion_tokens + config.rollout.max_action_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        beta=config.beta_kl,
        epsilon=config.epsilon,
        epsilon_high=config.epsilon_high,
        num_iterations=config.num_iterations,
        loss_type=TRL_LOSS_TYPES[config.loss_aggregation],
        mask_truncated_completions=config.mask_truncated_completions,
        # The advantages are replaced wholesale; TRL's own (logged as its "advantages") use this.
        scale_rewards=scale_name(config.scale_advantages),
        remove_unused_columns=False,
        log_completions=False,
    )


def make_rl_trainer(
    config: RLConfig,
    run_dir: str | Path,
    model: Any,
    tokenizer: Any,
    records: Sequence[Record],
    retriever: Retriever,
    scorer: Any | None = None,
) -> ProcessSupervisedGRPOTrainer:
    """The :class:`ProcessSupervisedGRPOTrainer` of :func:`train_rl` (rollouts, reward, LoRA,
    SFT replay, metrics file and time budget included), not yet trained."""
    import os
    import warnings

    run = Path(run_dir)
    peft_config = config.lora.peft_config()
    callbacks: list[TrainerCallback] = [MetricsFile(run / "metrics.jsonl"), *config.time_budget()]
    reward = functools.partial(outcome, tokenizer=tokenizer, config=config.outcome_reward)
    dev = read_records(config.eval_file) if config.eval_every and config.eval_file else None
    if config.eval_every and dev is None:
        raise ValueError("RLConfig.eval_every needs `eval_file` (a fixed dev set)")
    replay = None
    if config.sft_replay.enabled:  # load_replay refuses coef > 0 without a file, before anything runs
        rollout = config.rollout
        replay = load_replay(
            config.sft_replay,
            tokenizer,
            seed=config.seed,
            retriever=retriever,
            top_k=rollout.top_k,
            prompt_style=rollout.prompt_style,
        )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is TRL's experimental API, pinned here
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*rollout_func.*")
        trainer = ProcessSupervisedGRPOTrainer(
            model=model,
            **config.kernel_settings(),
            reward_funcs=[reward],
            args=rl_training_args(config, run),
            train_dataset=rl_dataset(records),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=callbacks,
            rollout_func=EngineRollout(records, retriever, config.rollout_config()),
            rl_config=config,
            scorer=scorer,
            replay=replay,
        )
    if dev is not None:
        trainer.add_callback(
            DevEvaluation(
                trainer,
                dev,
                retriever,
                config.dev_eval_config(),
                config.eval_every,
                run / "dev_eval",
                keep_best=config.select_policy == "best_dev",
            )
        )
    return trainer


#: The columns of ``learning_curve.csv`` (a step's row leaves blank what it did not log).
CURVE_COLUMNS: tuple[str, ...] = (
    "step",
    "outcome_reward",
    "process_reward",
    "answer_f1",
    "format_valid_rate",
    "eval_em",
    "eval_f1",
    "clip_fraction",
    "entropy",
    "kl_to_init",
    "replay_nll",
    "groups_em_agree",
    "groups_reward_agree",
    "advantage_abs_mean",
    "advantage_process_share",
    "advantage_silent_share",
)


def write_learning_curve(log_history: Sequence[dict[str, Any]], path: str | Path) -> int:
    """Write :data:`CURVE_COLUMNS` per logged step (the paper's Figure 4: training reward and,
    with ``eval_every``, held-out EM) as CSV, atomically; returns the number of rows. Log rows of
    one step are merged (the dev evaluation before step 1 is step 0's row). On a resumed run the
    history is the checkpoint's plus the new steps, so the curve covers the whole run."""
    rows: dict[int, dict[str, Any]] = {}
    for entry in log_history:
        if any(c in entry for c in CURVE_COLUMNS[1:]):
            rows.setdefault(int(entry["step"]), {}).update({c: entry[c] for c in CURVE_COLUMNS if c in entry})
    with atomic_writer(path) as f:
        out = csv.writer(f)
        out.writerow(CURVE_COLUMNS)
        for step in sorted(rows):
            out.writerow([rows[step].get(c, "") for c in CURVE_COLUMNS])
    return len(rows)


def train_rl(
    config: RLConfig,
    run_dir: str | Path,
    *,
    model: Any = None,
    tokenizer: Any = None,
    records: Sequence[Record] | None = None,
    retriever: Retriever | None = None,
    scorer: Any | None = None,
) -> Path:
    """Run the RL stage in ``run_dir``; return the saved policy folder ``run_dir/policy``.

    ``model``/``tokenizer`` (else ``config.policy``), ``records`` (else ``config.train_file``,
    minus ``config.exclude_ids_from``), ``retriever`` (else ``config.index``) and ``scorer``
    (else ``config.prm``, when ``process_reward="prm"``) can be passed in. Resumes from the last
    checkpoint in ``run_dir/checkpoints`` (raise ``max_steps`` to train further).
    """
    run = Path(run_dir)
    if records is None:
        if not config.train_file:
            raise ValueError("no RL questions: pass `records` or set `train_file`")
        records = read_records(config.train_file)
    before = len(records)
    screening = config.question_filter != "none"
    records = rl_records(records, excluded_ids(config.exclude_ids_from), None if screening else config.limit)
    if before != len(records):
        log.info("RL questions: %d of %d kept (exclusions and limit)", len(records), before)
    if not records:
        raise ValueError("no RL question left after the exclusions")
    if retriever is None:
        if not config.index:
            raise ValueError("no retriever: pass `retriever` or set `index`")
        from prorag.retrieval.index import open_retriever

        retriever = open_retriever(config.index)
    if model is None:
        if not config.policy:
            raise ValueError("no policy: pass `model` and `tokenizer` or set `policy`")
        from prorag.models.checkpoints import load_policy

        model, tokenizer = load_policy(config.policy, dtype=config.dtype)
    elif tokenizer is None:
        raise ValueError("a `model` needs its `tokenizer`")
    from prorag.supervision.step_rewards import LEARNED_PRM_SOURCES

    if config.process_reward in LEARNED_PRM_SOURCES and scorer is None and not config.prm and config.beta == 0:
        log.info("beta = 0 and no PRM: the outcome-only GRPO baseline (process_reward='none')")
        config = replace(config, process_reward="none")
    if config.uses_prm and scorer is None:
        from accelerate import PartialState

        # e.g. "prm": the PRM at config.prm, on this process's device
        scorer = STEP_REWARD_SOURCES.get(config.process_reward)(config, device=str(PartialState().device))

    run.mkdir(parents=True, exist_ok=True)  # only once the inputs passed their checks
    write_json(run / "rl_config.json", asdict(config))
    if screening:
        from accelerate import PartialState

        screened = config.screening_file or run / "screening.jsonl"
        # Under torchrun the main process screens and writes the rows; the others then find every
        # row they need in the file (same key) and keep the same questions without sampling.
        keys = screening_keys(config)
        with PartialState().main_process_first():
            records = screen_questions(
                records,
                model,
                tokenizer,
                retriever,
                config.rollout_config(),
                group_size=config.group_size,
                sample_seed=functools.partial(row_seed, config.seed, SCREENING_STEP),
                keep=config.limit,
                path=screened,
                key=keys[0],
                earlier_keys=keys[1:],
                progress=PartialState().is_main_process,
                strata=screening_strata(records, config.screening_strata) if config.screening_strata else None,
            )
        if not records:
            raise ValueError(f"question_filter={config.question_filter!r} kept no RL question (see {screened})")
    trainer = make_rl_trainer(config, run, model, tokenizer, records, retriever, scorer)
    resume_training(trainer, run, "RL")
    if config.select_policy == "best_dev" and trainer.is_world_process_zero():
        dev_eval = next(c for c in trainer.callback_handler.callbacks if isinstance(c, DevEvaluation))
        best = dev_eval.restore_best()
        log.info(
            "policy/ holds the weights of step %d (dev EM %.4f, the best of the evaluations at steps %s); "
            "the last step's stay in checkpoints/",
            best["step"],
            best["eval_em"],
            [e["step"] for e in dev_eval.evaluations],
        )
    out = run / "policy"
    if save_trained_policy(trainer, tokenizer, out, merge_lora=config.lora.enabled) is not None:
        write_learning_curve(trainer.state.log_history, run / "learning_curve.csv")
    return out


__all__ = [
    "CURVE_COLUMNS",
    "POLICY_SELECTIONS",
    "TRL_LOSS_TYPES",
    "DevEvaluation",
    "EngineRollout",
    "ProcessSupervisedGRPOTrainer",
    "RLConfig",
    "ScoredBatch",
    "excluded_ids",
    "generation_row_seeds",
    "k3_kl",
    "local_rows",
    "make_rl_trainer",
    "outcome",
    "outcome_reward_function",
    "rl_dataset",
    "rl_records",
    "rl_training_args",
    "row_seed",
    "score_batch",
    "screening_key",
    "screening_keys",
    "screening_strata",
    "dev_best",
    "dev_selection",
    "train_rl",
    "write_learning_curve",
]
