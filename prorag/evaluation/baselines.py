"""Simple baselines that share the evaluation harness and the rollout engine.

* **naive**: the question alone, answered without retrieval;
* **standard RAG**: one retrieval with the question itself, then an answer.

Both run through :class:`~prorag.agent.rollout.RolloutEngine` with ``max_actions=1`` (one generation,
stopped by ``</answer>`` or end-of-sequence), so their predictions, caps and outputs are those
of every other policy. With an instruct model (``chat`` style) the instruction asks for a short
answer; a tiny model trained from scratch (``plain`` style) is trained to write
``<answer> x </answer>`` after the prompt, by the SFT stage with ``target="naive"`` or
``"standard-rag"`` on :func:`baseline_trajectories`: the same questions, gold answers, model,
optimiser and budget as the ProRAG policy, so that the comparison isolates what the multi-step
format and its retrievals add. The iterative inference-time baselines (Iter-RetGen,
IRCoT, FLARE, agentic prompting) come in their own issue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from prorag.agent.gold import GoldTrajectory
from prorag.agent.prompts import DIRECT_ANSWER_PROMPT, RAG_ANSWER_PROMPT, chat_prompt, has_chat_template, plain_prompt
from prorag.agent.schema import extract_answer, render_final, render_retrieval
from prorag.data.records import Record
from prorag.retrieval.base import Hit, Retriever, format_documents

Baseline = Literal["naive", "standard-rag"]


def _style(tokenizer: Any, style: str | None) -> str:
    return style or ("chat" if has_chat_template(tokenizer) else "plain")


def naive_prompt(tokenizer: Any, question: str, style: str | None = None) -> str:
    """No retrieval: the question only."""
    if _style(tokenizer, style) == "chat":
        return chat_prompt(tokenizer, question, DIRECT_ANSWER_PROMPT)
    return plain_prompt(question)


def standard_rag_prompt(tokenizer: Any, question: str, hits: Sequence[Hit], style: str | None = None) -> str:
    """One retrieval with the question: the documents, then the question."""
    if _style(tokenizer, style) == "chat":
        return chat_prompt(tokenizer, question, RAG_ANSWER_PROMPT, documents=format_documents(hits))
    return render_retrieval(hits) + "\n" + plain_prompt(question)


def baseline_answer(text: str, tokenizer: Any) -> str | None:
    """The answer of a one-shot generation: the ``<answer>`` content if any, else the first line of text."""
    tagged = extract_answer(text)
    if tagged is not None:
        return tagged
    for special in getattr(tokenizer, "all_special_tokens", []) or []:
        text = text.replace(special, "\n")
    for line in text.splitlines():
        line = line.strip()
        if line.lower().startswith("answer:"):
            line = line[len("answer:") :].strip()
        if line:
            return line
    return None


def baseline_prompts(
    baseline: Baseline, tokenizer: Any, records: Sequence[Record], retriever: Retriever, k: int, style: str | None
) -> tuple[list[str], dict[str, list[dict[str, Any]]]]:
    """Prompts of the naive (no retrieval) or standard RAG (one retrieval with the question) baseline.

    Also returns, per record id, the retrievals made while building the prompt (standard RAG's
    one search, recorded as action -1: before the model's first action), so that retrieval
    steps and evidence recall are counted for baselines as for policies.
    """
    if baseline == "naive":
        return [naive_prompt(tokenizer, r.question, style) for r in records], {}
    if baseline == "standard-rag":
        hits = retriever.search([r.question for r in records], k=k, partitions=[r.partition for r in records])
        prompts = [standard_rag_prompt(tokenizer, r.question, h, style) for r, h in zip(records, hits, strict=True)]
        searched = {
            r.id: [{"query": r.question, "doc_ids": [x.id for x in h], "action": -1}] for r, h in zip(records, hits, strict=True)
        }
        return prompts, searched
    raise ValueError(f"unknown baseline {baseline!r}; expected 'naive' or 'standard-rag'")


def baseline_trajectories(
    kind: Baseline,
    records: Sequence[Record],
    retriever: Retriever | None,
    tokenizer: Any,
    *,
    k: int = 3,
    style: str | None = None,
) -> list[GoldTrajectory]:
    """Training examples of a baseline as :class:`~prorag.agent.gold.GoldTrajectory` rows: the
    baseline's own prompt (exactly what :func:`prorag.evaluation.harness.evaluate` gives it at inference,
    standard RAG's documents included) and one model segment, ``<answer> gold </answer>``.

    The first gold answer is the target (a world record has one; for real records it is the
    dataset's canonical answer, the aliases being for scoring). Records without an answer are
    skipped.
    """
    records = [r for r in records if r.golden_answers and str(r.golden_answers[0]).strip()]
    prompts, searched = baseline_prompts(kind, tokenizer, records, retriever, k, style)
    return [
        GoldTrajectory(
            id=r.id,
            question=r.question,
            segments=[(render_final(str(r.golden_answers[0])), True)],
            answer=str(r.golden_answers[0]),
            retrievals=searched.get(r.id, []),
            prompt=prompt,
        )
        for r, prompt in zip(records, prompts, strict=True)
    ]
