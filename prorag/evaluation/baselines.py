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
format and its retrievals add. Each baseline is an :class:`EvalBaseline` registered in
:data:`EVAL_BASELINES` (``EvalConfig.baseline``); the iterative ones (Iter-RetGen, IRCoT, FLARE,
agentic prompting) come as one module each, named in the registry's ``builtins``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prorag.agent.gold import GoldTrajectory
from prorag.agent.prompts import DIRECT_ANSWER_PROMPT, RAG_ANSWER_PROMPT, chat_prompt, has_chat_template, plain_prompt
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.schema import extract_answer, render_final, render_retrieval
from prorag.agent.trajectory import Trajectory
from prorag.core.registry import Registry
from prorag.data.records import Record
from prorag.retrieval.base import Hit, Retriever, format_documents

if TYPE_CHECKING:
    from prorag.agent.rollout import RolloutEngine

#: A baseline's name in :data:`EVAL_BASELINES`.
Baseline = str
#: Per record id, the retrievals a baseline made before the model's first action.
Searched = dict[str, list[dict[str, Any]]]


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


class EvalBaseline:
    """One inference-time baseline, as the harness runs it: the engine's settings
    (:meth:`rollout_config`), the prompts (:meth:`prompts`), the run on the engine (:meth:`run`)
    and the prediction read from each trajectory (:meth:`answer`). The defaults are a one-shot
    baseline's: one generation on the baseline's own prompt; a subclass overrides what differs."""

    def rollout_config(self, rollout: RolloutConfig) -> RolloutConfig:
        """One action: a single generation, stopped by ``</answer>`` or end-of-sequence."""
        return replace(rollout, max_actions=1)

    def prompts(
        self, tokenizer: Any, records: Sequence[Record], retriever: Retriever | None, k: int, style: str | None
    ) -> tuple[list[str], Searched]:
        """The prompt of each record, and per record id the retrievals made while building it
        (recorded as action -1: before the model's first action), so that retrieval steps and
        evidence recall are counted for baselines as for policies."""
        raise NotImplementedError

    def run(
        self,
        engine: RolloutEngine,
        records: Sequence[Record],
        on_batch: Callable[[list[Trajectory]], None],
        *,
        progress: bool = False,
    ) -> None:
        """Roll ``records`` out on ``engine`` and hand each finished batch to ``on_batch``, each
        trajectory's retrievals starting with those of its prompt."""
        cfg = engine.config
        prompts, searched = self.prompts(engine.tokenizer, records, engine.retriever, cfg.top_k, cfg.prompt_style)

        def with_prompt_retrievals(batch: list[Trajectory]) -> None:
            for t in batch:
                t.retrievals = searched.get(t.id, []) + t.retrievals
            on_batch(batch)

        engine.rollout(records, prompts=prompts, progress=progress, on_batch=with_prompt_retrievals)

    def answer(self, traj: Trajectory, tokenizer: Any) -> str | None:
        """:func:`baseline_answer` of the generated text (an instruct model may answer untagged)."""
        return baseline_answer(traj.text, tokenizer)


#: Evaluation baselines by name (``EvalConfig.baseline``, ``prorag eval --baseline``).
EVAL_BASELINES: Registry[type[EvalBaseline]] = Registry(
    "evaluation baseline",
    builtins=(
        "prorag.evaluation.iter_retgen",
        "prorag.evaluation.ircot",
        "prorag.evaluation.flare",
        "prorag.evaluation.search_o1",
    ),
)


@EVAL_BASELINES.register("naive", help="the question alone, answered without retrieval")
class NaiveBaseline(EvalBaseline):
    """The question alone, answered without retrieval."""

    def prompts(
        self, tokenizer: Any, records: Sequence[Record], retriever: Retriever | None, k: int, style: str | None
    ) -> tuple[list[str], Searched]:
        return [naive_prompt(tokenizer, r.question, style) for r in records], {}


@EVAL_BASELINES.register(
    "standard-rag", help="one retrieval with the question, its documents before the question, then an answer"
)
class StandardRAGBaseline(EvalBaseline):
    """One retrieval with the question itself, its documents before the question, then an answer."""

    def prompts(
        self, tokenizer: Any, records: Sequence[Record], retriever: Retriever | None, k: int, style: str | None
    ) -> tuple[list[str], Searched]:
        if retriever is None:
            raise ValueError("the standard-rag baseline needs a retriever")
        hits = retriever.search([r.question for r in records], k=k, partitions=[r.partition for r in records])
        prompts = [standard_rag_prompt(tokenizer, r.question, h, style) for r, h in zip(records, hits, strict=True)]
        searched = {
            r.id: [{"query": r.question, "doc_ids": [x.id for x in h], "action": -1}] for r, h in zip(records, hits, strict=True)
        }
        return prompts, searched


def baseline_prompts(
    baseline: Baseline, tokenizer: Any, records: Sequence[Record], retriever: Retriever | None, k: int, style: str | None
) -> tuple[list[str], Searched]:
    """:meth:`EvalBaseline.prompts` of the baseline registered as ``baseline``."""
    return EVAL_BASELINES.get(baseline)().prompts(tokenizer, records, retriever, k, style)


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


__all__ = [
    "EVAL_BASELINES",
    "Baseline",
    "EvalBaseline",
    "NaiveBaseline",
    "Searched",
    "StandardRAGBaseline",
    "baseline_answer",
    "baseline_prompts",
    "baseline_trajectories",
    "naive_prompt",
    "standard_rag_prompt",
]
