"""The offline DPO baseline: examples built from hand-made sibling pairs (prompt, chosen and rejected
exactly as the rollout writes them), bad pair files named by file and line, a tiny policy trained a few
steps with TRL's DPOTrainer (finite loss, weights moved, a loadable policy), and the command."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.gold import render_gold
from prorag.agent.prompts import build_prompt, prompt_token_ids
from prorag.core.errors import DataError
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import read_records
from prorag.models.checkpoints import load_policy, save_policy
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.dpo import dpo_example, dpo_examples, train_dpo
from prorag.stages.dpo_config import DPOConfig
from prorag.stages.prm import StepPair

pytestmark = pytest.mark.usefixtures("one_thread")


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def segments(tiny_world: Path, tiny_retriever: BM25Retriever) -> tuple[str, list[str]]:
    """A gold trajectory's question and its first segments: action, retrieval (env), conclusion."""
    gold = render_gold(read_records(tiny_world / "train.jsonl")[:1], tiny_retriever, k=3)[0]
    return gold.question, [text for text, _ in gold.segments[:3]]


def hand_pair(tokenizer: Any, question: str, segments: list[str], pair_id: str = "q1@0.0") -> tuple[StepPair, str, str]:
    """The pair at the conclusion after the first search: the gold conclusion chosen, one naming the
    wrong entity rejected; with the rollout's text of both steps."""
    search, retrieval, conclusion = segments
    entity = conclusion.split("<subanswer>")[1].split("</subanswer>")[0].strip()
    wrong = conclusion.replace(entity, "Zorblat")
    context = prompt_token_ids(tokenizer, question) + ids(tokenizer, search) + ids(tokenizer, retrieval)
    pair = StepPair(pair_id, "q1", context, ids(tokenizer, conclusion), ids(tokenizer, wrong), "oracle", 1)
    return pair, conclusion, wrong


def pair_row(pair: StepPair) -> dict[str, Any]:
    return {
        "id": pair.id,
        "question_id": pair.question_id,
        "context_ids": pair.context_ids,
        "chosen_ids": pair.chosen_ids,
        "rejected_ids": pair.rejected_ids,
        "judge": "oracle",
        "depth": 1,
    }


def test_examples_are_the_rollout_text_of_prefix_and_sibling_steps(world_tokenizer: Any, segments: Any) -> None:
    question, segs = segments
    pair, chosen, rejected = hand_pair(world_tokenizer, question, segs)
    example = dpo_example(pair, world_tokenizer, 4096)
    assert example is not None
    assert example["prompt"] == build_prompt(world_tokenizer, question) + segs[0] + segs[1]
    assert example["prompt"].endswith("</retrieval>\n<step>")
    assert example["chosen"] == chosen and chosen.startswith(" ") and chosen.endswith("</subanswer>")
    assert example["rejected"] == rejected and "Zorblat" in rejected
    assert example["prompt_ids"] == pair.context_ids
    assert (example["chosen_ids"], example["rejected_ids"]) == (pair.chosen_ids, pair.rejected_ids)

    # Too long: the prompt loses its oldest tokens, the steps stay whole; a step longer than the limit is dropped.
    longest = max(len(pair.chosen_ids), len(pair.rejected_ids))
    cut = dpo_example(pair, world_tokenizer, longest + 5)
    assert cut is not None and cut["prompt_ids"] == pair.context_ids[-5:] and cut["chosen_ids"] == pair.chosen_ids
    examples, counts = dpo_examples([pair], world_tokenizer, longest)
    assert examples == [] and counts == {"pairs": 1, "examples": 0, "truncated": 0, "dropped": 1}
    bad = StepPair("x", "q", [len(world_tokenizer)], [1], [2])
    with pytest.raises(ValueError, match="outside the policy tokenizer"):
        dpo_examples([bad], world_tokenizer, 64)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory, world_tokenizer: Any) -> Path:
    return save_policy(
        make_tiny_model(world_tokenizer, "tiny", seed=0), world_tokenizer, tmp_path_factory.mktemp("pi") / "policy"
    )


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory, world_tokenizer: Any, segments: Any) -> Path:
    question, segs = segments
    rows = [pair_row(hand_pair(world_tokenizer, question, segs, f"q1@0.{i}")[0]) for i in range(8)]
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    write_jsonl(path, rows)
    return path


