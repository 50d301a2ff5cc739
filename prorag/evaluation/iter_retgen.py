"""Iter-RetGen (Shao et al., 2023, "Enhancing Retrieval-Augmented Large Language Models with
Iterative Retrieval-Generation Synergy") on a text generator.

Round 1 retrieves with the question; round t > 1 retrieves with the question followed by round
t-1's generation (the paper's ``y_{t-1} || q``); every round generates a chain-of-thought answer
from that round's documents and the question. The answer is read from the last round.

Defaults (:class:`IterRetGenOptions`, ``EvalConfig.baseline_options``): ``rounds = 3`` (T = 3 as in
the ProRAG comparison and FlashRAG's reimplementation; the paper sweeps T), documents per round =
``EvalConfig.rollout.top_k``, ``max_tokens = 128`` per generation.
"""

from __future__ import annotations

from dataclasses import dataclass

from prorag.core.config import setting
from prorag.evaluation.baselines import EVAL_BASELINES
from prorag.evaluation.generator_eval import GeneratorBaseline, QuestionRun, Session, cot_prompt, read_answer


@dataclass
class IterRetGenOptions:
    """Iter-RetGen's settings."""

    rounds: int = setting(3, help="Retrieval-generation rounds T (round t > 1 searches with question + previous generation).")
    max_tokens: int = setting(128, help="Tokens per generation.")

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.max_tokens < 1:
            raise ValueError(f"iter-retgen rounds and max_tokens must be >= 1, got {self.rounds} and {self.max_tokens}")


@EVAL_BASELINES.register(
    "iter-retgen", help="Iter-RetGen: retrieval with the question and the last generation, for a fixed number of rounds"
)
class IterRetGen(GeneratorBaseline):
    """Iter-RetGen: T rounds of (search with question + last generation, generate)."""

    name = "iter-retgen"
    Options = IterRetGenOptions

    def run_batch(self, session: Session, runs: list[QuestionRun]) -> None:
        o: IterRetGenOptions = self.options
        last = [""] * len(runs)
        for t in range(o.rounds):
            queries = [f"{r.record.question.strip()} {y.strip()}".strip() for r, y in zip(runs, last, strict=True)]
            hits = session.search(runs, queries, action=t)
            prompts = [cot_prompt(session, r.record.question, h) for r, h in zip(runs, hits, strict=True)]
            gens = session.generate(runs, prompts, max_tokens=o.max_tokens)
            last = [g.text for g in gens]
            for r, g in zip(runs, gens, strict=True):
                r.text += f"[round {t + 1}] {g.text.strip()}\n"
        for r, y in zip(runs, last, strict=True):
            r.answer, r.stop_reason = read_answer(y), "rounds"


__all__ = ["IterRetGen", "IterRetGenOptions"]
