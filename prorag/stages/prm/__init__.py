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

from __future__ import annotations

from prorag.core.lazy_modules import lazy_exports

#: Each public name -> the module that defines it, imported when the name is first read (so that
#: importing one submodule, e.g. the config for ``--help``, does not import the others).
_EXPORTS: dict[str, str] = {
    "SampledLikelihood": "prorag.stages.prm.audits",
    "fresh_sample_audit": "prorag.stages.prm.audits",
    "likelihood_baseline_metrics": "prorag.stages.prm.audits",
    "pointwise_metrics": "prorag.stages.prm.audits",
    "policy_step_likelihoods": "prorag.stages.prm.audits",
    "step_ranking_audit": "prorag.stages.prm.audits",
    "PRMConfig": "prorag.stages.prm.config",
    "PairCollator": "prorag.stages.prm.data",
    "PointStep": "prorag.stages.prm.data",
    "StepPair": "prorag.stages.prm.data",
    "check_vocabulary": "prorag.stages.prm.data",
    "pair_examples": "prorag.stages.prm.data",
    "pair_stage_inputs": "prorag.stages.prm.data",
    "parse_step_pair": "prorag.stages.prm.data",
    "point_examples": "prorag.stages.prm.data",
    "read_pointwise": "prorag.stages.prm.data",
    "read_step_pairs": "prorag.stages.prm.data",
    "split_by_question": "prorag.stages.prm.data",
    "pair_metrics": "prorag.stages.prm.loss",
    "pair_wins": "prorag.stages.prm.loss",
    "pairwise_loss": "prorag.stages.prm.loss",
    "prm_loss": "prorag.stages.prm.loss",
    "resolve_pointwise": "prorag.stages.prm.run",
    "train_prm": "prorag.stages.prm.run",
    "PairwiseRewardTrainer": "prorag.stages.prm.trainer",
    "ValidationSelection": "prorag.stages.prm.trainer",
    "held_out_scores": "prorag.stages.prm.trainer",
    "make_prm_trainer": "prorag.stages.prm.trainer",
    "prm_training_args": "prorag.stages.prm.trainer",
    "VERDICT_CHECKS": "prorag.stages.prm.verdict",
    "VERDICT_MARGIN": "prorag.stages.prm.verdict",
    "likelihood_verdict": "prorag.stages.prm.verdict",
    "write_prm_summary": "prorag.stages.prm.verdict",
    "separating_threshold": "prorag.supervision.reward_model",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

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
