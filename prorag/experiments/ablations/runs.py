"""One variant of an ablation as stages of the pipeline's run folder: train it, evaluate it on test.

Each stage has a ``stages/NAME.json`` marker (:class:`~prorag.experiments.pipeline.Run`), so an ablation
reuses SFT, the PRM and RFT, skips any run already done with the same settings, and resumes after a kill.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from prorag.experiments.pipeline import Run


def evaluate_on_test(run: Run, name: str, policy: str, ev: Any) -> Path:
    """Stage ``eval-NAME``: ``policy`` on the test split with ``ev``; returns ``eval/NAME``."""
    from prorag.evaluation.runner import evaluate_files

    ev_dir = run.path("eval", name)
    run.stage(
        f"eval-{name}",
        ev,
        lambda: evaluate_files(policy, run.path("splits", "test.jsonl"), str(run.path("index")), ev_dir, ev, device=run.device),
    )
    return ev_dir


def train_rl_policy(run: Run, name: str, rl_cfg: Any) -> str:
    """Stage ``rl-NAME``: RL with ``rl_cfg`` into ``rl/NAME`` (skipped when done with the same
    settings, so an ablation reuses any run of the same name and config); returns its policy."""
    from prorag.stages.rl import train_rl

    run.stage(f"rl-{name}", rl_cfg, lambda: train_rl(rl_cfg, run.path("rl", name)))
    return str(run.path("rl", name, "policy"))


def train_and_test(run: Run, name: str, rl_cfg: Any, ev: Any) -> Path:
    """:func:`train_rl_policy`, then :func:`evaluate_on_test` of its policy; returns ``eval/NAME``."""
    return evaluate_on_test(run, name, train_rl_policy(run, name, rl_cfg), ev)


def dpo_policy(run: Run, seed: int) -> str:
    """The family's ``dpo`` arm: offline DPO of pi_sft on the run's judged MCTS pairs with the
    config's ``dpo`` settings and ``seed`` (stage ``dpo-seedS``, ``policies/dpo-seedS``). It is
    the ReasonRAG-style baseline: process supervision without RL, from pi_sft as in the paper."""
    from prorag.stages.dpo import train_dpo

    cfg = replace(
        run.config.dpo,
        pairs_file=str(run.path("pairs", "pairs.jsonl")),
        init=str(run.path("policies", "sft", "policy")),
        seed=seed,
    )
    out = run.path("policies", f"dpo-seed{seed}")
    run.stage(f"dpo-seed{seed}", cfg, lambda: train_dpo(cfg, out))
    return str(out / "policy")
