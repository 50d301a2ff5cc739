"""The command line's shared convention: ``--config``/``--set`` on every stage command, one error line."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from prorag.cli import app
from prorag.cli.options import ConfigSource


def test_set_works_the_same_on_two_commands_with_or_without_the_section(tmp_path: Path) -> None:
    yaml_file = tmp_path / "rl.yaml"
    yaml_file.write_text("beta: 0.1\nseed: 4\n")
    rl = ConfigSource("prorag.stages.rl:RLConfig", "rl", yaml_file, ("rl.beta=0.5",), {"--seed": "seed"})
    cfg = rl.load({"--seed": 7})
    assert (cfg.beta, cfg.seed) == (0.5, 7)  # file < shortcut < --set
    sft = ConfigSource("prorag.stages.sft:SFTConfig", "sft", None, ("learning_rate=3e-3",), {})
    assert sft.load().learning_rate == 0.003
    pipe = ConfigSource("prorag.experiments.pipeline:PipelineConfig", "pipeline", None, ("rl.beta=0.5", "mcts.simulations=7"), {})
    assert (pipe.load().rl.beta, pipe.load().mcts.simulations) == (0.5, 7)


def test_unknown_set_key_exits_2_with_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    for args in (
        ["rl", "--policy", "p", "--data", "d", "--index", "i", "--run-dir", str(tmp_path), "--set", "rl.btea=0.5"],
        ["sft", "--run-dir", str(tmp_path), "--set", "learnig_rate=1"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "did you mean" in lines[0], result.output


def test_rl_help_lists_fields() -> None:
    result = CliRunner().invoke(app, ["rl", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # the name column's padding collapsed
    assert "beta (float, default 0.3)" in text and "--set" in text
