"""Stage 4 of ProRAG: GRPO with the dual-granularity advantage (docs/METHOD.md §2, Eq. 5-9) -> ``pi_theta``.

Each question gets G trajectories from the rollout engine; an outcome reward each (Eq. 6) and a
step reward per action (Eq. 5, from a step-reward source: the frozen PRM by default), standardised
in the group and combined per token as ``A = A_out + beta * A_proc`` (Eq. 7-8), zero on retrieved
tokens; PPO-clip, no value net, no KL by default (Eq. 9). ``process_reward="none"`` (or beta 0) is
the outcome-only GRPO baseline on the same code.

One job per module: :mod:`.config` (the settings), :mod:`.questions` (which questions),
:mod:`.rollouts` (the engine as TRL's ``rollout_func``), :mod:`.rewards` (a batch's rewards),
:mod:`.trainer` (the GRPO trainer), :mod:`.dev_eval` (dev evaluations and the dev-best policy),
:mod:`.learning_curve` and :mod:`.run` (:func:`train_rl`, the entry point). Their public names
are importable from here.
"""

from __future__ import annotations

from prorag.core.lazy_modules import lazy_exports

#: Each public name -> the module that defines it, imported when the name is first read (so that
#: importing one submodule, e.g. the config for ``--help``, does not import the others).
_EXPORTS: dict[str, str] = {
    "STEP_REWARD_SOURCES": "prorag.method.rewards.sources",
    "POLICY_SELECTIONS": "prorag.stages.rl.config",
    "RLConfig": "prorag.stages.rl.config",
    "DevEvaluation": "prorag.stages.rl.dev_eval",
    "dev_best": "prorag.stages.rl.dev_eval",
    "dev_selection": "prorag.stages.rl.dev_eval",
    "CURVE_COLUMNS": "prorag.stages.rl.learning_curve",
    "write_learning_curve": "prorag.stages.rl.learning_curve",
    "excluded_ids": "prorag.stages.rl.questions",
    "rl_dataset": "prorag.stages.rl.questions",
    "rl_records": "prorag.stages.rl.questions",
    "screening_key": "prorag.stages.rl.questions",
    "screening_keys": "prorag.stages.rl.questions",
    "screening_strata": "prorag.stages.rl.questions",
    "ScoredBatch": "prorag.stages.rl.rewards",
    "outcome": "prorag.stages.rl.rewards",
    "outcome_reward_function": "prorag.stages.rl.rewards",
    "score_batch": "prorag.stages.rl.rewards",
    "EngineRollout": "prorag.stages.rl.rollouts",
    "generation_row_seeds": "prorag.stages.rl.rollouts",
    "local_rows": "prorag.stages.rl.rollouts",
    "row_seed": "prorag.stages.rl.rollouts",
    "TRL_LOSS_TYPES": "prorag.stages.rl.run",
    "make_rl_trainer": "prorag.stages.rl.run",
    "rl_training_args": "prorag.stages.rl.run",
    "train_rl": "prorag.stages.rl.run",
    "ProcessSupervisedGRPOTrainer": "prorag.stages.rl.trainer",
    "compact_fused_head": "prorag.stages.rl.trainer",
    "k3_kl": "prorag.stages.rl.trainer",
    "length_sorted_groups": "prorag.stages.rl.trainer",
    "trl_reference": "prorag.stages.rl.trainer",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "CURVE_COLUMNS",
    "DevEvaluation",
    "EngineRollout",
    "POLICY_SELECTIONS",
    "ProcessSupervisedGRPOTrainer",
    "RLConfig",
    "STEP_REWARD_SOURCES",
    "ScoredBatch",
    "TRL_LOSS_TYPES",
    "compact_fused_head",
    "dev_best",
    "dev_selection",
    "excluded_ids",
    "generation_row_seeds",
    "k3_kl",
    "length_sorted_groups",
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
    "train_rl",
    "trl_reference",
    "write_learning_curve",
]
