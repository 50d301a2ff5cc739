"""The whole method in one run folder: data -> index -> SFT -> MCTS -> pairs -> PRM -> RFT -> RL ->
evaluation -> report, with the baselines and ablation variants of the paper's Table 2.

One module per job: :mod:`~prorag.experiments.pipeline.config` (:class:`PipelineConfig`, the systems),
:mod:`~prorag.experiments.pipeline.splits` (the question splits), :mod:`~prorag.experiments.pipeline.run_folder`
(:class:`Run`: stage markers and fingerprints), :mod:`~prorag.experiments.pipeline.stages` (one function per
stage), :mod:`~prorag.experiments.pipeline.results` (``results.json`` and the table),
:mod:`~prorag.experiments.pipeline.run` (:func:`run_pipeline`) and :mod:`~prorag.experiments.pipeline.demo`
(the demo's YAML configs). Every public name is importable from this package.
"""

from prorag.experiments.pipeline.config import (
    DEFAULT_SYSTEMS,
    LABELS,
    RL_SYSTEMS,
    SPLIT_MODES,
    SYSTEMS,
    TRAIN_SPLITS,
    DataConfig,
    IndexConfig,
    PipelineConfig,
    SplitMode,
    System,
    non_default_fields,
    resolve,
    stage_device,
    write_resolved_config,
)
from prorag.experiments.pipeline.demo import demo_config, demo_config_file
from prorag.experiments.pipeline.results import collect_results, results_table, stage_summaries
from prorag.experiments.pipeline.run import run_pipeline
from prorag.experiments.pipeline.run_folder import CONFIG_SCHEMA, Run, eval_dir_name, fingerprint, rl_run_name
from prorag.experiments.pipeline.splits import (
    Splits,
    plan_splits,
    question_key,
    share_counts,
    split_questions,
    split_unit,
    write_records,
)
from prorag.experiments.pipeline.stages import (
    _data_files as _data_files,  # a benchmark and the tests build a run's stages one by one
)
from prorag.experiments.pipeline.stages import (
    audit_prm,
    rl_config,
    rl_dev_file,
    rl_replay,
    stage_eval,
    stage_index,
    stage_prm,
    stage_rft,
    stage_rl,
    stage_sft,
    stage_splits,
    stage_world,
    system_eval_config,
)

__all__ = [
    "CONFIG_SCHEMA",
    "LABELS",
    "RL_SYSTEMS",
    "DEFAULT_SYSTEMS",
    "SYSTEMS",
    "DataConfig",
    "IndexConfig",
    "PipelineConfig",
    "Run",
    "collect_results",
    "audit_prm",
    "demo_config",
    "demo_config_file",
    "fingerprint",
    "rl_config",
    "rl_dev_file",
    "rl_replay",
    "system_eval_config",
    "non_default_fields",
    "resolve",
    "results_table",
    "run_pipeline",
    "SPLIT_MODES",
    "Splits",
    "plan_splits",
    "question_key",
    "share_counts",
    "split_questions",
    "split_unit",
    "stage_device",
    "System",
    "SplitMode",
    "TRAIN_SPLITS",
    "write_resolved_config",
    "stage_summaries",
    "eval_dir_name",
    "rl_run_name",
    "write_records",
    "stage_eval",
    "stage_index",
    "stage_prm",
    "stage_rft",
    "stage_rl",
    "stage_sft",
    "stage_splits",
    "stage_world",
]
