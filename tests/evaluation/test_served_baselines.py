"""Every baseline end to end on the served backend: the local fake OpenAI-compatible server as the
generator, through ``prorag eval``'s runner, with the requests it received checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prorag.data.jsonl import read_jsonl
from prorag.data.records import Record
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.evaluation.generator_eval import evaluate_generator
from prorag.models.endpoint_config import ServedConfig
from prorag.models.served import ServedGenerator
from tests.fake_chat_server import FakeChatServer, Reply, user_text

BASELINES = ("naive", "standard-rag", "iter-retgen", "ircot", "flare", "search-o1")


def answer_everything(body: dict[str, Any], n: int) -> Reply:
    """A reply every baseline can read its answer from (IRCoT's 'answer is', Search-o1's boxed);
    Search-o1 is first asked to search, as an agentic model would."""
    prompt = user_text(body)
    if "<|begin_search_query|>" in prompt and "<|begin_search_result|>" not in prompt.split("Question:")[-1]:
        return Reply(content="I need to look this up. <|begin_search_query|> Paris birthplace <|end_search_query|>")
    return Reply(content="So the answer is: \\boxed{Paris}.")


@pytest.mark.parametrize("name", BASELINES)
def test_every_baseline_runs_on_the_served_backend(tmp_path: Path, name: str, two_records: list[Record], retriever: Any) -> None:
    with FakeChatServer(answer_everything) as server:
        generator = ServedGenerator(ServedConfig(base_url=server.url, model="fake", concurrency=4, max_retries=1))
        cfg = EvalConfig(baseline=name, rollout=EvalRolloutConfig(top_k=2, max_action_tokens=16))
        metrics = evaluate_generator(generator, two_records, retriever, tmp_path, cfg, progress=False)
        asked = len(server.seen)
    rows = {r["id"]: r for r in read_jsonl(tmp_path / "predictions.jsonl")}
    assert metrics["n"] == 2 and set(rows) == {"q1", "q2"}
    assert asked >= 2  # at least one request per question went over HTTP
    assert all(r["completion_tokens"] > 0 and r["prompt_tokens"] > 0 for r in rows.values())
    assert all(r["searches"] == len(r["queries"]) for r in rows.values())
    if name == "naive":
        assert retriever.queries == []
    else:
        assert retriever.queries  # every retrieving baseline searched at least once
    assert rows["q2"]["em"] in (0.0, 1.0)
