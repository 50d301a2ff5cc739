"""The evaluation harness: metrics from replayed gold trajectories, resume, Figure-6 data,
baselines, the paired comparison, and the ``prorag eval`` command on a saved tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import RolloutEngine
from prorag.cli import app
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import Record, read_records
from prorag.evaluation.baselines import baseline_answer, naive_prompt, standard_rag_prompt
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.evaluation.harness import compare_predictions, evaluate, search_depth, steps_distribution, summarise
from prorag.models.checkpoints import save_policy
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.index import build_index
from tests.fakes import ReplayLM


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "test.jsonl")[:10]


def _gold_replay(world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]) -> ReplayLM:
    golds = render_gold(records, tiny_retriever, k=3)
    probe = RolloutEngine(ReplayLM({}, len(world_tokenizer), world_tokenizer.eos_token_id), world_tokenizer, tiny_retriever)
    targets = {tuple(probe.prompt_ids(g.question)): tokenize_segments(world_tokenizer, g.segments)[0] for g in golds}
    return ReplayLM(targets, len(world_tokenizer), world_tokenizer.eos_token_id)


def test_gold_policy_scores_perfectly_and_resume_adds_nothing(
    tmp_path: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    model = _gold_replay(world_tokenizer, tiny_retriever, records)
    cfg = EvalConfig(rollout=EvalRolloutConfig(batch_size=4))
    partial = evaluate(model, world_tokenizer, records[:4], tiny_retriever, tmp_path, cfg, progress=False)
    assert partial["n"] == 4
    metrics = evaluate(model, world_tokenizer, records, tiny_retriever, tmp_path, cfg, progress=False)
    rows = list(read_jsonl(tmp_path / "predictions.jsonl"))
    assert len(rows) == len(records) == len({r["id"] for r in rows}), "resume must not evaluate a question twice"
    assert metrics["n"] == len(records)
    for name in ("em", "f1", "cover_em", "substring_acc", "format_valid_rate"):
        assert metrics[name] == 1.0, name
    hops = [r.metadata["hops"] for r in records]
    assert metrics["mean_retrieval_steps"] == pytest.approx(sum(hops) / len(hops))
    # Recall of gold evidence equals what the gold rendering retrieved.
    golds = render_gold(records, tiny_retriever, k=3)
    expected = []
    for r, g in zip(records, golds, strict=True):
        got = {pid for x in g.retrievals for pid in x["doc_ids"]}
        gold = r.metadata["gold_doc_ids"]
        expected.append(sum(pid in got for pid in gold) / len(gold))
    assert metrics["retrieval_recall"] == pytest.approx(sum(expected) / len(expected))
    assert len(list(read_jsonl(tmp_path / "trajectories.jsonl"))) == len(records)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["em"] == 1.0 and saved["config"]["rollout"]["top_k"] == 3 and saved["config"]["rollout"]["greedy"]


def test_eval_config_holds_the_rollout_settings_once() -> None:
    """The engine's settings live in one nested RolloutConfig (greedy by default, also when a
    YAML block sets only some of them); a baseline runs one action."""
    from prorag.agent.rollout_config import RolloutConfig
    from prorag.core.config import config_from_dict

    cfg = config_from_dict(EvalConfig, {"limit": 5, "rollout": {"top_k": 5, "max_action_tokens": 64}})
    assert isinstance(cfg.rollout, RolloutConfig) and cfg.rollout.greedy and cfg.rollout.top_k == 5
    assert cfg.rollout_config() is cfg.rollout and cfg.rollout.max_actions == 13
    single = EvalConfig(baseline="naive", rollout=EvalRolloutConfig(max_actions=7)).rollout_config()
    assert single.max_actions == 1 and single.greedy
    assert EvalConfig().rollout == EvalRolloutConfig() and EvalConfig().rollout is not EvalConfig().rollout


def test_steps_distribution_is_figure_6_data() -> None:
    rows = [
        {"retrieval_steps": 0, "f1": 0.0},
        {"retrieval_steps": 2, "f1": 1.0},
        {"retrieval_steps": 2, "f1": 0.5},
        {"retrieval_steps": 3, "f1": 1.0},
    ]
    dist = steps_distribution(rows)
    assert [d["steps"] for d in dist] == [0, 2, 3]
    assert [d["count"] for d in dist] == [1, 2, 1]
    assert [d["f1"] for d in dist] == [0.0, 0.75, 1.0]
    assert [d["coverage"] for d in dist] == [0.25, 0.75, 1.0]
    assert dist[1]["cumulative_f1"] == pytest.approx(1.5 / 3)
    assert dist[2]["cumulative_f1"] == pytest.approx(2.5 / 4)


def test_summarise_names_each_metric() -> None:
    rows = [
        {
            "em": 1.0,
            "f1": 1.0,
            "cover_em": 1.0,
            "substring_acc": 1.0,
            "format_valid": True,
            "retrieval_steps": 1,
            "stop_reason": "answer",
            "retrieval_recall": 1.0,
            "type": "chain",
        },
        {
            "em": 0.0,
            "f1": 0.5,
            "cover_em": 1.0,
            "substring_acc": 0.0,
            "format_valid": False,
            "retrieval_steps": 3,
            "stop_reason": "max_actions",
            "type": "compare_same",
        },
    ]
    m = summarise(rows)
    assert (m["em"], m["f1"], m["cover_em"], m["substring_acc"]) == (0.5, 0.75, 1.0, 0.5)
    assert m["format_valid_rate"] == 0.5 and m["mean_retrieval_steps"] == 2.0
    assert m["retrieval_recall"] == 1.0 and m["stop_reasons"] == {"answer": 1, "max_actions": 1}
    assert m["by_type"]["compare_same"] == {"n": 1, "em": 0.0, "f1": 0.5}
    assert "yes_no_em" not in m  # no gold answers in these rows
    binary = [
        {**rows[1], "prediction": "Kilen", "golden_answers": ["yes"]},
        {**rows[0], "prediction": "Drovi", "golden_answers": ["Drovi"]},
    ]
    assert summarise(binary)["yes_no_n"] == 1.0 and summarise(binary)["yes_no_answered_rate"] == 0.0
    with pytest.raises(ValueError):
        summarise([])


def test_search_depth_by_hand() -> None:
    # hops 1: one search, right. hops 2: one search (below), wrong; two searches, right. hops 3: two
    # searches (below), F1 0.5. A row without hops and one with hops 0 are left out.
    def row(hops: Any, steps: int, em: float, f1: float) -> dict[str, Any]:
        return {"em": em, "f1": f1, "retrieval_steps": steps, **({"hops": hops} if hops is not None else {})}

    rows = [row(1, 1, 1, 1), row(2, 1, 0, 0), row(2, 2, 1, 1), row(3, 2, 0, 0.5), row(None, 0, 1, 1), row(0, 0, 0, 0)]
    depth = search_depth(rows)
    assert depth["by_hops"] == {
        "1": {"n": 1, "em": 1.0, "f1": 1.0, "mean_retrieval_steps": 1.0},
        "2": {"n": 2, "em": 0.5, "f1": 0.5, "mean_retrieval_steps": 1.5},
        "3": {"n": 1, "em": 0.0, "f1": 0.5, "mean_retrieval_steps": 2.0},
    }
    assert depth["searches_below_hops_rate"] == 0.5  # 2 of the 4 rows with hops
    assert search_depth([row(None, 1, 1, 1)]) == {}
    # summarise reports it beside the other metrics
    full = [{**r, "cover_em": r["em"], "substring_acc": r["em"], "format_valid": True, "stop_reason": "answer"} for r in rows]
    assert summarise(full)["searches_below_hops_rate"] == 0.5
    assert "by_hops" not in summarise(full[4:5])


def test_baseline_prompts_and_answers(world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]) -> None:
    r = records[0]
    assert naive_prompt(world_tokenizer, r.question) == f"Question: {r.question}\n"
    hits = tiny_retriever.search([r.question], k=2, partitions=[r.partition])[0]
    prompt = standard_rag_prompt(world_tokenizer, r.question, hits)
    assert prompt.startswith("<retrieval>\nDoc 1(Title: ") and prompt.endswith(f"Question: {r.question}\n")
    assert baseline_answer("<answer> Kelo </answer>", world_tokenizer) == "Kelo"
    assert baseline_answer("\nAnswer: Paris<eos>", world_tokenizer) == "Paris"
    assert baseline_answer("<eos>", world_tokenizer) is None


def test_compare_predictions_paired(tmp_path: Path) -> None:
    def rows(ems: list[float]) -> list[dict[str, Any]]:
        return [{"id": f"q{i}", "em": e, "f1": e, "cover_em": e, "substring_acc": e} for i, e in enumerate(ems)]

    write_jsonl(tmp_path / "a.jsonl", rows([1, 1, 1, 0, 1, 1]))
    write_jsonl(tmp_path / "b.jsonl", rows([0, 1, 0, 0, 0, 1]))
    result = compare_predictions(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    em = result["em"]
    # differences 1,0,1,0,1,0: mean 0.5, sd sqrt(0.3), t = 0.5 / (sqrt(0.3)/sqrt(6))
    assert em["n"] == 6 and em["mean_a"] == pytest.approx(5 / 6) and em["mean_b"] == pytest.approx(2 / 6)
    assert em["t"] == pytest.approx(0.5 / ((0.3**0.5) / 6**0.5))
    assert 0.0 < em["p_value"] < 0.1


@pytest.mark.slow
def test_eval_cli_on_a_saved_tiny_model(tmp_path: Path, tiny_world: Path, world_tokenizer: Any) -> None:
    policy = save_policy(make_tiny_model(world_tokenizer, size="tiny", seed=0), world_tokenizer, tmp_path / "policy")
    build_index(tiny_world / "corpus.jsonl", tmp_path / "index", kind="bm25")
    runner = CliRunner()
    base = [
        "eval",
        "--policy",
        str(policy),
        "--data",
        str(tiny_world / "test.jsonl"),
        "--index",
        str(tmp_path / "index"),
        "--limit",
        "6",
        "--batch-size",
        "3",
    ]
    for name, extra in (
        ("loop", ["--max-actions", "3"]),
        ("naive", ["--baseline", "naive"]),
        ("rag", ["--baseline", "standard-rag"]),
    ):
        out = tmp_path / name
        result = runner.invoke(app, [*base, "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["n"] == 6
        for key in (
            "em",
            "f1",
            "cover_em",
            "substring_acc",
            "format_valid_rate",
            "mean_retrieval_steps",
            "retrieval_recall",
            "retrieval_steps_distribution",
        ):
            assert key in metrics, key
        assert len(list(read_jsonl(out / "trajectories.jsonl"))) == 6
    assert json.loads((tmp_path / "naive" / "metrics.json").read_text())["mean_retrieval_steps"] == 0
    rag = json.loads((tmp_path / "rag" / "metrics.json").read_text())
    assert rag["mean_retrieval_steps"] == 1 and rag["retrieval_recall"] is not None
    cmp = runner.invoke(
        app, ["eval", "--compare", str(tmp_path / "naive" / "predictions.jsonl"), str(tmp_path / "rag" / "predictions.jsonl")]
    )
    assert cmp.exit_code == 0 and "substring_acc" in cmp.output, cmp.output
    missing = runner.invoke(app, ["eval", "--data", str(tiny_world / "test.jsonl")])
    assert missing.exit_code == 2 and "--policy" in missing.output


@pytest.mark.slow
def test_eval_on_real_benchmark_records(tmp_path: Path, benchmarks_dir: Path, world_tokenizer: Any) -> None:
    """The harness on real MuSiQue and Bamboogle records over a real pooled corpus (tiny model, byte-level world tokenizer)."""
    from prorag.data.benchmarks import load_benchmark
    from prorag.data.corpus import build_corpus
    from prorag.retrieval.index import load_index

    musique = benchmarks_dir / "musique" / "musique_ans_dev_200.jsonl"
    write_jsonl(tmp_path / "corpus.jsonl", (p.to_dict() for p in build_corpus([musique]).passages))
    build_index(tmp_path / "corpus.jsonl", tmp_path / "index", kind="bm25")
    retriever = load_index(tmp_path / "index")
    model = make_tiny_model(world_tokenizer, size="tiny", seed=0)
    for name, fmt, path in (
        ("musique", "musique", musique),
        ("bamboogle", "flashrag", benchmarks_dir / "bamboogle" / "test.jsonl"),
    ):
        records = load_benchmark(path, fmt).records
        cfg = EvalConfig(limit=3, rollout=EvalRolloutConfig(batch_size=3, max_actions=3, max_action_tokens=24))
        metrics = evaluate(model, world_tokenizer, records, retriever, tmp_path / name, cfg, progress=False)
        assert metrics["n"] == 3
        rows = list(read_jsonl(tmp_path / name / "predictions.jsonl"))
        assert [r["id"] for r in rows] == [r.id for r in records[:3]]
        assert all(r["golden_answers"] == rec.golden_answers for r, rec in zip(rows, records, strict=False))
        if name == "musique":
            assert metrics["retrieval_recall"] is not None  # MuSiQue carries gold paragraph ids
        else:
            assert metrics["retrieval_recall"] is None  # Bamboogle has no gold evidence


def test_baselines_come_from_the_registry(
    tmp_path: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    """Unknown names are refused with the known ones; a baseline registered in a test runs through
    :func:`evaluate` with no edit to the harness (its prompts, its one action, its answers)."""
    from prorag.evaluation.baselines import EVAL_BASELINES, NaiveBaseline

    assert EVAL_BASELINES.names()[:2] == ["naive", "standard-rag"]
    with pytest.raises(
        ValueError,
        match=r"EvalConfig.baseline: unknown evaluation baseline 'iter-retgen-typo'; expected one of \['naive', 'standard-rag'",
    ):
        EvalConfig(baseline="iter-retgen-typo")

    @EVAL_BASELINES.register("test-always-kelo", replace=True)
    class AlwaysKelo(NaiveBaseline):
        def answer(self, traj: Any, tokenizer: Any) -> str | None:
            return "Kelo"

    model = make_tiny_model(world_tokenizer, seed=0)
    cfg = EvalConfig(baseline="test-always-kelo", rollout=EvalRolloutConfig(batch_size=4, max_action_tokens=8))
    assert cfg.rollout_config().max_actions == 1
    metrics = evaluate(model, world_tokenizer, records[:3], tiny_retriever, tmp_path, cfg, progress=False)
    rows = list(read_jsonl(tmp_path / "predictions.jsonl"))
    assert metrics["n"] == 3 and [r["prediction"] for r in rows] == ["Kelo"] * 3
    assert all(r["retrieval_steps"] == 0 for r in rows)
