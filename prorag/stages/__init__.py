"""The training stages of ProRAG (METHOD.md section 2), one module each.

* :mod:`prorag.stages.sft`: stage 1, supervised policy warm-up with the format-aware loss
  (gold trajectories -> ``pi_sft``).

Every stage reads and writes plain files in one run directory (a resolved config, JSONL
metrics, safetensors checkpoints), resumes from its last checkpoint after a crash, and ends
with a policy folder that :func:`prorag.models.checkpoints.load_policy` loads.
"""
