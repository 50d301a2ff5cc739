"""FLARE-direct (Jiang et al., 2023, "Active Retrieval Augmented Generation") on a text generator.

The answer is written sentence by sentence. Each step first generates a look-ahead: the next
sentence, with its tokens' log-probabilities. If every token's probability is at least
``theta``, the sentence is kept as it is; otherwise the sentence, with its tokens of probability
below ``mask_below`` masked out (the paper's masked query), is a search query, the documents
are replaced by its results, and the sentence is generated again from them. The run ends when a
sentence says "answer is", when the model stops by itself after a sentence, or at
``max_sentences``. As in the paper, the question retrieves the first documents (``initial_retrieval``).

Needs token log-probabilities (``generate(..., logprobs=True)``): a local model, or a served one
that returns them. Defaults (:class:`FLAREOptions`): ``theta = 0.4`` (the paper sweeps the
threshold, and FlashRAG's reimplementation uses 0.2), ``mask_below = 0.4``,
``look_ahead_tokens = 64``, ``max_sentences = 8``, documents per search = ``EvalConfig.rollout.top_k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prorag.core.config import setting
from prorag.evaluation.baselines import EVAL_BASELINES
from prorag.evaluation.generator_eval import GeneratorBaseline, QuestionRun, Session, first_sentence, next_cot_line, read_answer
from prorag.models.generator import Generation


@dataclass
class FLAREOptions:
    """FLARE's settings."""

    theta: float = setting(0.4, help="Retrieve when any look-ahead token's probability is below this.")
    mask_below: float = setting(0.4, help="Tokens of probability below this are left out of the search query.")
    look_ahead_tokens: int = setting(64, help="Tokens per look-ahead (and per regenerated sentence).")
    max_sentences: int = setting(8, help="Most sentences in an answer.")
    initial_retrieval: bool = setting(True, help="Retrieve with the question before the first sentence.")

    def __post_init__(self) -> None:
        if not (0.0 < self.theta <= 1.0 and 0.0 <= self.mask_below <= 1.0):
            raise ValueError(f"flare theta must be in (0, 1] and mask_below in [0, 1], got {self.theta} and {self.mask_below}")
        if self.look_ahead_tokens < 1 or self.max_sentences < 1:
            raise ValueError(f"flare look_ahead_tokens and max_sentences must be >= 1, got {self}")


def sentence_tokens(g: Generation) -> tuple[str, list[str], list[float]]:
    """The first sentence of a look-ahead with the tokens that write it and their log-probabilities."""
    if g.token_logprobs is None or g.tokens is None:
        raise ValueError(
            "FLARE needs token log-probabilities; the generator returned none (a served model must support logprobs)"
        )
    sentence = first_sentence(g.text)
    kept, written = 0, ""
    while kept < len(g.tokens) and len(written.strip()) < len(sentence):
        written += g.tokens[kept]
        kept += 1
    return sentence, g.tokens[:kept], g.token_logprobs[:kept]


def masked_query(tokens: list[str], logprobs: list[float], mask_below: float, fallback: str) -> str:
    """The look-ahead without its low-confidence tokens (FLARE's masked query), or ``fallback``
    when nothing is left."""
    floor = math.log(mask_below) if mask_below > 0 else -math.inf
    query = "".join(t for t, lp in zip(tokens, logprobs, strict=True) if lp >= floor).strip()
    return query or fallback


@EVAL_BASELINES.register(
    "flare", help="FLARE: retrieves again when the next sentence holds a low-probability token (needs token log-probabilities)"
)
class FLARE(GeneratorBaseline):
    """FLARE-direct: search with a low-confidence look-ahead sentence and regenerate it."""

    name = "flare"
    Options = FLAREOptions

    def _keep(self, run: QuestionRun, sentence: str, g: Generation) -> None:
        """Add a sentence; end the run on an answer or when the model stopped right after it."""
        if not sentence:
            run.stop_reason = "eos"
            return
        run.state["cot"].append(sentence)
        if "answer is" in sentence.lower():
            run.stop_reason = "answer"
        elif g.finish_reason == "stop" and g.text.strip() == sentence:
            run.stop_reason = "eos"

    def run_batch(self, session: Session, runs: list[QuestionRun]) -> None:
        o: FLAREOptions = self.options
        for r in runs:
            r.state = {"docs": [], "cot": []}
        if o.initial_retrieval:
            for r, hits in zip(runs, session.search(runs, [r.record.question for r in runs], action=0), strict=True):
                r.state["docs"] = hits
        theta = math.log(o.theta)
        for step in range(o.max_sentences):
            active = [r for r in runs if not r.done]
            ahead = next_cot_line(session, active, max_tokens=o.look_ahead_tokens, logprobs=True)
            unsure, queries = [], []
            for r, g in zip(active, ahead, strict=True):
                sentence, tokens, lps = sentence_tokens(g)
                if sentence and any(lp < theta for lp in lps):
                    unsure.append(r)
                    queries.append(masked_query(tokens, lps, o.mask_below, sentence))
                else:
                    self._keep(r, sentence, g)
            for r, hits in zip(unsure, session.search(unsure, queries, action=step + 1), strict=True):
                r.state["docs"] = hits
            again = next_cot_line(session, unsure, max_tokens=o.look_ahead_tokens)
            for r, g in zip(unsure, again, strict=True):
                self._keep(r, first_sentence(g.text), g)
        for r in runs:
            r.text = " ".join(r.state["cot"])
            r.answer = read_answer(r.text) if r.text else None
            r.stop_reason = r.stop_reason or "max_sentences"
            r.state = {}


__all__ = ["FLARE", "FLAREOptions", "masked_query", "sentence_tokens"]
