"""The RL stage's settings: :class:`RLConfig`, one typed field per setting (YAML, ``--set``, ``--help``).

Defaults are the paper's (G = 8, beta = 0.3, 1 epoch) and its reference code's (PPO-clip 0.2, no
KL, lr 1e-5, LoRA r 16 alpha 32, 11 actions per trajectory); the rest follow TRL. Checks that
relate fields (``replay_only``, ``select_policy``) live in ``__post_init__``, so a YAML file,
``--set`` and code are refused alike.

The methods are named, not written in: ``process_reward``, ``advantage`` and ``outcome_reward.form``
pick from their registries, and a method registered with its own settings class has them in a
section of its name (``cpsearch.alpha``, ``outcome_reward.p2s.k``), added by
:func:`~prorag.core.config.method_settings`. Importing this module imports the supervision layer's
methods, which register themselves: the registries, in the method layer, cannot import them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from prorag.agent.rollout_config import RolloutConfig, check_gpu_share
from prorag.core.config import method_settings, setting
from prorag.core.setting_checks import check_temperature
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.method.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_SCALES,
    PROCESS_NORMS,
    AdvantageScale,
    ProcessNorm,
    scale_name,
)
from prorag.method.losses import (
    DEFAULT_CONTROL_LAMBDA,
    PPO_AGGREGATIONS,
    REDUCTIONS,
    WEIGHT_SCHEMES,
    PPOAggregation,
    Reduction,
    WeightScheme,
)
from prorag.method.rewards.outcome import OutcomeRewardConfig
from prorag.method.rewards.process import PRM_SCOPES, PRMScope, StepRewardConfig
from prorag.method.rewards.sources import STEP_REWARD_SOURCES
from prorag.stages.question_filter import QUESTION_FILTERS
from prorag.stages.training_config import LoRAConfig, TrainingConfig
from prorag.supervision import hiprag, p2s, step_rewards  # noqa: F401  (their methods register on import)

#: What ``policy/`` holds (:attr:`RLConfig.select_policy`).
POLICY_SELECTIONS: tuple[str, ...] = ("last", "best_dev")

#: Where TRL runs vLLM with ``rollout.backend: vllm`` (:attr:`RLConfig.vllm_mode`): in the training
#: processes, sharing their GPUs (``colocate``), or as a ``trl vllm-serve`` server on GPUs of its own.
VLLM_MODES: tuple[str, ...] = ("colocate", "server")

#: The least share of a GPU a colocated vLLM must leave to the trainer (the policy being trained, its
#: optimiser state and activations), and to the trainer with a learned PRM scored on the same GPU.
#: Rough floors for LoRA on an 8B policy on 80-141 GiB GPUs (docs/GPU.md), not guarantees: they refuse
#: the settings that cannot fit, not every one that will.
TRAINER_GPU_SHARE = 0.2
TRAINER_WITH_PRM_GPU_SHARE = 0.3


@dataclass
class SFTReplayConfig:
    """Settings of the SFT replay term (off by default: the paper's RL has none)."""

    file: str | None = setting(
        None,
        help="Gold trajectories to replay: the SFT stage's `sft_data/trajectories.jsonl`, or a record file of SFT "
        "questions rendered with the RL index. Keep it disjoint from the RL and evaluation questions. The pipeline "
        "and `prorag ablate` fill in their run's SFT trajectories when `coef` > 0 and this is unset.",
    )
    coef: float = setting(
        0.0,
        help="Weight of the replay loss in `L_RL + coef * L_SFT` (InstructGPT's ptx coefficient); 0 with a `file`: "
        "the replay loss is only measured and logged as `replay_nll`.",
    )
    batch_size: int = setting(16, help="Trajectories per replay batch (one batch per micro-batch of the RL loss).")
    limit: int | None = setting(None, help="Only the first N trajectories of `file`.")
    weight_scheme: WeightScheme = setting("reference", help="The format-aware loss's tag weights (as the SFT stage's).")
    control_lambda: float = setting(DEFAULT_CONTROL_LAMBDA, help="lambda of the `paper` weight scheme.")
    reduction: Reduction = setting("weighted_mean", help="The loss's reduction (as the SFT stage's).")
    max_length: int | None = setting(2048, help="Longer trajectories (prompt included) are dropped.")

    def __post_init__(self) -> None:
        if self.coef < 0:
            raise ValueError(f"SFTReplayConfig.coef must be >= 0, got {self.coef}")
        if self.batch_size < 1:
            raise ValueError(f"SFTReplayConfig.batch_size must be >= 1, got {self.batch_size}")
        if self.weight_scheme not in WEIGHT_SCHEMES:
            raise ValueError(f"SFTReplayConfig.weight_scheme must be one of {WEIGHT_SCHEMES}, got {self.weight_scheme!r}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"SFTReplayConfig.reduction must be one of {REDUCTIONS}, got {self.reduction!r}")

    @property
    def enabled(self) -> bool:
        """Whether the replay loss is computed at all (trained on with ``coef > 0``, else only logged).
        ``coef > 0`` without a ``file`` is refused when the trainer is built: the pipeline fills in
        its run's SFT trajectories (:func:`~prorag.experiments.pipeline.rl_replay`)."""
        return bool(self.file) or self.coef > 0


@method_settings(process_reward=STEP_REWARD_SOURCES, advantage=ADVANTAGE_ESTIMATORS)
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
        help="The engine's sampling settings (METHOD.md: 11 actions during RL; `temperature` > 0); its `seed` and "
        "`greedy` are not used: `seed` drives the sampling.",
    )

    vllm_mode: str = setting(
        "colocate",
        help="With `rollout.backend: vllm`: `colocate` runs TRL's vLLM engine in each training process, sharing "
        "its GPU (`rollout.vllm.gpu_memory_utilization` is vLLM's share); `server` drives a `trl vllm-serve` "
        "server on GPUs of its own (at `vllm_server_url`). Either way weight sync, sleep mode and LoRA are TRL's.",
    )
    vllm_server_url: str = setting("http://127.0.0.1:8000", help="`vllm_mode: server`: base URL of the `trl vllm-serve` server.")
    vllm_sleep_mode: bool = setting(
        False,
        help="`vllm_mode: colocate`: TRL's sleep mode, vLLM's weights and KV cache off the GPU during the optimiser "
        "step (less memory, slower steps).",
    )

    # --- rewards and advantages
    process_reward: str = setting(
        "prm",
        choices=STEP_REWARD_SOURCES,
        help="Where step rewards come from, a name in STEP_REWARD_SOURCES (a source's own settings sit in its "
        "section, e.g. `cpsearch.alpha`):",
    )
    advantage: str = setting(
        "dual",
        choices=ADVANTAGE_ESTIMATORS,
        help="How rewards become token advantages, a name in ADVANTAGE_ESTIMATORS:",
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
        "(faster scoring); with `packed_scoring`, packed rows per forward, fullest first, each forward cut to "
        "its fullest row. None (default): TRL's micro-batches as they come, as runs made before the setting "
        "existed did. Equal per step up to float rounding, which RL amplifies: runs whose numerics differ can "
        "end far apart, so compare runs with the same setting.",
    )
    packed_scoring: bool = setting(
        False,
        help="Padding-free scoring: every forward of the RL step (the loss, pi_old, pi_init for `beta_kl` and "
        "`kl_to_init`, the SFT replay) packs its trajectories end to end, each with its own positions, kept apart "
        "by a block-diagonal mask (sdpa, eager) or varlen flash attention, and scores the policy's tokens only "
        "(`scoring_rows` packed rows per forward). Off by default: it equals the padded path only up to float rounding "
        "(other matrix shapes; tests/stages/rl/test_packed_scoring.py), which RL amplifies, so runs made before "
        "it keep their numbers; compare runs with the same setting.",
    )
    packed_row_tokens: int | None = setting(
        None,
        help="With `packed_scoring` and a mask-building attention (sdpa, eager): tokens per packed row, the "
        "trajectories first-fit into rows this long (never shorter than the longest one); a row's attention "
        "costs its length squared, so rows stay short on CPU. None: the padded batch's width (fewer rows, none "
        "wider: never more work than padding). Flash attention takes the whole batch in one row.",
    )
    logprob_chunk: int | None = setting(
        None,
        help="Tokens per chunk of the LM head where the RL step computes log-probabilities without TRL's fused "
        "head (the SFT replay loss at a sampling temperature other than 1): only one chunk's logits (chunk x "
        "vocabulary) exist at a time, recomputed in the backward. None: the full logits, as before the setting "
        "(with `packed_scoring`: the labelled positions in one piece).",
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

    #: ``learning_rate`` 0 is the stream control of ``prorag ablate`` (the ``frozen`` arm).
    ZERO_LEARNING_RATE = "the frozen control, whose optimiser steps never move the weights"

    def __post_init__(self) -> None:
        super().__post_init__()
        STEP_REWARD_SOURCES.check(self.process_reward, "RLConfig.process_reward")
        ADVANTAGE_ESTIMATORS.check(self.advantage, "RLConfig.advantage")
        check_temperature(
            self.rollout.temperature,
            "RLConfig.rollout.temperature",
            needs_sampling="GRPO compares the G trajectories of a group, which greedy decoding makes one, "
            "and the trainer scores them at this temperature",
        )
        choices = {
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
        for name in ("packed_row_tokens", "logprob_chunk"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"RLConfig.{name} must be >= 1 (or null), got {getattr(self, name)}")
        if self.eval_every < 0:
            raise ValueError(f"RLConfig.eval_every must be >= 0, got {self.eval_every}")
        if self.replay_only and (self.advantage != "zero" or self.beta_kl != 0 or not self.sft_replay.coef > 0):
            raise ValueError(
                "RLConfig.replay_only trains on the replay alone, exactly as a run whose policy gradient is 0: it needs "
                f"advantage='zero' (got {self.advantage!r}), beta_kl=0 (got {self.beta_kl}) and sft_replay.coef > 0 "
                f"(got {self.sft_replay.coef})"
            )
        self._check_vllm()
        if self.select_policy == "best_dev" and not self.eval_every:
            # eval_file is checked when the trainer is built: the pipeline fills in its dev split
            raise ValueError("RLConfig.select_policy='best_dev' needs dev evaluations: set `eval_every` (> 0) and `eval_file`")

    def _check_vllm(self) -> None:
        """With ``rollout.backend: vllm``: a known ``vllm_mode``, one GPU per colocated engine, and a
        colocated engine that leaves the trainer (and a learned PRM) its share of the GPU."""
        if self.vllm_mode not in VLLM_MODES:
            raise ValueError(f"RLConfig.vllm_mode must be one of {VLLM_MODES}, got {self.vllm_mode!r}")
        if self.rollout.backend != "vllm" or self.vllm_mode != "colocate":
            return
        settings = self.rollout.vllm
        if settings.tensor_parallel_size != 1:
            raise ValueError(
                "RLConfig.rollout.vllm.tensor_parallel_size must be 1 with vllm_mode 'colocate' (each process drives its "
                f"own engine turn by turn), got {settings.tensor_parallel_size}; shard a larger policy with vllm_mode 'server'"
            )
        prm = self.process_reward in step_rewards.LEARNED_PRM_SOURCES
        share = TRAINER_WITH_PRM_GPU_SHARE if prm else TRAINER_GPU_SHARE
        beside = "the trainer and the PRM it scores with" if prm else "the trainer"
        check_gpu_share(settings, share, beside, "RLConfig", " (or use vllm_mode 'server')")

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
        evaluation harness's inference setting), the first ``eval_questions``; on the ``hf`` backend,
        which decodes the weights being trained as they are in memory."""
        return EvalConfig(
            limit=self.eval_questions, rollout=EvalRolloutConfig(**{**asdict(self.rollout), "greedy": True, "backend": "hf"})
        )


__all__ = [
    "POLICY_SELECTIONS",
    "TRAINER_GPU_SHARE",
    "TRAINER_WITH_PRM_GPU_SHARE",
    "VLLM_MODES",
    "RLConfig",
]
