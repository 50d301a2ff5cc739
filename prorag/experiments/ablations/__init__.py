"""The paper's ablations on a pipeline run folder (``prorag ablate``), and the arms comparisons they share with ``prorag compare``.

One module per job: :mod:`.arms` (the arms and their checks), :mod:`.runs` (a variant as stages of the
run folder), :mod:`.sweeps` (beta, top-k), :mod:`.arms_runner` (the process and family ablations),
:mod:`.comparison` (their statistics), :mod:`.contrasts` (primary contrasts and Holm-adjusted p-values),
:mod:`.table` (the console table) and :mod:`.command` (``run_ablation``, the command's entry point).
Every public name is importable from this package, as it was from the single module it replaces.
"""

from __future__ import annotations

from prorag.evaluation.step_errors import STEP_VALIDITY_RATES
from prorag.experiments.ablations import arms, arms_runner, command, comparison, contrasts, runs, sweeps, table
from prorag.experiments.ablations.arms import (
    CONTROLS,
    FAMILY_ARMS,
    FAMILY_OFFLINE,
    HELD_FIXED,
    PROCESS_ARMS,
    Arm,
    ArmSet,
    ablation_arms,
    arm_config,
    select_arms,
)
from prorag.experiments.ablations.arms_runner import (
    arms_ablation,
    family_ablation,
    process_ablation,
    worker_main,
    write_arms_results,
)
from prorag.experiments.ablations.command import ABLATIONS, Ablation, run_ablation
from prorag.experiments.ablations.comparison import (
    FAMILY_METRICS,
    PAIRED_OVER_SEEDS,
    PROCESS_METRICS,
    TEST_KINDS,
    TRAINING_SIGNALS,
    process_statistics,
    read_evaluation,
    training_signals,
)
from prorag.experiments.ablations.runs import dpo_policy, evaluate_on_test, train_and_test, train_rl_policy
from prorag.experiments.ablations.sweeps import (
    BETAS,
    TOP_KS,
    beta_sweep,
    significance,
    summarise_variant,
    sweep_variant,
    topk_sweep,
)
from prorag.experiments.ablations.table import process_table
from prorag.experiments.stream_control import FROZEN_ARM, FROZEN_ASSIGNMENTS

__all__ = [
    "ABLATIONS",
    "Ablation",
    "Arm",
    "ArmSet",
    "BETAS",
    "CONTROLS",
    "FAMILY_ARMS",
    "FAMILY_METRICS",
    "FAMILY_OFFLINE",
    "FROZEN_ARM",
    "FROZEN_ASSIGNMENTS",
    "HELD_FIXED",
    "PAIRED_OVER_SEEDS",
    "PROCESS_ARMS",
    "PROCESS_METRICS",
    "STEP_VALIDITY_RATES",
    "TEST_KINDS",
    "TOP_KS",
    "TRAINING_SIGNALS",
    "ablation_arms",
    "arm_config",
    "arms",
    "arms_ablation",
    "arms_runner",
    "beta_sweep",
    "command",
    "comparison",
    "contrasts",
    "dpo_policy",
    "evaluate_on_test",
    "family_ablation",
    "process_ablation",
    "process_statistics",
    "process_table",
    "read_evaluation",
    "run_ablation",
    "runs",
    "select_arms",
    "significance",
    "summarise_variant",
    "sweep_variant",
    "sweeps",
    "table",
    "topk_sweep",
    "train_and_test",
    "train_rl_policy",
    "training_signals",
    "worker_main",
    "write_arms_results",
]
