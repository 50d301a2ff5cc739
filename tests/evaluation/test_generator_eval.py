"""The generator harness: resume without repeating a question, cost columns, one-shot baselines on a
generator, options, and every generator baseline end to end on the tiny world with a tiny local model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prorag.core.errors import DataError
from prorag.data.jsonl import read_jsonl
from prorag.data.records import Record, read_records
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.evaluation.generator_eval import evaluate_generator, first_sentence, read_answer
from prorag.models.generator import HFGenerator, ScriptedGenerator
from prorag.models.tiny import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

#: Each generator baseline at its smallest budget (the tiny model reads nothing anyway).
SMALL_OPTIONS: dict[str, dict[str, float]] = {
    "iter-retgen": {"rounds": 2, "max_tokens": 8},
    "ircot": {"max_steps": 2, "sentence_tokens": 8},
    "flare": {"max_sentences": 2, "look_ahead_tokens": 8, "theta": 0.99},
    "search-o1": {"max_turns": 2, "reasoning_tokens": 8, "condense_tokens": 8},
}


def test_an_interrupted_run_resumes_without_repeating_a_question(tmp_path: Path, retriever, two_records) -> None:  # noqa: ANN001
    def crash_on_beta(prompt: str) -> str:
        if "Beta" in prompt:
            raise KeyboardInterrupt
        return "So the answer is: Ann Lee."

    cfg = EvalConfig(baseline="iter-retgen", baseline_options={"rounds": 2}, rollout=EvalRolloutConfig(batch_size=1))
    with pytest.raises(KeyboardInterrupt):
        evaluate_generator(ScriptedGenerator(crash_on_beta), two_records, retriever, tmp_path, cfg, progress=False)
    assert [r["id"] for r in read_jsonl(tmp_path / "predictions.jsonl")] == ["q1"]
    gen = ScriptedGenerator(lambda p: "Paris.")
    metrics = evaluate_generator(gen, two_records, retriever, tmp_path, cfg, progress=False)
    assert len(gen.calls) == 2 and all("Beta" in c for c in gen.calls), "only the unfinished question runs again"
    rows = list(read_jsonl(tmp_path / "predictions.jsonl"))
    assert [r["id"] for r in rows] == ["q1", "q2"] and [r["em"] for r in rows] == [1.0, 1.0]
    assert rows[0]["searches"] == rows[0]["retrieval_steps"] == 2 and rows[0]["queries"][0] == "Who directed Alpha?"
    assert rows[1]["completion_tokens"] == 2 and rows[1]["generations"] == 2
    assert rows[0]["retrieval_recall"] == 1.0 and metrics["retrieval_recall"] == 1.0
    assert metrics["n"] == 2 and metrics["mean_searches"] == 2 and metrics["mean_completion_tokens"] == (2 * 6 + 2) / 2
    assert json.loads((tmp_path / "metrics.json").read_text())["config"]["baseline_options"] == {"rounds": 2}
    assert len(list(read_jsonl(tmp_path / "trajectories.jsonl"))) == 2


@pytest.mark.parametrize("name,searches", [("naive", 0), ("standard-rag", 1)])
def test_one_shot_baselines_run_on_a_generator(tmp_path: Path, retriever, two_records, name: str, searches: int) -> None:  # noqa: ANN001
    gen = ScriptedGenerator(lambda p: "Answer: Paris\nmore")
    metrics = evaluate_generator(gen, two_records, retriever, tmp_path, EvalConfig(baseline=name), progress=False)
    assert metrics["em"] == 0.5 and metrics["mean_searches"] == searches and len(gen.calls) == 2
    assert ("about Where was Beta born?" in gen.calls[1]) == (searches == 1)


def test_options_are_checked_and_the_engine_refuses_a_generator_baseline(retriever, two_records) -> None:  # noqa: ANN001
    with pytest.raises(DataError, match="max_stpes"):
        EvalConfig(baseline="ircot", baseline_options={"max_stpes": 3})
    with pytest.raises(ValueError, match="takes no baseline_options"):
        EvalConfig(baseline="naive", baseline_options={"rounds": 3})
    with pytest.raises(ValueError, match="rounds"):
        EvalConfig(baseline="iter-retgen", baseline_options={"rounds": 0})
    with pytest.raises(ValueError, match="text generator"):
        EvalConfig(baseline="flare").baseline_runner().run(None, two_records, print)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs EvalConfig.baseline"):
        evaluate_generator(ScriptedGenerator(str), two_records, retriever, "/tmp", EvalConfig())


def test_answer_and_sentence_readers() -> None:
    assert read_answer("think \\boxed{a} then \\boxed{Ann Lee}") == "Ann Lee"
    assert read_answer("X. So the answer is: J. Smith.\nnext") == "J. Smith"
    assert read_answer("So the answer is: So the answer is: Krirek.") == "Krirek"
    assert read_answer("<answer> Paris </answer>") == "Paris" and read_answer("Answer: Rome\nx") == "Rome"
    assert (
        first_sentence(" A b. C d.") == "A b." and first_sentence("So the answer is: J. Smith.") == "So the answer is: J. Smith."
    )
    assert first_sentence("3.5 is it") == "3.5 is it"


def test_hf_generator_stops_batches_and_scores_its_tokens(world_tokenizer: Any) -> None:
    import torch

    model = make_tiny_model(world_tokenizer, seed=1).eval()
    gen = HFGenerator(model, world_tokenizer, batch_size=2)
    prompts = ["Question: who is here?\n", "Question: where\n", "Question: x\n"]
    free = gen.generate(prompts, max_tokens=6, logprobs=True)
    alone = [gen.generate([p], max_tokens=6)[0] for p in prompts]
    assert [g.text for g in free] == [g.text for g in alone], "left padding must not change a greedy continuation"
    for g in free:
        assert len(g.token_logprobs) == len(g.tokens) == g.completion_tokens and "".join(g.tokens) == g.text
        assert all(lp <= 0 for lp in g.token_logprobs)
    g = free[0]
    # the greedy token's log-probability is the highest of the model's log-softmax at that position
    ids = world_tokenizer(prompts[0], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        lp = model(torch.tensor([ids])).logits[0, -1].log_softmax(-1).max().item()
    assert g.token_logprobs[0] == pytest.approx(lp, abs=1e-4) and g.prompt_tokens == len(ids)
    if len(g.tokens) > 2:
        stop = g.tokens[2].strip() or g.tokens[2]
        cut = gen.generate(prompts[:1], max_tokens=6, stop=[stop], logprobs=True)[0]
        assert stop not in cut.text and g.text.startswith(cut.text) and cut.finish_reason == "stop"
        assert cut.completion_tokens == len(cut.token_logprobs) <= 2


@pytest.mark.parametrize("name", ["iter-retgen", "ircot", "flare", "search-o1", "naive", "standard-rag"])
def test_every_baseline_end_to_end_on_the_tiny_world(
    tmp_path: Path, name: str, tiny_world: Path, tiny_retriever: Any, world_tokenizer: Any
) -> None:
    records: list[Record] = read_records(tiny_world / "test.jsonl")[:3]
    gen = HFGenerator(make_tiny_model(world_tokenizer, seed=0).eval(), world_tokenizer)
    small = SMALL_OPTIONS.get(name, {})
    cfg = EvalConfig(baseline=name, baseline_options=small, rollout=EvalRolloutConfig(top_k=2, max_action_tokens=8))
    metrics = evaluate_generator(gen, records, tiny_retriever, tmp_path, cfg, progress=False)
    rows = list(read_jsonl(tmp_path / "predictions.jsonl"))
    assert metrics["n"] == len(rows) == 3 and metrics["mean_completion_tokens"] > 0 and metrics["mean_prompt_tokens"] > 0
    assert all(r["searches"] == len(r["queries"]) == r["retrieval_steps"] for r in rows)
    if name in ("iter-retgen", "ircot", "standard-rag"):
        assert metrics["mean_searches"] >= 1 and metrics["retrieval_recall"] is not None


def test_hf_generator_refuses_a_prompt_with_no_room_and_generates_the_rest(world_tokenizer: Any) -> None:
    model = make_tiny_model(world_tokenizer, seed=1).eval()
    gen = HFGenerator(model, world_tokenizer, batch_size=2)
    assert gen.max_length == model.config.max_position_embeddings
    huge = "Question: " + "who " * (gen.max_length + 10) + "\n"
    short = "Question: who is here?\n"
    out = gen.generate([short, huge, short], max_tokens=6, logprobs=True)
    assert out[1].text == "" and out[1].finish_reason == "over_long" and out[1].completion_tokens == 0
    assert out[1].prompt_tokens > gen.max_length and out[1].token_logprobs == []
    assert out[0].text == out[2].text == gen.generate([short], max_tokens=6)[0].text


@pytest.mark.parametrize("name", ["iter-retgen", "ircot", "flare", "search-o1", "naive", "standard-rag"])
def test_an_over_long_question_costs_its_row_only(
    tmp_path: Path, name: str, tiny_world: Path, tiny_retriever: Any, world_tokenizer: Any
) -> None:
    """A question far past the model's positions: an empty prediction scored 0 and counted in
    metrics.json, every other question answered; no crash, no half-written files."""
    records: list[Record] = read_records(tiny_world / "test.jsonl")[:2]
    model = make_tiny_model(world_tokenizer, seed=0).eval()
    long_question = "who " * (model.config.max_position_embeddings + 50)
    records.append(Record("huge", long_question, ["nobody"], records[0].metadata))
    small = SMALL_OPTIONS.get(name, {})
    cfg = EvalConfig(baseline=name, baseline_options=small, rollout=EvalRolloutConfig(top_k=2, max_action_tokens=8))
    metrics = evaluate_generator(HFGenerator(model, world_tokenizer), records, tiny_retriever, tmp_path, cfg, progress=False)
    rows = {r["id"]: r for r in read_jsonl(tmp_path / "predictions.jsonl")}
    assert metrics["n"] == 3 and set(rows) == {r.id for r in records}
    assert rows["huge"]["em"] == 0 and rows["huge"]["over_long_generations"] >= 1
    assert all(rows[r.id]["over_long_generations"] == 0 for r in records[:2])
    assert metrics["over_long_generations"] == rows["huge"]["over_long_generations"]
