"""ACC_L: the shipped prompt, the strict yes/no parse, the verdict cache and the metrics it adds,
with a scripted stand-in judge (the served client is tested on its own fake server)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prorag.data.jsonl import write_json, write_jsonl
from prorag.evaluation.harness import summarise
from prorag.evaluation.llm_judge import ACC_L_PROMPT, JudgeConfig, add_acc_l, judge_prompt, parse_verdict


@dataclass
class Reply:
    text: str


class StandInJudge:
    """Answers from a script keyed by the prediction in the prompt; records every prompt asked."""

    def __init__(self, by_prediction: dict[str, str]) -> None:
        self.by_prediction = by_prediction
        self.asked: list[str] = []

    def generate(
        self, prompts: list[str], *, max_tokens: int, stop: Any = (), temperature: float = 0.0, logprobs: bool = False
    ) -> list[Reply]:
        self.asked.extend(prompts)
        out = []
        for p in prompts:
            pred = p.split("Predicted answer: ", 1)[1].splitlines()[0]
            out.append(Reply(self.by_prediction[pred]))
        return out


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("yes", True),
        (" Yes.\n", True),
        ("NO", False),
        ("no.", False),
        ("Yes, it is", None),
        ("correct", None),
        ("", None),
        ("yes yes", None),
    ],
)
def test_parse_verdict_is_strict(reply: str, verdict: bool | None) -> None:
    assert parse_verdict(reply) is verdict


def test_shipped_prompt_has_its_fields_and_braces_in_answers_are_kept() -> None:
    template = ACC_L_PROMPT.read_text(encoding="utf-8")
    assert JudgeConfig().template() == template
    prompt = judge_prompt(template, "Who {x}?", ["Ada", "A. Lovelace"], "ada {lovelace}")
    assert "Question: Who {x}?" in prompt and "Gold answers: Ada | A. Lovelace" in prompt and "ada {lovelace}" in prompt


def test_a_prompt_file_without_the_fields_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "p.txt"
    bad.write_text("Is {prediction} right?")
    with pytest.raises(ValueError, match=r"p\.txt: a judge prompt needs the fields \{question\}, \{golden_answers\}"):
        JudgeConfig(prompt_file=str(bad)).template()


def _eval_folder(out: Path) -> None:
    rows = [
        {"id": "q1", "question": "Q1", "golden_answers": ["Paris"], "prediction": "the city of Paris", "em": 0.0, "f1": 0.5},
        {"id": "q2", "question": "Q2", "golden_answers": ["1990"], "prediction": "1991", "em": 0.0, "f1": 0.0},
        {"id": "q3", "question": "Q3", "golden_answers": ["Ada"], "prediction": "Ada?", "em": 1.0, "f1": 1.0},
        {"id": "q4", "question": "Q4", "golden_answers": ["Bob"], "prediction": None, "em": 0.0, "f1": 0.0},
    ]
    write_jsonl(out / "predictions.jsonl", rows)
    write_json(out / "metrics.json", {"n": 4, "em": 0.25})


def test_acc_l_counts_unparsable_replies_and_caches_verdicts(tmp_path: Path) -> None:
    _eval_folder(tmp_path)
    judge = StandInJudge({"the city of Paris": "Yes", "1991": "no", "Ada?": "Probably yes"})
    cfg = JudgeConfig(served={"model": "judge-1"})
    metrics = add_acc_l(tmp_path, cfg, generator=judge)
    # q1 yes, q2 no, q3 unparsable (wrong), q4 no prediction (wrong, not asked): 1/4
    assert metrics["acc_l"] == pytest.approx(0.25) and metrics["acc_l_unparsable"] == 1 and metrics["acc_l_n"] == 4
    assert metrics["em"] == 0.25, "the earlier metrics are kept"
    assert len(judge.asked) == 3
    assert json.loads((tmp_path / "metrics.json").read_text())["acc_l"] == pytest.approx(0.25)
    verdicts = [json.loads(line) for line in (tmp_path / "acc_l.jsonl").read_text().splitlines()]
    assert [v["verdict"] for v in verdicts] == [True, False, None, False]
    # Rerun: every verdict comes from the cache, nothing is asked again.
    again = StandInJudge({})
    assert add_acc_l(tmp_path, cfg, generator=again)["acc_l"] == pytest.approx(0.25)
    assert again.asked == []
    # Another judge model is another cache key: asked afresh.
    other = StandInJudge({"the city of Paris": "yes", "1991": "yes", "Ada?": "yes"})
    assert add_acc_l(tmp_path, JudgeConfig(served={"model": "judge-2"}), generator=other)["acc_l"] == pytest.approx(0.75)
    assert len(other.asked) == 3


def test_summarise_reports_rouge1_for_rows_without_it() -> None:
    """A line written by any runner (or before the metric existed) still gets its ROUGE-1 in metrics.json."""
    base = {
        "em": 0.0,
        "f1": 0.0,
        "cover_em": 0.0,
        "substring_acc": 0.0,
        "format_valid": True,
        "retrieval_steps": 1,
        "stop_reason": "answer",
    }
    rows = [
        {**base, "id": "a", "prediction": "The big red dog", "golden_answers": ["red dog"]},  # P 2/3, R 1: 0.8
        {**base, "id": "b", "prediction": "x", "golden_answers": ["y"], "rouge1_f1": 1.0, "searches": 2, "prompt_tokens": 10},
    ]
    out = summarise(rows)
    assert out["rouge1_f1"] == pytest.approx((0.8 + 1.0) / 2)
    assert "mean_searches" not in out, "a mean over some rows only would mislead"
