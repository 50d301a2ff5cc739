"""IRCoT (Trivedi et al., 2023, "Interleaving Retrieval with Chain-of-Thought Reasoning for
Knowledge-Intensive Multi-Step Questions") on a text generator.

The question retrieves the first documents; then, step by step, the model writes ONE
chain-of-thought sentence from the documents gathered so far and that sentence is the next
query, its documents added to the pool (duplicates dropped, at most ``max_docs``). It stops when
a sentence says "answer is" (the prompt's "So the answer is: x.") or at the step cap; a run cut by
the cap is read out by one more generation after "So the answer is:" (the paper's reader).

Defaults (:class:`IRCoTOptions`): documents per search = ``EvalConfig.rollout.top_k`` (the paper
tunes K per dataset), ``max_docs = 15`` (the paper's cap on the paragraphs kept), ``max_steps = 5``
reasoning sentences (the paper caps the steps; our cap is stated here, overridable),
``sentence_tokens = 64``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prorag.core.config import setting
from prorag.evaluation.baselines import EVAL_BASELINES
from prorag.evaluation.generator_eval import GeneratorBaseline, QuestionRun, Session, first_sentence, next_cot_line, read_answer


@dataclass
class IRCoTOptions:
    """IRCoT's settings."""

    max_steps: int = setting(5, help="Most chain-of-thought sentences (each but the last followed by a search).")
    max_docs: int = setting(15, help="Most documents kept in the pool.")
    sentence_tokens: int = setting(64, help="Tokens per generated sentence (and for the final read-out).")

    def __post_init__(self) -> None:
        if min(self.max_steps, self.max_docs, self.sentence_tokens) < 1:
            raise ValueError(f"ircot max_steps, max_docs and sentence_tokens must be >= 1, got {self}")


@EVAL_BASELINES.register("ircot", help="IRCoT: one retrieval per chain-of-thought sentence, interleaved")
class IRCoT(GeneratorBaseline):
    """IRCoT: one CoT sentence, a search with it, until "answer is" or the step cap."""

    name = "ircot"
    Options = IRCoTOptions

    def _add_docs(self, run: QuestionRun, hits: list) -> None:
        seen = {h.id for h in run.state["docs"]}
        run.state["docs"] += [h for h in hits if h.id not in seen][: self.options.max_docs - len(run.state["docs"])]

    def run_batch(self, session: Session, runs: list[QuestionRun]) -> None:
        o: IRCoTOptions = self.options
        for r, hits in zip(runs, session.search(runs, [r.record.question for r in runs], action=0), strict=True):
            r.state = {"docs": [], "cot": []}
            self._add_docs(r, hits)
        for step in range(o.max_steps):
            active = [r for r in runs if not r.done]
            gens = next_cot_line(session, active, max_tokens=o.sentence_tokens)
            for r, g in zip(active, gens, strict=True):
                sentence = first_sentence(g.text)
                if not sentence:
                    r.stop_reason = "empty"
                    continue
                r.state["cot"].append(sentence)
                if "answer is" in sentence.lower():
                    r.answer, r.stop_reason = read_answer(sentence), "answer"
            searching = [r for r in runs if not r.done] if step + 1 < o.max_steps else []
            for r, hits in zip(
                searching, session.search(searching, [r.state["cot"][-1] for r in searching], action=step + 1), strict=True
            ):
                self._add_docs(r, hits)
        unread = [r for r in runs if r.answer is None]
        readout = next_cot_line(session, unread, max_tokens=o.sentence_tokens, suffix=" So the answer is:")
        for r, g in zip(unread, readout, strict=True):
            r.state["cot"].append("So the answer is: " + first_sentence(g.text))
            r.answer = read_answer(r.state["cot"][-1])
            r.stop_reason = r.stop_reason or "max_steps"
        for r in runs:
            r.text = " ".join(r.state["cot"])
            r.state = {}


__all__ = ["IRCoT", "IRCoTOptions"]
