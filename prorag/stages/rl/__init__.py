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

from prorag.method.rewards.sources import STEP_REWARD_SOURCES  # re-exported: scripts reach the sources through the stage
from prorag.stages.rl.config import POLICY_SELECTIONS, RLConfig
from prorag.stages.rl.dev_eval import DevEvaluation, dev_best, dev_selection
from prorag.stages.rl.learning_curve import CURVE_COLUMNS, write_learning_curve
from prorag.stages.rl.questions import excluded_ids, rl_dataset, rl_records, screening_key, screening_keys, screening_strata
from prorag.stages.rl.rewards import ScoredBatch, outcome, outcome_reward_function, score_batch
from prorag.stages.rl.rollouts import EngineRollout, generation_row_seeds, local_rows, row_seed
from prorag.stages.rl.run import TRL_LOSS_TYPES, make_rl_trainer, rl_training_args, train_rl
from prorag.stages.rl.trainer import ProcessSupervisedGRPOTrainer, compact_fused_head, k3_kl, length_sorted_groups, trl_reference

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
