"""Inference-time baselines on a :class:`~prorag.models.generator.TextGenerator`, and their harness.

A :class:`GeneratorBaseline` (Iter-RetGen, IRCoT, FLARE, Search-o1; registered in
:data:`~prorag.evaluation.baselines.EVAL_BASELINES`) runs each question as a small program of
generations and searches. The questions of a batch advance in lockstep, so that each round is one
``generate`` call over every question still running (a served generator sends them concurrently).
Every generation's prompt and completion tokens and every search (query and document ids) are
recorded on the question's :class:`QuestionRun`, so searches-per-question, evidence recall and cost
mean the same for every system.

:func:`evaluate_generator` writes what :func:`~prorag.evaluation.harness.evaluate` writes
(``predictions.jsonl`` with the same :func:`~prorag.evaluation.harness.score` rows plus
``searches``, ``queries``, ``prompt_tokens``, ``completion_tokens``; ``trajectories.jsonl``;
``metrics.json``) and resumes an interrupted run without repeating a finished question. The naive
and standard-RAG baselines run on a generator too: one generation on their own prompt.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from prorag.agent.prompts import chat_prompt, has_chat_template
from prorag.agent.trajectory import Trajectory
from prorag.core.config import config_from_dict
from prorag.data.jsonl import JsonlAppender
from prorag.data.records import Record
from prorag.evaluation.baselines import EvalBaseline, baseline_answer
from prorag.evaluation.eval_config import EvalConfig
from prorag.evaluation.harness import finish, pending, score
from prorag.models.generator import Generation, TextGenerator
from prorag.retrieval.base import Hit, Retriever, format_documents

if TYPE_CHECKING:
    from prorag.agent.rollout import RolloutEngine

log = logging.getLogger(__name__)

#: Per-question counts whose means go into ``metrics.json`` as ``mean_<name>``.
COST_FIELDS = ("searches", "prompt_tokens", "completion_tokens", "generations")


@dataclass
class QuestionRun:
    """What a baseline has done for one question so far."""

    record: Record
    retrievals: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generations: int = 0
    over_long_generations: int = 0
    """Generations refused because their prompt left no room in the model's positions."""
    text: str = ""
    """The transcript: what the model wrote (and, for agentic prompting, what it was shown)."""
    answer: str | None = None
    stop_reason: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    """The method's own working state (documents, sentences so far, ...)."""

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def to_trajectory(self, baseline: str) -> Trajectory:
        """A :class:`~prorag.agent.trajectory.Trajectory` for :func:`score` and ``trajectories.jsonl``
        (no token ids: a generator's tokens are not the engine's); valid when an answer was read."""
        return Trajectory(
            id=self.record.id,
            question=self.record.question,
            prompt_ids=[],
            completion_ids=[],
            env_mask=[],
            logprobs=[],
            actions=[],
            retrievals=self.retrievals,
            stop_reason=self.stop_reason or "unfinished",
            text=self.text,
            answer=self.answer,
            valid=self.answer is not None,
            metadata={
                "baseline": baseline,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "generations": self.generations,
                "over_long_generations": self.over_long_generations,
            },
        )


