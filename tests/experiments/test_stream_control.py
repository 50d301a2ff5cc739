"""The stream control: each RL run's training EM against pi_rft sampled on the same questions (the
``frozen`` arm, learning rate 0), batch by batch, by hand; and ``stream_control: true`` in an arms
ablation runs that arm per seed without a test evaluation and reports every RL arm against it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import prorag.experiments.ablations as ablations
from prorag.experiments.pipeline import demo_config
from prorag.experiments.report.table import process_tables
from prorag.experiments.stream_control import FROZEN_ARM, stream_difference, stream_statistics, stream_table
from tests.experiments.test_ablations import RecordingRun


def _log(path: Path, ems: list[float]) -> Path:
    """A run's ``metrics.jsonl``: one training row per step with ``answer_em``, and a dev row."""
    rows = [{"step": s, "answer_em": em, "loss": 0.1} for s, em in enumerate(ems, start=1)] + [{"step": len(ems), "eval_em": 0.9}]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_stream_difference_pairs_rollout_batches_by_step() -> None:
    run = [{"step": 0, "eval_em": 0.9}] + [{"step": s, "answer_em": 0.5} for s in range(1, 9)]
    run[4]["eval_em"] = 0.8  # a dev evaluation logged in a training step's row: the row still counts
    control_em = [0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.5, 0.5]
    control = [{"step": s, "answer_em": v} for s, v in zip(range(1, 9), control_em, strict=True)]
    control.append({"step": 9, "answer_em": 1.0})  # a batch the run never reached is not paired
    d = stream_difference(run, control)
    assert d["batches"] == 8
    assert d["run_by_part"] == [0.5] * 4 and d["control_by_part"] == [0.5, 0.5, 0.25, 0.5]
    # second half, steps 5-8: differences 0.25 0.25 0 0, mean 0.125, t = 0.125 / (0.1443 / 2) = 1.732, df 3
    assert d["second_half_diff"] == 0.125 and d["second_half_p"] == pytest.approx(0.1817, abs=1e-3)
    with pytest.raises(ValueError, match="'reward'"):
        stream_difference(run, control, key="reward")


def test_stream_statistics_over_seeds_by_hand(tmp_path: Path) -> None:
    arm = {
        0: _log(tmp_path / "a0.jsonl", [0.5, 0.5, 0.5, 0.5]),
        1: _log(tmp_path / "a1.jsonl", [0.5, 0.5, 0.5, 0.5]),
        2: _log(tmp_path / "a2.jsonl", [0.5, 0.5, 0.5, 0.5]),  # no control run for seed 2: left out
    }
    frozen = {0: _log(tmp_path / "f0.jsonl", [0.5, 0.5, 0.25, 0.25]), 1: _log(tmp_path / "f1.jsonl", [0.5, 0.5, 0.5, 0.75])}
    stream = stream_statistics({"a": arm, "b": {0: arm[0]}}, frozen)
    a = stream["arms"]["a"]
    assert set(a["per_seed"]) == {"0", "1"}
    # seed 0: second-half differences 0.25 0.25 (identical, p 0); seed 1: 0 and -0.25, mean -0.125, t -1, df 1, p 0.5
    assert a["per_seed"]["0"]["second_half_diff"] == 0.25 and a["per_seed"]["0"]["second_half_p"] == 0.0
    assert a["per_seed"]["1"]["second_half_diff"] == -0.125 and a["per_seed"]["1"]["second_half_p"] == pytest.approx(0.5)
    # over seeds: 0.25 and -0.125, mean 0.0625, sd 0.2652, half-width 12.7062 * 0.2652 / sqrt(2) = 2.3824;
    # t = 0.0625 / 0.1875 = 1/3 on one degree of freedom (Cauchy): p = 1 - (2 / pi) atan(1/3) = 0.7952
    assert a["second_half_diff"] == pytest.approx(0.0625)
    assert a["second_half_ci95"] == pytest.approx(2.3824, abs=1e-3)
    assert a["second_half_p"] == pytest.approx(0.7952, abs=1e-3)
    assert "second_half_diff" not in stream["arms"]["b"]  # one seed: no interval
    text = stream_table(stream)
    assert "  a: +6.2 ± 238.2 (p=0.795); seeds +25.0, -12.5" in text and "  b: seeds +25.0" in text


def test_an_ablation_with_stream_control_runs_frozen_per_seed_and_reports_each_arm_against_it(tmp_path: Path) -> None:
    cfg = replace(demo_config(), seeds=[0, 1], process_seeds=[0, 1], stream_control=True)
    run = RecordingRun(tmp_path, cfg, progress=lambda _: None)
    run.recorded = {}  # type: ignore[attr-defined]
    for seed, (grpo, frozen) in enumerate([([0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.25, 0.25]), ([0.5] * 4, [0.5] * 4)]):
        _log(run.path("rl", f"grpo-seed{seed}", "metrics.jsonl"), grpo)
        _log(run.path("rl", f"{FROZEN_ARM}-seed{seed}", "metrics.jsonl"), frozen)
    out = ablations.process_ablation(run, progress=lambda _: None, only=["grpo", "prorag"])
    recorded = set(run.recorded)  # type: ignore[attr-defined]
    assert {f"rl-{FROZEN_ARM}-seed0", f"rl-{FROZEN_ARM}-seed1"} <= recorded
    assert not any(name.startswith(f"eval-{FROZEN_ARM}") for name in recorded)  # pi_rft's weights: no test run
    assert FROZEN_ARM not in out["stats"] and FROZEN_ARM not in out["arms"]
    frozen, grpo = (ablations.arm_config(run, a, 1) for a in (ablations.FROZEN_ASSIGNMENTS, ablations.PROCESS_ARMS["grpo"]))
    assert frozen.learning_rate == 0 and frozen.process_reward == "none"
    assert replace(frozen, learning_rate=grpo.learning_rate) == grpo  # the same run but the step size
    stream = out["stream"]["arms"]
    assert stream["grpo"]["per_seed"]["0"]["second_half_diff"] == 0.25 and stream["grpo"]["second_half_diff"] == 0.125
    assert stream["prorag"]["per_seed"] == {}  # its logs were not written here: nothing paired
    [table] = [t for t in process_tables(out) if t[0].startswith("Does RL learn?")]
    assert table[2] == [["grpo", "+12.5 ± 158.8 (p 0.500)", "+25.0, +0.0"], ["prorag", "", ""]]
    # without the setting: no frozen run, no stream
    plain = RecordingRun(tmp_path / "plain", replace(cfg, stream_control=False), progress=lambda _: None)
    plain.recorded = {}  # type: ignore[attr-defined]
    out = ablations.process_ablation(plain, progress=lambda _: None, only=["grpo"], seeds=[0, 1])
    assert "stream" not in out and not any(FROZEN_ARM in name for name in plain.recorded)  # type: ignore[attr-defined]


def test_an_extra_arm_may_not_take_the_controls_name() -> None:
    cfg = replace(demo_config(), extra_arms={FROZEN_ARM: ["learning_rate=0"]})
    with pytest.raises(ValueError, match=r"extra_arms.frozen: the name is the stream control's"):
        ablations.ablation_arms(cfg, "process")