def test_bad_pair_file_names_file_line_and_field(pairs_file: Path, policy_dir: Path, tmp_path: Path) -> None:
    rows = list(read_jsonl(pairs_file))
    rows[1]["rejected_ids"] = "oops"
    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, rows)
    with pytest.raises(DataError, match=rf"{bad}:2: field 'rejected_ids'"):
        train_dpo(DPOConfig(pairs_file=str(bad), init=str(policy_dir)), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written before the inputs are checked


def test_tiny_dpo_run_trains_and_writes_a_loadable_policy(pairs_file: Path, policy_dir: Path, tmp_path: Path) -> None:
    cfg = DPOConfig(
        max_steps=3, per_device_batch_size=4, learning_rate=1e-2, warmup_ratio=0.0, logging_steps=1, save_steps=2, beta=0.5
    )
    out = train_dpo(DPOConfig(**{**cfg.__dict__, "pairs_file": str(pairs_file), "init": str(policy_dir)}), tmp_path / "run")
    assert out == tmp_path / "run" / "policy" and (out / "model.safetensors").is_file()
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-3)  # policy == reference at step 1
    assert rows[-1]["loss"] < rows[0]["loss"]
    trained, _ = load_policy(str(out))
    init, _ = load_policy(str(policy_dir))
    moved = [not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), init.state_dict().values(), strict=True)]
    assert any(moved)
    assert json.loads((tmp_path / "run" / "dpo_counts.json").read_text())["examples"] == 8
    assert next(read_jsonl(tmp_path / "run" / "dpo_pairs.jsonl"))["chosen"].endswith("</subanswer>")

    # A rerun with a higher step count resumes from the last checkpoint (step 3) and logs each step once.
    train_dpo(
        DPOConfig(**{**cfg.__dict__, "max_steps": 4, "pairs_file": str(pairs_file), "init": str(policy_dir)}), tmp_path / "run"
    )
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r] == [1, 2, 3, 4]


def test_dpo_command_parses_and_reports_bad_input(pairs_file: Path, policy_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prorag.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["dpo", "--help"])
    assert result.exit_code == 0 and "--pairs" in result.output and "--beta" in result.output
    args = ["dpo", "--pairs", str(pairs_file), "--init", str(policy_dir), "--run-dir", str(tmp_path / "run")]
    result = runner.invoke(app, [*args, "--beta", "0", "--set", "max_steps=1"])
    assert result.exit_code == 2 and "DPOConfig.beta must be > 0" in result.output
    result = runner.invoke(app, [*args, "--set", "epochs=three"])
    assert result.exit_code == 2 and "epochs" in result.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text(pairs_file.read_text().replace('"chosen_ids": [', '"chosen_ids": [-1, ', 1))
    result = runner.invoke(app, ["dpo", "--pairs", str(bad), "--init", str(policy_dir), "--run-dir", str(tmp_path / "r2")])
    assert result.exit_code == 2 and f"{bad}:1: field 'chosen_ids': item 0 is -1" in result.output


def test_pipeline_offers_dpo_without_adding_it_to_the_default_systems() -> None:
    from prorag.experiments.pipeline import LABELS, SYSTEMS, PipelineConfig, demo_config

    assert "dpo" in SYSTEMS and LABELS["dpo"] == "Offline DPO (MCTS pairs)"
    assert "dpo" not in PipelineConfig().systems and "dpo" not in demo_config().systems
    cfg = PipelineConfig(systems=["sft", "dpo"])
    assert cfg.systems == ["sft", "dpo"] and cfg.dpo.beta == 0.1
