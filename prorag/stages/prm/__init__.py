"""Stage 2's last step: train the process reward model R_phi on judged step pairs (docs/METHOD.md §2, Eq. 4).

One module per job: :mod:`~prorag.stages.prm.config` (the settings), :mod:`~prorag.stages.prm.data`
(pairs and pointwise labels, checked, split by question, made into examples),
:mod:`~prorag.stages.prm.loss` (Eq. 4), :mod:`~prorag.stages.prm.trainer` (TRL's ``RewardTrainer``
with the PRM's read-out), :mod:`~prorag.stages.prm.audits` (rankings against the policy's own
likelihood), :mod:`~prorag.stages.prm.verdict` (``summary.json``) and :mod:`~prorag.stages.prm.run`
(the entry point, :func:`train_prm`). Every public name is importable from this package.

Two additions to the paper, both off by the settings that reproduce it: pointwise labels (the
judge's verdict on every judged node, ``pairs.pointwise.jsonl``) add a binary cross-entropy term
(``pointwise_weight``), and ``backbone_size`` gives the PRM a fresh built-in backbone of another
size than the policy's. The likelihood kind (``PRMConfig.kind``) trains the policy's LM head
through the same path.
"""

from prorag.stages.prm.audits import (
    SampledLikelihood,
    fresh_sample_audit,
    likelihood_baseline_metrics,
    pointwise_metrics,
    policy_step_likelihoods,
    step_ranking_audit,
)
from prorag.stages.prm.config import PRMConfig
from prorag.stages.prm.data import (
    PairCollator,
    PointStep,
    StepPair,
    check_vocabulary,
    pair_examples,
    pair_stage_inputs,
    parse_step_pair,
    point_examples,
    read_pointwise,
    read_step_pairs,
    split_by_question,
)
from prorag.stages.prm.loss import pair_metrics, pair_wins, pairwise_loss, prm_loss
from prorag.stages.prm.run import resolve_pointwise, train_prm
from prorag.stages.prm.trainer import (
    PairwiseRewardTrainer,
    ValidationSelection,
    held_out_scores,
    make_prm_trainer,
    prm_training_args,
)
from prorag.stages.prm.verdict import VERDICT_CHECKS, VERDICT_MARGIN, likelihood_verdict, write_prm_summary
from prorag.supervision.reward_model import separating_threshold

__all__ = [
    "PRMConfig",
    "PointStep",
    "VERDICT_CHECKS",
    "VERDICT_MARGIN",
    "likelihood_verdict",
    "point_examples",
    "pointwise_metrics",
    "prm_loss",
    "read_pointwise",
    "resolve_pointwise",
    "write_prm_summary",
    "PairCollator",
    "PairwiseRewardTrainer",
    "SampledLikelihood",
    "StepPair",
    "ValidationSelection",
    "check_vocabulary",
    "held_out_scores",
    "make_prm_trainer",
    "pair_examples",
    "pair_metrics",
    "pair_stage_inputs",
    "step_ranking_audit",
    "fresh_sample_audit",
    "likelihood_baseline_metrics",
    "pair_wins",
    "pairwise_loss",
    "policy_step_likelihoods",
    "parse_step_pair",
    "prm_training_args",
    "read_step_pairs",
    "separating_threshold",
    "split_by_question",
    "train_prm",
]