class Session:
    """A generator, a retriever and ``k``, counting what each question spends."""

    def __init__(self, generator: TextGenerator, retriever: Retriever | None, k: int, style: str | None) -> None:
        self.generator = generator
        self.retriever = retriever
        self.k = k
        self.style = style

    def generate(self, runs: Sequence[QuestionRun], prompts: Sequence[str], **kwargs: Any) -> list[Generation]:
        """One ``generate`` call for ``runs`` (one prompt each), tokens added to each run."""
        if not runs:
            return []
        gens = self.generator.generate(list(prompts), **kwargs)
        if len(gens) != len(runs):
            raise RuntimeError(f"the generator returned {len(gens)} generations for {len(runs)} prompts")
        for run, g in zip(runs, gens, strict=True):
            run.prompt_tokens += g.prompt_tokens
            run.completion_tokens += g.completion_tokens
            run.generations += 1
            run.over_long_generations += g.finish_reason == "over_long"
        return gens

    def search(self, runs: Sequence[QuestionRun], queries: Sequence[str], action: int, k: int | None = None) -> list[list[Hit]]:
        """One batched search (each in its record's partition), recorded on each run as action ``action``."""
        if not runs:
            return []
        if self.retriever is None:
            raise ValueError("this baseline needs a retriever")
        hits = self.retriever.search(list(queries), k=k or self.k, partitions=[r.record.partition for r in runs])
        for run, q, h in zip(runs, queries, hits, strict=True):
            run.retrievals.append({"query": q, "doc_ids": [x.id for x in h], "action": action})
        return hits

    def head(self, instruction: str, user: str) -> str:
        """The start of a prompt: the tokenizer's chat template (``chat`` style, or by default when
        the generator exposes a tokenizer that has one) with the instruction as system turn, else
        plain text (a completions endpoint, a base model)."""
        tokenizer = getattr(self.generator, "tokenizer", None)
        style = self.style or ("chat" if tokenizer is not None and has_chat_template(tokenizer) else "plain")
        if style == "chat" and tokenizer is not None:
            return chat_prompt(tokenizer, user, instruction)
        return f"{instruction}\n\n{user.strip()}\n"


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def read_answer(text: str) -> str | None:
    """The final answer in a generation: the last ``\\boxed{x}`` (Search-o1), else what follows the
    last "answer is" (the chain-of-thought prompts' "So the answer is: x."), up to the line's end
    without a closing period, else :func:`~prorag.evaluation.baselines.baseline_answer` (an
    ``<answer>`` tag, an "Answer:" line, the first line)."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip() or None
    at = text.lower().rfind("answer is")
    if at >= 0:
        answer = text[at + len("answer is") :].lstrip(": \t").split("\n", 1)[0].strip().rstrip(".").strip()
        return answer or None
    return baseline_answer(text, None)


_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def first_sentence(text: str) -> str:
    """The first sentence of a generation (IRCoT's reasoning step, FLARE's look-ahead): up to the
    first ``.``, ``!`` or ``?`` followed by a space or the end; a line that says "answer is" is taken
    whole, so that an answer with an initial ("J. Smith") is not cut."""
    line = text.strip().split("\n", 1)[0].strip()
    if "answer is" in line.lower():
        return line
    end = _SENTENCE_END.search(line)
    return line[: end.end()] if end else line


CHAIN_OF_THOUGHT = (
    "Answer the question using the documents. Reason step by step, one short sentence at a time, "
    "and end with 'So the answer is: <a few words>.'"
)


def cot_prompt(session: Session, question: str, hits: Sequence[Hit], sentences: Sequence[str] = ()) -> str:
    """The chain-of-thought prompt of Iter-RetGen, IRCoT and FLARE: :data:`CHAIN_OF_THOUGHT`, the
    documents, the question, then ``Answer:`` and the sentences written so far, to be continued."""
    user = f"Documents:\n{format_documents(hits)}\n\nQuestion: {question.strip()}"
    return session.head(CHAIN_OF_THOUGHT, user) + " ".join(["Answer:", *sentences])


def next_cot_line(
    session: Session, runs: Sequence[QuestionRun], *, max_tokens: int, logprobs: bool = False, suffix: str = ""
) -> list[Generation]:
    """Each run's chain of thought continued by one line (stop at a newline) from its documents: the
    step IRCoT and FLARE share. ``run.state`` holds ``docs`` (hits) and ``cot`` (sentences so far);
    ``suffix`` follows the prompt (IRCoT's read-out "So the answer is:")."""
    prompts = [cot_prompt(session, r.record.question, r.state["docs"], r.state["cot"]) + suffix for r in runs]
    return session.generate(runs, prompts, max_tokens=max_tokens, stop=("\n",), logprobs=logprobs)


class GeneratorBaseline(EvalBaseline):
    """An inference-time method on a :class:`TextGenerator`: a subclass sets :attr:`name`, its
    :attr:`Options` dataclass (the paper's defaults) and :meth:`run_batch`."""

    name: ClassVar[str] = ""
    Options: ClassVar[type | None] = None

    def __init__(self, options: Mapping[str, Any] | Any | None = None) -> None:
        if self.Options is None:
            raise TypeError(f"{type(self).__name__} declares no Options")
        if options is None:
            options = self.Options()
        elif isinstance(options, Mapping):
            options = config_from_dict(self.Options, dict(options), where=f"{self.name} baseline_options")
        self.options = options

    def run(self, engine: RolloutEngine, records: Sequence[Record], on_batch: Any, *, progress: bool = False) -> None:
        raise ValueError(f"the {self.name} baseline runs on a text generator (evaluate_generator), not on the rollout engine")

    def run_batch(self, session: Session, runs: list[QuestionRun]) -> None:
        """Run every question of ``runs`` to its end (set its ``answer`` and ``stop_reason``)."""
        raise NotImplementedError

    def run_generator(
        self, generator: TextGenerator, retriever: Retriever | None, records: Sequence[Record], config: EvalConfig
    ) -> Iterator[list[Trajectory]]:
        """The trajectories of ``records``, batch by batch (``config.rollout.batch_size`` questions)."""
        ro = config.rollout
        session = Session(generator, retriever, ro.top_k, ro.prompt_style)
        for start in range(0, len(records), ro.batch_size):
            runs = [QuestionRun(r) for r in records[start : start + ro.batch_size]]
            self.run_batch(session, runs)
            yield [run.to_trajectory(self.name) for run in runs]


def one_shot(
    name: str,
    baseline: EvalBaseline,
    generator: TextGenerator,
    retriever: Retriever | None,
    records: Sequence[Record],
    config: EvalConfig,
) -> Iterator[list[Trajectory]]:
    """A one-shot baseline (naive, standard RAG) on a generator: its own prompt (built by
    :meth:`EvalBaseline.prompts`, with the generator's tokenizer when it has one), one generation of
    at most ``max_action_tokens``, its retrievals recorded as the engine's harness records them."""
    ro = config.rollout
    session = Session(generator, retriever, ro.top_k, ro.prompt_style)
    tokenizer = getattr(generator, "tokenizer", None)
    for start in range(0, len(records), ro.batch_size):
        batch = records[start : start + ro.batch_size]
        prompts, searched = baseline.prompts(tokenizer, batch, retriever, ro.top_k, ro.prompt_style)
        runs = [QuestionRun(r, retrievals=list(searched.get(r.id, []))) for r in batch]
        for run, g in zip(runs, session.generate(runs, prompts, max_tokens=ro.max_action_tokens), strict=True):
            run.text, run.answer, run.stop_reason = g.text, baseline_answer(g.text, tokenizer), "answer"
        yield [run.to_trajectory(name) for run in runs]


def evaluate_generator(
    generator: TextGenerator,
    records: Sequence[Record],
    retriever: Retriever | None,
    out_dir: str | Path,
    config: EvalConfig,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate ``config.baseline`` run on ``generator`` over ``records``, resuming from ``out_dir``
    if it holds earlier predictions; the metrics add the mean searches, tokens and generations."""
    runner = config.baseline_runner()
    if runner is None:
        raise ValueError("evaluate_generator needs EvalConfig.baseline (a generator runs baselines, not the ProRAG loop)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records, todo = pending(records, out, config)
    by_id = {r.id: r for r in todo}
    batches = (
        runner.run_generator(generator, retriever, todo, config)
        if isinstance(runner, GeneratorBaseline)
        else one_shot(str(config.baseline), runner, generator, retriever, todo, config)
    )
    done = 0
    with JsonlAppender(out / "predictions.jsonl") as preds, JsonlAppender(out / "trajectories.jsonl") as trajs:
        for batch in batches:
            for t in batch:
                trajs.append(t.to_dict())
                row = score(by_id[t.id], t, t.answer)
                row |= {"searches": t.num_searches, "queries": [x["query"] for x in t.retrievals]}
                row |= {k: t.metadata[k] for k in (*COST_FIELDS[1:], "over_long_generations")}
                preds.append(row)
            done += len(batch)
            if progress:
                log.info("%s: %d/%d questions", config.baseline, done, len(todo))
    return finish(records, out, config, means=COST_FIELDS, totals=("over_long_generations",))


__all__ = [
    "COST_FIELDS",
    "GeneratorBaseline",
    "QuestionRun",
    "Session",
    "CHAIN_OF_THOUGHT",
    "first_sentence",
    "cot_prompt",
    "evaluate_generator",
    "one_shot",
    "read_answer",
]
