"""``prorag ablate --what family``: each method's arm is its own rewards and advantage on the one
trainer, everything else shared; the extra metrics' means and CIs are hand-checked; the report
shows them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import prorag.experiments.ablations as ablations
from prorag.core.errors import DataError
from prorag.experiments.pipeline import demo_config, stage_eval, stage_rl
from prorag.experiments.report.markdown import render_markdown
from prorag.experiments.report.table import process_tables
from tests.experiments.test_ablations import RecordingRun


def _run(tmp_path: Path) -> RecordingRun:
    run = RecordingRun(tmp_path, replace(demo_config(), seeds=[0, 1], process_seeds=[0, 1]), progress=lambda _: None)
    run.recorded = {}  # type: ignore[attr-defined]
    return run


def test_each_arm_is_its_method_and_nothing_else(tmp_path: Path) -> None:
    run = _run(tmp_path)
    configs = {arm: ablations.arm_config(run, a, 0) for arm, a in ablations.FAMILY_ARMS.items()}
    grpo = configs["grpo"]
    assert (grpo.process_reward, grpo.advantage, grpo.beta, grpo.outcome_reward.form) == ("none", "dual", 0.0, "paper")
    assert configs["hiprag"].outcome_reward.form == "hiprag" and configs["hiprag"].process_reward == "none"
    cp = configs["cpsearch"]
    assert (cp.process_reward, cp.advantage, cp.outcome_reward.form) == ("cpsearch", "cpgrpo", "f1_if_valid")
    assert configs["p2s"].outcome_reward.form == "p2s" and configs["p2s"].process_reward == "none"
    assert configs["prorag-oracle"].process_reward == "oracle" and configs["prorag-oracle"].beta == run.config.rl.beta
    shared = ("policy", "train_file", "seed", "max_steps", "learning_rate", "group_size", "rollout", "num_iterations")
    for arm, cfg in configs.items():
        assert all(getattr(cfg, k) == getattr(grpo, k) for k in shared), arm
    with pytest.raises(DataError, match="did you mean"):
        ablations.arm_config(run, ("process_rewrd=prm",), 0)


def test_family_ablation_reuses_the_systems_and_measures_the_extras(tmp_path: Path) -> None:
    pipeline = _run(tmp_path)
    stage_rl(pipeline)
    stage_eval(pipeline)
    run = _run(tmp_path)
    for seed, seconds in ((0, (2.0, 4.0)), (1, (5.0,))):  # a finished grpo run's log: 3 s and 5 s per step
        log = run.path("rl", f"grpo-seed{seed}", "metrics.jsonl")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(json.dumps({"step": i + 1, "step_time": t}) + "\n" for i, t in enumerate(seconds)))
    out = ablations.family_ablation(run, progress=lambda _: None)
    for seed in (0, 1):
        for arm in ("grpo", "prorag"):
            assert run.recorded[f"rl-{arm}-seed{seed}"] == pipeline.recorded[f"rl-{arm}-seed{seed}"]  # type: ignore[attr-defined]
    assert set(out["stats"]) == set(ablations.FAMILY_ARMS) | {"dpo"} and out["arms"]["dpo"] == ["offline"]
    # offline DPO: one training per seed from pi_sft on the pairs, tested like the RL arms
    assert {"dpo-seed0", "dpo-seed1", "eval-dpo-seed0", "eval-dpo-seed1"} <= set(run.recorded)  # type: ignore[attr-defined]
    assert run.recorded["dpo-seed0"] != run.recorded["dpo-seed1"]  # type: ignore[attr-defined]
    assert "seconds_per_rl_step" not in out["stats"]["dpo"] and out["stats"]["dpo"]["format_valid_rate"] == 1.0
    assert out["arms"]["cpsearch"] == ["process_reward=cpsearch", "advantage=cpgrpo", "outcome_reward.form=f1_if_valid"]
    grpo = out["stats"]["grpo"]
    # seconds per step: seed 0 mean 3, seed 1 mean 5 -> 4 ± t(0.975, 1) * sqrt(2) / sqrt(2) = 12.706205
    assert grpo["seconds_per_rl_step"] == pytest.approx(4.0) and grpo["seconds_per_rl_step_ci95"] == pytest.approx(12.706205)
    assert grpo["format_valid_rate"] == 1.0 and grpo["format_valid_rate_ci95"] == 0.0
    assert "over_search_rate" not in grpo  # the recorded evaluation did not measure it: not reported as 0
    assert "seconds_per_rl_step" not in out["stats"]["hiprag"]  # no log written for it
    [main, extras, *_] = process_tables(out)
    assert extras[1][:3] == ["Arm", "Format-valid (%)", "Searches"] and extras[1][-1] == "s / RL step"
    assert extras[2][0] == ["grpo", "100.0 ± 0.0", "2.00 ± 0.00", "4.00 ± 12.71"]
    report = render_markdown({"systems": {}, "order": [], "family_ablation": out}, [], [])
    assert "## The process-reward family on one trainer (family comparison)" in report
    assert "plots/family_curves.png" in report and "| cpsearch | process_reward=cpsearch advantage=cpgrpo" in report
