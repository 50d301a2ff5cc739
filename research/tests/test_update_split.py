"""The update split (`research.analysis.update_split`): the split's statistics by hand, the policies it
writes, and its driver (`research/drivers/update_split.py`) end to end on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.core.errors import DataError
from prorag.data.jsonl import write_jsonl
from prorag.models.checkpoints import save_policy
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.index import build_index
from research.analysis.update_split import em_by_question, read_weights, split_from_scores
from research.drivers import update_split as driver

pytestmark = pytest.mark.usefixtures("one_thread")


def test_split_from_scores_by_hand() -> None:
    # four questions: start 1 0 0 1, +update 1 1 0 0, -update 0 0 0 1
    base, plus, minus = [1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]
    split = split_from_scores(base, plus, minus, [[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0]])
    assert split["questions"] == 4
    assert split["em"] == {"start": 50.0, "plus": 50.0, "minus": 25.0, "permuted": [50.0, 75.0]}
    # per question: linear (p - m)/2 = .5 .5 0 -.5 -> mean 12.5 points; quadratic (p + m)/2 - b = -.5 .5 0 -.5 -> -12.5
    assert split["linear"]["mean"] == 12.5 and split["quadratic"]["mean"] == -12.5 and split["change"]["mean"] == 0.0
    # the parts add up question by question, so their means add up to the change
    assert split["linear"]["mean"] + split["quadratic"]["mean"] == split["change"]["mean"]
    # linear parts 50, 50, 0, -50 points: sd 47.87, t = 12.5 / (47.87 / 2) = 0.522, df 3
    assert split["linear"]["ci95"] == pytest.approx(3.182446 * 47.871355 / 2, abs=0.01)
    assert split["linear"]["p"] == pytest.approx(0.638, abs=1e-3)
    # the permuted steps' mean change: (0 + 0) / 2, (0 + 0) / 2, (0 + 1) / 2, 0 -> 12.5 points
    assert split["permuted_change"]["mean"] == 12.5
    with pytest.raises(ValueError, match="same number of questions"):
        split_from_scores([1.0, 0.0], [1.0], [0.0, 0.0], [])
    with pytest.raises(ValueError, match="2 or more"):
        split_from_scores([1.0], [1.0], [0.0], [])


def test_read_weights_refuses_adapters_and_folders_without_safetensors(tmp_path: Path) -> None:
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(DataError, match="LoRA adapter"):
        read_weights(tmp_path / "adapter")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no \*.safetensors"):
        read_weights(tmp_path / "empty")


def test_em_by_question_follows_the_given_order_and_names_a_missing_question(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "predictions.jsonl", [{"id": "b", "em": 0.0}, {"id": "a", "em": 1.0}])
    assert em_by_question(tmp_path, ["a", "b"]) == [1.0, 0.0]
    with pytest.raises(DataError, match="no prediction for 1 questions \\(first: c\\)"):
        em_by_question(tmp_path, ["a", "c"])


@pytest.mark.slow
def test_update_split_driver_writes_the_mirrored_and_permuted_policies_and_the_split(
    tmp_path: Path, tiny_world: Path, world_tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    start_model = make_tiny_model(world_tokenizer, size="tiny", seed=0)
    start = save_policy(start_model, world_tokenizer, tmp_path / "start")
    trained_model = make_tiny_model(world_tokenizer, size="tiny", seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in trained_model.parameters():
            parameter.add_(0.01 * torch.randn(parameter.shape, generator=generator))
    trained = save_policy(trained_model, world_tokenizer, tmp_path / "trained")
    build_index(tiny_world / "corpus.jsonl", tmp_path / "index", kind="bm25")
    out = tmp_path / "split"
    args = ["--start", str(start), "--policy", str(trained), "--data", str(tiny_world / "test.jsonl")]
    args += ["--index", str(tmp_path / "index"), "--out", str(out), "--limit", "4", "--max-actions", "3", "--scale", "0.5"]
    driver.main(args)
    output = capsys.readouterr().out

    initial, final = read_weights(start), read_weights(trained)
    minus = read_weights(out / "policies" / "minus")
    half = read_weights(out / "policies" / "scale0.5")
    permuted = read_weights(out / "policies" / "permuted0")
    assert set(minus) == set(initial)
    for name in initial:
        torch.testing.assert_close(minus[name], 2 * initial[name] - final[name])
        torch.testing.assert_close(half[name], initial[name] + 0.5 * (final[name] - initial[name]))
        moved, step = (permuted[name] - initial[name]).flatten(), (final[name] - initial[name]).flatten()
        torch.testing.assert_close(moved.sort().values, step.sort().values)
    assert not torch.equal(permuted["model.embed_tokens.weight"], final["model.embed_tokens.weight"])

    split = json.loads((out / "split.json").read_text())
    assert split["questions"] == 4 and split["delta_rms"] > 0
    assert set(split["em"]) == {"start", "plus", "minus", "permuted"} and "0.5" in split["scales"]
    assert split["linear"]["mean"] + split["quadratic"]["mean"] == pytest.approx(split["change"]["mean"], abs=0.02)
    for name in ("start", "plus", "minus", "permuted0", "scale0.5"):
        assert json.loads((out / "eval" / name / "metrics.json").read_text())["n"] == 4
    assert "linear" in output and "-> " in output


def test_update_split_driver_refuses_a_limit_below_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--start", "a", "--policy", "b", "--data", "d", "--index", "i", "--out", str(tmp_path), "--limit", "1"]
    with pytest.raises(SystemExit) as exited:
        driver.main(args)
    assert exited.value.code != 0 and "--limit must be >= 2" in capsys.readouterr().err
