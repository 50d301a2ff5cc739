"""Simple baselines that share the evaluation harness and the rollout engine.

* **naive**: the question alone, answered without retrieval;
* **standard RAG**: one retrieval with the question itself, then an answer.

Both run through :class:`~prorag.rollout.RolloutEngine` with ``max_actions=1`` (one generation,
stopped by ``</answer>`` or end-of-sequence), so their predictions, caps and outputs are those
of every other policy. With an instruct model (``chat`` style) the instruction asks for a short
answer; a tiny model trained from scratch (``plain`` style) is trained to write
``<answer> x </answer>`` after the prompt. The iterative inference-time baselines (Iter-RetGen,
IRCoT, FLARE, agentic prompting) come in their own issue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prorag.prompts import DIRECT_ANSWER_PROMPT, RAG_ANSWER_PROMPT, chat_prompt, has_chat_template, plain_prompt
from prorag.retrieval.base import Hit, format_documents
from prorag.schema import extract_answer, render_retrieval


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
