"""An over-long question in an evaluation: skipped (default) or cut to the policy's maximum length,
counted in metrics.json, never a crash; the other questions score as they would without it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prorag.cli import app
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import Record, read_records
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.evaluation.harness import evaluate
from prorag.models.checkpoints import save_policy
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.index import build_index

pytestmark = pytest.mark.usefixtures("one_thread")

#: Small caps: a random tiny policy writes until they stop it.
CAPS = {"max_actions": 2, "max_action_tokens": 8, "max_completion_tokens": 24}


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    """Three short questions around one of about 700 tokens (a pasted text before the question)."""
    short = read_records(tiny_world / "test.jsonl")[:3]
    long = Record("over-long", " ".join([short[0].question] * 50), short[0].golden_answers, dict(short[0].metadata))
    return [short[0], long, *short[1:]]


@pytest.fixture(scope="module")
def small_model(world_tokenizer: Any) -> Any:
    """A tiny policy with 64 positions: a prompt must stay within 64 - 8 (one action) tokens."""
    model = make_tiny_model(world_tokenizer, size="tiny", seed=0)
    model.config.max_position_embeddings = 64
    return model


def test_eval_cli_skips_an_over_long_question_scores_it_0_and_counts_it(
    tmp_path: Path,
    tiny_world: Path,
    world_tokenizer: Any,
    small_model: Any,
    records: list[Record],
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = save_policy(small_model, world_tokenizer, tmp_path / "policy")
    build_index(tiny_world / "corpus.jsonl", tmp_path / "index", kind="bm25")
    data = tmp_path / "records.jsonl"
    write_jsonl(data, [r.to_dict() for r in records])
    sets = [x for k, v in CAPS.items() for x in ("--set", f"rollout.{k}={v}")]
    base = ["eval", "--policy", str(policy), "--index", str(tmp_path / "index"), "--batch-size", "2", *sets]
    with caplog.at_level(logging.WARNING, logger="prorag.agent.context_budget"):
        result = CliRunner().invoke(app, [*base, "--data", str(data), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "eval: 1 of 4 questions over the context budget" in caplog.text and "1 skipped, 0 cut" in caplog.text

    rows = list(read_jsonl(tmp_path / "out" / "predictions.jsonl"))
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in records)
    skipped = next(r for r in rows if r["id"] == "over-long")
    assert skipped["skipped"] == "over_long" and skipped["prediction"] is None and skipped["em"] == skipped["f1"] == 0
    assert skipped["stop_reason"] == "over_long" and not skipped["format_valid"]
    trajs = {t["id"]: t for t in read_jsonl(tmp_path / "out" / "trajectories.jsonl")}
    assert len(trajs) == 4 and trajs["over-long"]["prompt_ids"] == [] and trajs["over-long"]["completion_ids"] == []
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["n"] == 4 and metrics["over_long_skipped"] == 1 and metrics["over_long_cut"] == 0
    assert metrics["stop_reasons"]["over_long"] == 1

    # The short questions are evaluated exactly as in a run without the over-long one.
    alone = tmp_path / "alone.jsonl"
    write_jsonl(alone, [r.to_dict() for r in records if r.id != "over-long"])
    result = CliRunner().invoke(app, [*base, "--data", str(alone), "--out", str(tmp_path / "alone")])
    assert result.exit_code == 0, result.output
    assert [r for r in rows if r["id"] != "over-long"] == list(read_jsonl(tmp_path / "alone" / "predictions.jsonl"))
    assert json.loads((tmp_path / "alone" / "metrics.json").read_text())["over_long_skipped"] == 0


@pytest.mark.parametrize("baseline", [None, "naive"])
def test_the_cut_rule_keeps_the_end_of_the_question_within_the_budget(
    tmp_path: Path,
    world_tokenizer: Any,
    small_model: Any,
    tiny_retriever: BM25Retriever,
    records: list[Record],
    baseline: str | None,
) -> None:
    cfg = EvalConfig(baseline=baseline, over_long="cut", rollout=EvalRolloutConfig(batch_size=2, **CAPS))
    metrics = evaluate(small_model, world_tokenizer, records, tiny_retriever, tmp_path, cfg, progress=False)
    assert metrics["n"] == 4 and metrics["over_long_cut"] == 1 and metrics["over_long_skipped"] == 0
    rows = {r["id"]: r for r in read_jsonl(tmp_path / "predictions.jsonl")}
    assert rows["over-long"]["cut"] == "over_long" and rows["over-long"]["question"] == records[1].question
    assert not any("cut" in r or "skipped" in r for i, r in rows.items() if i != "over-long")
    traj = next(t for t in read_jsonl(tmp_path / "trajectories.jsonl") if t["id"] == "over-long")
    assert traj["metadata"]["cut"] == "over_long" and records[1].question.endswith(traj["question"])
    assert len(traj["question"]) < len(records[1].question) and len(traj["prompt_ids"]) <= 64 - CAPS["max_action_tokens"]
    with pytest.raises(ValueError, match="over_long must be one of"):
        EvalConfig(over_long="truncate")  # type: ignore[arg-type]


def test_run_folders_made_before_the_budget_settings_still_match_their_markers(tmp_path: Path) -> None:
    """An eval or sft-data stage fingerprinted before ``over_long`` and ``max_chars`` existed is
    skipped while they hold their defaults, and counts as changed with any other value."""
    import dataclasses

    from prorag.core.config import LATER_FIELDS, without_later_fields
    from prorag.experiments.pipeline import PipelineConfig, Run
    from prorag.experiments.pipeline.run_folder import CONFIG_SCHEMA, fingerprint
    from prorag.stages.sft_data import SFTDataConfig

    stages = {"eval-sft": (EvalConfig(), "over_long", "cut"), "sft_data": (SFTDataConfig(), "max_chars", 100)}
    (tmp_path / "stages").mkdir()
    for stage, (config, name, _) in stages.items():
        before = without_later_fields(config, list(LATER_FIELDS).index(name))  # as written before `name` existed
        marker = {"stage": stage, "config_schema": CONFIG_SCHEMA, "fingerprint": fingerprint(before, root=tmp_path)}
        (tmp_path / "stages" / f"{stage}.json").write_text(json.dumps(marker), encoding="utf-8")
    calls: list[str] = []
    run = Run(tmp_path, PipelineConfig(), progress=lambda _: None)
    for stage, (config, name, other) in stages.items():
        run.stage(stage, config, lambda: calls.append("rerun"))
        with pytest.raises(ValueError, match="finished with other settings"):
            run.stage(stage, dataclasses.replace(config, **{name: other}), lambda: calls.append("changed"))
    assert calls == []
