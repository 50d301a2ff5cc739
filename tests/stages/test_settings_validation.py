"""Settings refused where they are declared (issue 70): sampling temperatures and top-p, learning
rates, and registry names (with the closest one suggested), from Python, YAML and ``--set`` alike,
and by the commands before anything is written (exit 2, one line naming the field)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prorag.agent.rollout_config import RolloutConfig
from prorag.cli import app
from prorag.core.config import apply_overrides, load_config
from prorag.core.errors import DataError
from prorag.evaluation.eval_config import EvalConfig
from prorag.method.rewards.outcome import OutcomeRewardConfig
from prorag.stages.dpo_config import DPOConfig
from prorag.stages.mcts import MCTSConfig
from prorag.stages.prm import PRMConfig
from prorag.stages.rft_config import RFTConfig
from prorag.stages.rl import RLConfig
from prorag.stages.sft_config import SFTConfig, SFTTrainingConfig

runner = CliRunner()


# ----------------------------------------------------------------------------- learning rates


@pytest.mark.parametrize("cls", [SFTConfig, PRMConfig, DPOConfig, RLConfig])
@pytest.mark.parametrize("value", [math.nan, -1.0, math.inf, -math.inf])
def test_every_training_stage_refuses_a_learning_rate_that_is_not_finite_and_positive(cls: type, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{cls.__name__}.learning_rate must be a finite number >"):
        cls(learning_rate=value)


@pytest.mark.parametrize("cls", [SFTConfig, PRMConfig, DPOConfig])
def test_a_learning_rate_of_zero_is_refused_except_as_rls_frozen_control(cls: type) -> None:
    with pytest.raises(ValueError, match=rf"^{cls.__name__}.learning_rate must be a finite number > 0, got 0"):
        cls(learning_rate=0.0)
    with pytest.raises(ValueError, match=r"^SFTTrainingConfig.learning_rate must be a finite number > 0"):
        RFTConfig(train=SFTTrainingConfig(learning_rate=0.0))
    assert apply_overrides(RLConfig(), ["learning_rate=0"]).learning_rate == 0.0  # prorag ablate's `frozen` arm


def test_a_yaml_learning_rate_of_nan_is_refused_with_the_file_named(tmp_path: Path) -> None:
    config = tmp_path / "sft.yaml"
    config.write_text("max_steps: 2\nlearning_rate: .nan\n")
    with pytest.raises(DataError, match=rf"^{config}:2: field 'learning_rate': expected a number, not NaN, got float nan$"):
        load_config(config, SFTConfig)


# ----------------------------------------------------------------------------- sampling settings of the stages


def test_stages_that_must_sample_refuse_temperature_zero_and_the_others_decode_greedily() -> None:
    cold = RolloutConfig(temperature=0.0)
    with pytest.raises(ValueError, match=r"^RLConfig.rollout.temperature must be > 0 \(GRPO compares"):
        RLConfig(rollout=cold)
    with pytest.raises(ValueError, match=r"^MCTSConfig.rollout.temperature must be > 0 \(an expansion samples K actions"):
        MCTSConfig(rollout=cold)
    assert RFTConfig(rollout=cold).rollout.decodes_greedily
    assert apply_overrides(EvalConfig(), ["rollout.greedy=false", "rollout.temperature=0"]).rollout.decodes_greedily


def test_nested_rollout_settings_are_refused_from_set_and_yaml(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^--set rollout.top_p=1.5: RolloutConfig.top_p must be in \(0, 1\]"):
        apply_overrides(RLConfig(), ["rollout.top_p=1.5"])
    with pytest.raises(DataError, match=r"^--set rl.rollout.temperature=-1: RolloutConfig.temperature must be a finite"):
        from prorag.experiments.pipeline import PipelineConfig

        apply_overrides(PipelineConfig(), ["rl.rollout.temperature=-1"])
    config = tmp_path / "mcts.yaml"
    config.write_text("simulations: 4\nrollout:\n  temperature: -0.5\n")
    with pytest.raises(DataError, match=rf"^{config}:2: field 'rollout'.*RolloutConfig.temperature must be a finite number >= 0"):
        load_config(config, MCTSConfig)


# ----------------------------------------------------------------------------- registry names


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (
            lambda: RLConfig(process_reward="orcale"),
            r"RLConfig.process_reward: unknown step reward source 'orcale'; expected one of \['none', 'prm'.*\]; "
            r"did you mean 'oracle'\?",
        ),
        (
            lambda: RLConfig(advantage="dula"),
            r"RLConfig.advantage: unknown advantage estimator 'dula'; expected one of \[.*\]; did you mean 'dual'\?",
        ),
        (
            lambda: OutcomeRewardConfig(form="papr"),
            r"OutcomeRewardConfig.form: unknown outcome reward 'papr'; expected one of \[.*\]; did you mean 'paper'\?",
        ),
        (
            lambda: EvalConfig(baseline="standard_rag"),
            r"EvalConfig.baseline: unknown evaluation baseline 'standard_rag'; expected one of \[.*\]; "
            r"did you mean 'standard-rag'\?",
        ),
        (
            lambda: PRMConfig(kind="haed"),
            r"PRMConfig.kind: unknown reward model kind 'haed'; expected one of \[.*\]; did you mean 'head'\?",
        ),
    ],
)
def test_registry_names_say_did_you_mean(make: object, expected: str) -> None:
    with pytest.raises(ValueError, match=rf"^{expected}$"):
        make()  # type: ignore[operator]


def test_table1_names_say_did_you_mean() -> None:
    from prorag.experiments.table1 import BenchmarkSpec, SystemSpec

    with pytest.raises(ValueError, match=r"^SystemSpec.baseline: unknown evaluation baseline 'naiv'; .*did you mean 'naive'\?$"):
        SystemSpec(baseline="naiv")
    with pytest.raises(
        ValueError, match=r"^BenchmarkSpec.format: unknown benchmark format 'musiqe'; .*did you mean 'musique'\?$"
    ):
        BenchmarkSpec(path="x", format="musiqe")


# ----------------------------------------------------------------------------- the commands


@pytest.fixture
def records(tmp_path: Path) -> Path:
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"id": "1", "question": "Who?", "golden_answers": ["Ada"]}) + "\n")
    return path


def refused(args: list[str], expected: str) -> str:
    """``prorag ARGS`` ends with exit code 2 and one line, ``error: ...`` holding ``expected``."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (
            ["--set", "rollout.temperature=-1"],
            "--set rollout.temperature=-1: RolloutConfig.temperature must be a finite number >= 0",
        ),
        (["--set", "rollout.temperature=0"], "RLConfig.rollout.temperature must be > 0"),
        (
            ["--set", "rollout.top_p=1.5"],
            "--set rollout.top_p=1.5: RolloutConfig.top_p must be in (0, 1] (1.0: no nucleus cut), got 1.5",
        ),
        (["--set", "learning_rate=nan"], "--set learning_rate=nan: field 'learning_rate': expected a number, not NaN"),
        (["--set", "rl.learning_rate=-1"], "RLConfig.learning_rate must be a finite number >= 0 (0: the frozen control"),
        (
            ["--set", "process_reward=orcale"],
            "--set process_reward=orcale: RLConfig.process_reward: unknown step reward source 'orcale'; expected one of [",
        ),
        (["--set", "advantage=dula"], "unknown advantage estimator 'dula'; expected one of ["),
        (["--advantage", "dula"], "--advantage: RLConfig.advantage: unknown advantage estimator 'dula'"),
    ],
)
def test_rl_refuses_bad_settings_before_writing_anything(option: list[str], expected: str, records: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    common = ["--policy", str(tmp_path / "policy"), "--data", str(records), "-i", str(tmp_path / "index")]
    line = refused(["rl", *common, "--run-dir", str(run), *option], expected)
    if "orcale" in option[-1] or "dula" in option[-1]:
        assert line.endswith(f"did you mean '{'oracle' if 'orcale' in option[-1] else 'dual'}'?")
    assert not (run / "rl_config.json").exists() and not (run / "checkpoints").exists() and not run.exists()


@pytest.mark.parametrize("value", ["nan", "-1", "0"])
def test_sft_refuses_a_bad_learning_rate_before_writing_anything(value: str, records: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["sft", "--trajectories", str(records), "--run-dir", str(run), "--set", f"learning_rate={value}"]
    expected = (
        "field 'learning_rate': expected a number, not NaN"
        if value == "nan"
        else "SFTConfig.learning_rate must be a finite number > 0"
    )
    refused(args, f"--set learning_rate={value}: {expected}")
    assert not run.exists()


def test_eval_refuses_a_negative_temperature_before_writing_anything(records: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    args = ["eval", "--policy", "p", "--data", str(records), "-i", str(tmp_path / "index"), "--out", str(out)]
    refused([*args, "--set", "rollout.temperature=-1"], "EvalRolloutConfig.temperature must be a finite number >= 0")
    assert not out.exists()
