"""The demo's configs: the built-in world and the tiny model on a CPU, as YAML shipped inside the package.

``prorag/experiments/configs/demo.yaml`` (the full demo) is the one source of its settings;
``demo_quick.yaml`` names it as its base and holds only the smaller budgets (composed by
:func:`~prorag.core.config.load_config`). Both are package data, so ``prorag demo`` runs from an
installed wheel, and ``prorag pipeline --config`` takes either file.
"""

from __future__ import annotations

from pathlib import Path

from prorag.core.config import load_config
from prorag.experiments.pipeline.config import PipelineConfig

#: The folder of the demo's YAML files (package data of ``prorag.experiments``).
DEMO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def demo_config_file(quick: bool = False) -> Path:
    """The YAML file of the full demo, or of the quick one (``demo_quick.yaml``, overrides of the full one)."""
    return DEMO_CONFIGS / ("demo_quick.yaml" if quick else "demo.yaml")


def demo_config(quick: bool = False) -> PipelineConfig:
    """The demo's :class:`~prorag.experiments.pipeline.config.PipelineConfig`, read from :func:`demo_config_file`.

    The budgets are set for a 2-core machine: the full demo in about an hour, ``quick`` in about
    ten minutes. Learning rates are far above the paper's because the model is trained from
    scratch and is tiny; the YAML's comments say why each setting differs from its default.
    """
    return load_config(demo_config_file(quick), PipelineConfig)
