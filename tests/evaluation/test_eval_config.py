"""The evaluation's settings (prorag/evaluation/eval_config.py): the served block is checked when
the config is built, key by key, as a YAML file, ``--set`` and Python give it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prorag.cli import app
from prorag.core.config import apply_overrides
from prorag.core.errors import DataError
from prorag.evaluation.eval_config import EvalConfig, GeneratorConfig


def test_served_keys_set_one_at_a_time_are_kept() -> None:
    cfg = apply_overrides(EvalConfig(), ["generator.served.timeout_s=5", "generator.served.base_url=http://127.0.0.1:9/v1"])
    assert cfg.generator.served == {"timeout_s": 5, "base_url": "http://127.0.0.1:9/v1"}


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("generator.served.modle=m", "unknown key 'modle' for ServedConfig; did you mean 'model'?"),
        ("generator.served.timeout_s=soon", "field 'timeout_s': expected a number"),
        ("generator.served.api=grpc", "field 'api'"),
    ],
)
def test_a_bad_served_key_or_value_is_refused_when_the_config_is_built(assignment: str, message: str) -> None:
    with pytest.raises(DataError, match="generator.served") as caught:
        apply_overrides(EvalConfig(), [assignment])
    assert message in str(caught.value)


def test_python_callers_are_checked_alike() -> None:
    with pytest.raises(DataError, match="unknown key 'concurency'"):
        GeneratorConfig(kind="served", served={"base_url": "http://x/v1", "model": "m", "concurency": 4})


def test_the_command_refuses_it_with_one_line_before_writing(tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    records.write_text('{"id": "1", "question": "Q?", "golden_answers": ["A"]}\n')
    out = tmp_path / "out"
    args = ["eval", "--data", str(records), "--index", str(tmp_path), "--out", str(out), "--baseline", "naive"]
    result = CliRunner().invoke(app, [*args, "--set", "generator.served.modle=m"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "did you mean 'model'" in lines[0]
    assert not out.exists()
