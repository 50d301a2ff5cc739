"""The RL stage's entry point. :func:`train_rl` reads the questions, the policy, the retriever and
the step-reward source the config names, screens the questions (``question_filter``), builds the
trainer (:func:`make_rl_trainer`), trains (resuming from the last checkpoint) and saves.

Writes ``rl_config.json``, ``checkpoints/``, ``metrics.jsonl``, ``learning_curve.csv``, ``policy/``
(and ``dev_eval/step-N/`` with ``eval_every``, ``screening.jsonl`` with ``question_filter``); with
``select_policy: best_dev``, ``policy/`` holds the dev-best weights (:mod:`~prorag.stages.rl.dev_eval`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from trl import GRPOConfig

from prorag.agent.context_budget import drop_over_long
from prorag.data.jsonl import write_json
from prorag.data.records import Record, read_records
from prorag.method.advantages import (
    scale_name,
)
from prorag.method.rewards.sources import STEP_REWARD_SOURCES
from prorag.retrieval.base import Retriever
from prorag.stages.question_filter import SCREENING_STEP, screen_questions
from prorag.stages.rl.config import RLConfig
from prorag.stages.rl.dev_eval import DevEvaluation
from prorag.stages.rl.learning_curve import write_learning_curve
from prorag.stages.rl.questions import excluded_ids, rl_dataset, rl_records, screening_keys, screening_strata
from prorag.stages.rl.rewards import outcome
from prorag.stages.rl.rollouts import EngineRollout, row_seed
from prorag.stages.rl.trainer import ProcessSupervisedGRPOTrainer
from prorag.stages.sft_replay import load_replay
from prorag.stages.training import MetricsFile, resume_training, save_trained_policy, time_budget

log = logging.getLogger(__name__)

#: TRL's ``loss_type`` computing each :func:`~prorag.method.losses.ppo_clip_loss` aggregation.
TRL_LOSS_TYPES: dict[str, str] = {"token_mean": "dapo", "sequence_mean": "grpo", "sum": "dr_grpo"}


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
        **trl_vllm_arguments(config),
    )


def trl_vllm_arguments(config: RLConfig) -> dict[str, Any]:
    """TRL's vLLM settings for ``rollout.backend: vllm`` (none otherwise): ``use_vllm`` in
    ``config.vllm_mode``, so that TRL builds the engine (colocated) or the client of ``trl vllm-serve``,
    syncs the weights after each optimiser step (LoRA merged), sleeps it if asked, and corrects the
    loss by the importance ratio between the trained policy and the sampler's log-probabilities
    (which the rollouts return); the rollout loop then drives that engine (:class:`EngineRollout`)."""
    if config.rollout.backend != "vllm":
        return {}
    settings = config.rollout.vllm
    return {
        "use_vllm": True,
        "vllm_mode": config.vllm_mode,
        "vllm_server_base_url": config.vllm_server_url if config.vllm_mode == "server" else None,
        "vllm_tensor_parallel_size": settings.tensor_parallel_size,
        "vllm_gpu_memory_utilization": settings.gpu_memory_utilization,
        "vllm_max_model_length": settings.max_model_len,
        "vllm_enable_sleep_mode": config.vllm_sleep_mode,
        "vllm_importance_sampling_correction": True,
    }


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
    callbacks: list[TrainerCallback] = [MetricsFile(run / "metrics.jsonl"), *time_budget(config)]
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
    records = drop_over_long(records, model, tokenizer, config.rollout_config(), "RL")
    if not records:
        raise ValueError("no RL question fits the policy's context (see the warning above)")
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
                replace(config.rollout_config(), backend="hf"),  # before TRL builds its vLLM engine: on the model in memory
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
    "TRL_LOSS_TYPES",
    "make_rl_trainer",
    "rl_training_args",
    "train_rl",
    "trl_vllm_arguments",
]
