"""``prorag table1``: systems × benchmarks on the tiny built-in world written as two "benchmarks",
through the real command (files, average column, significance row, resume, bad configs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from prorag.cli import app
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import read_records
from prorag.experiments.table1 import significance, table1_markdown

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, tiny_world: Path, world_tokenizer: Any) -> dict[str, Path]:
    from prorag.models.checkpoints import save_policy
    from prorag.models.tiny import make_tiny_model
    from prorag.retrieval.index import build_index

    root = tmp_path_factory.mktemp("table1")
    records = read_records(tiny_world / "test.jsonl")
    write_jsonl(root / "a.jsonl", (r.to_dict() for r in records[:4]))
    write_jsonl(root / "b.jsonl", (r.to_dict() for r in records[4:10]))
    policy = save_policy(make_tiny_model(world_tokenizer, size="tiny", seed=0), world_tokenizer, root / "policy")
    build_index(tiny_world / "corpus.jsonl", root / "index", kind="bm25")
    return {"root": root, "policy": Path(policy), "index": root / "index"}


def _config(setup: dict[str, Path], **extra: Any) -> Path:
    root = setup["root"]
    cfg = {
        "benchmarks": {"WorldA": {"path": str(root / "a.jsonl")}, "WorldB": {"path": str(root / "b.jsonl"), "limit": 5}},
        "index": str(setup["index"]),
        "model": str(setup["policy"]),
        "rollout": {"batch_size": 4, "max_action_tokens": 6, "top_k": 2},
        "systems": [{"baseline": "naive"}, {"label": "RAG", "baseline": "standard-rag"}],
        **extra,
    }
    path = root / "table1.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_table1_end_to_end_through_the_command(setup: dict[str, Path]) -> None:
    run = setup["root"] / "run"
    runner = CliRunner()
    result = runner.invoke(app, ["table1", "--config", str(_config(setup)), "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    table = json.loads((run / "table1.json").read_text())
    assert list(table["cells"]) == ["naive", "RAG"] and table["top_k"] == 2
    assert table["benchmarks"]["WorldA"]["n"] == 4 and table["benchmarks"]["WorldB"]["n"] == 5
    for system, row in table["cells"].items():
        assert set(row) == {"WorldA", "WorldB"}
        for bench, cell in row.items():
            preds = list(read_jsonl(run / "cells" / system / bench / "predictions.jsonl"))
            assert cell["n"] == len(preds) == table["benchmarks"][bench]["n"]
            assert cell["em"] == pytest.approx(sum(p["em"] for p in preds) / len(preds))
            assert cell["mean_completion_tokens"] > 0 and "rouge1_f1" in cell
        # the average column: the unweighted mean of the two benchmark cells
        assert table["average"][system]["em"] == pytest.approx((row["WorldA"]["em"] + row["WorldB"]["em"]) / 2)
        assert table["average"][system]["f1"] == pytest.approx((row["WorldA"]["f1"] + row["WorldB"]["f1"]) / 2)
    assert table["cells"]["naive"]["WorldA"]["searches_per_question"] == 0
    assert table["cells"]["RAG"]["WorldA"]["searches_per_question"] == 1
    sig = table["significance"]
    assert sig["metric"] == "em" and sig["n"] == 9 and {sig["best"], sig["next"]} == {"naive", "RAG"}
    assert 0.0 <= sig["p_value"] <= 1.0
    md = (run / "table1.md").read_text()
    assert "Avg. EM / F1" in md and "WorldA EM / F1" in md and "Paired t-test" in md and "| RAG |" in md
    assert md.strip() in result.output
    # Rerun: every cell is finished, nothing is evaluated again.
    again = runner.invoke(app, ["table1", "--config", str(_config(setup)), "--run-dir", str(run)])
    assert again.exit_code == 0 and again.output.count("done before") == 4, again.output
    assert len(list(read_jsonl(run / "cells" / "RAG" / "WorldB" / "predictions.jsonl"))) == 5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"systems": [{"baseline": "nope"}]}, "SystemSpec.baseline: unknown evaluation baseline 'nope'"),
        ({"benchmarks": {"X": {"path": "/nonexistent.jsonl"}}}, "benchmark X: /nonexistent.jsonl is not a file"),
        ({"benchmarks": {"X": {"path": "x", "format": "csv"}}}, "BenchmarkSpec.format: unknown benchmark format 'csv'"),
        ({"systemz": []}, "systemz"),
        ({"systems": [{"baseline": "naive"}, {"label": "naive", "policy": "p"}]}, "system labels must be distinct"),
    ],
)
def test_a_bad_config_exits_2_with_one_line(setup: dict[str, Path], extra: dict[str, Any], message: str) -> None:
    result = CliRunner().invoke(
        app, ["table1", "--config", str(_config(setup, **extra)), "--run-dir", str(setup["root"] / "bad")]
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.output


def test_significance_compares_the_best_average_with_the_next() -> None:
    pooled = {
        "A": {("x", "1"): 1.0, ("x", "2"): 1.0, ("y", "1"): 0.0, ("y", "2"): 1.0},
        "B": {("x", "1"): 0.0, ("x", "2"): 1.0, ("y", "1"): 0.0, ("y", "2"): 0.0},
        "C": {("x", "1"): 0.0, ("x", "2"): 0.0, ("y", "1"): 0.0, ("y", "2"): 0.0},
    }
    averages = {"A": {"em": 0.75}, "B": {"em": 0.25}, "C": {"em": 0.0}}
    sig = significance(pooled, averages)
    assert sig is not None and (sig["best"], sig["next"], sig["n"]) == ("A", "B", 4)
    # differences 1, 0, 0, 1: mean 0.5, sd 0.57735, t = 0.5 / (0.57735 / 2) = 1.732, df 3 -> p = 0.1817
    assert (
        sig["mean_diff"] == pytest.approx(0.5)
        and sig["t"] == pytest.approx(1.7320508)
        and sig["p_value"] == pytest.approx(0.18169, abs=1e-4)
    )
    assert significance({"A": pooled["A"]}, {"A": averages["A"]}) is None
    result = {
        "benchmarks": {"x": {"n": 2}, "y": {"n": 2}},
        "cells": {s: {b: {"em": 0.5, "f1": 0.5, "searches_per_question": 1.0} for b in ("x", "y")} for s in "AB"},
        "average": {"A": {"em": 0.75, "f1": 0.8}, "B": {"em": 0.25, "f1": 0.3}},
        "top_k": 3,
        "index": "idx",
        "significance": sig,
    }
    md = table1_markdown(result)
    assert "| A | 50.0 / 50.0 | 50.0 / 50.0 | **75.0 / 80.0** | 1.00 | – |" in md
    assert "A vs B: mean difference 50.0 points, t = 1.732, p = 0.1817 (n = 4)" in md


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--generator", "served"], "generator.served is empty"),
        (["--generator", "remote"], "--generator: field 'kind': expected 'engine' or 'hf' or 'served'"),
        (["--judge-config", "JUDGE"], "judge.served is empty"),
    ],
)
def test_eval_generator_and_judge_options_refuse_bad_input_with_one_line(
    setup: dict[str, Path], tiny_world: Path, args: list[str], message: str
) -> None:
    """The served generator and the judge are checked before any model loads or question runs."""
    judge = setup["root"] / "judge.yaml"
    judge.write_text("max_tokens: 2\n")
    args = [str(judge) if a == "JUDGE" else a for a in args]
    base = ["eval", "--policy", str(setup["policy"]), "--data", str(tiny_world / "test.jsonl"), "--index", str(setup["index"])]
    result = CliRunner().invoke(app, [*base, "--out", str(setup["root"] / "eval-bad"), "--limit", "2", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert not (setup["root"] / "eval-bad" / "predictions.jsonl").exists()


def test_eval_served_options_fill_the_generator_block() -> None:
    from prorag.cli.options import ConfigSource
    from prorag.cli.stages import SHORTCUTS

    source = ConfigSource(
        "prorag.evaluation.harness:EvalConfig", "eval", None, ("generator.served.concurrency=4",), SHORTCUTS["eval"]
    )
    assert source.load().generator.served == {"concurrency": 4}  # a dotted key is one entry of the block
    plain = ConfigSource("prorag.evaluation.harness:EvalConfig", "eval", None, (), SHORTCUTS["eval"])
    cfg = plain.load(
        {"--generator": "served", "served options": lambda c: {**c.generator.served, "base_url": "http://127.0.0.1:1/v1"}}
    )
    assert cfg.generator.kind == "served" and cfg.generator.served == {"base_url": "http://127.0.0.1:1/v1"}


def test_the_offline_config_names_real_files(benchmarks_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """configs/pipelines/table1_offline.yaml loads as a Table1Config and its benchmark files exist (${PRORAG_SHARED} expanded)."""
    from prorag.core.config import load_config

    monkeypatch.setenv("PRORAG_SHARED", str(benchmarks_dir.parent.parent))
    from prorag.experiments.table1 import Table1Config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "pipelines" / "table1_offline.yaml", Table1Config)
    cfg.check()
    assert set(cfg.benchmarks) == {"PopQA", "HotpotQA", "MuSiQue", "Bamboogle"} and cfg.rollout.top_k == 3
    assert all(Path(b.path).parent.parent == benchmarks_dir for b in cfg.benchmarks.values())
