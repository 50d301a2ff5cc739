"""Search-o1-style agentic prompting (Li et al., 2025, "Search-o1: Agentic Search-Enhanced Large
Reasoning Models") on a text generator.

The model reasons and writes its own searches in Search-o1's tags::

    <|begin_search_query|> a query <|end_search_query|>

Generation stops at ``<|end_search_query|>``; the query is searched, and a separate generation,
Reason-in-Documents (:data:`REASON_IN_DOCUMENTS`), condenses the documents, given the reasoning so
far and the query, into the "Final Information" inserted back between ``<|begin_search_result|>``
and ``<|end_search_result|>``; the reasoning continues. The final answer is written as
``\\boxed{answer}``. A query asked again is answered "You have searched this query..." without a
search; past ``max_searches`` the model is told the limit is exceeded (as in the paper's code).
Defaults: :class:`SearchO1Options`.
"""

from __future__ import annotations

from dataclasses import dataclass

from prorag.core.config import setting
from prorag.evaluation.baselines import EVAL_BASELINES
from prorag.evaluation.generator_eval import GeneratorBaseline, QuestionRun, Session, read_answer
from prorag.retrieval.base import Hit, format_documents

BEGIN_QUERY, END_QUERY = "<|begin_search_query|>", "<|end_search_query|>"
BEGIN_RESULT, END_RESULT = "<|begin_search_result|>", "<|end_search_result|>"

INSTRUCTION = (
    "You are a reasoning assistant with the ability to perform searches to help you answer the user's question "
    "accurately. To perform a search, write " + BEGIN_QUERY + " your query here " + END_QUERY + ". "
    "The system will then search and analyze relevant documents and give you helpful information in the format "
    + BEGIN_RESULT
    + " ...search results... "
    + END_RESULT
    + ". You can search several times if necessary. The maximum number of search attempts is {max_searches}. "
    "When you have enough information, give the final answer, a few words only, as \\boxed{{answer}}."
)

REASON_IN_DOCUMENTS = (
    "You read documents to help a reasoning process. Given the previous reasoning steps, the current search query "
    "and the searched documents, extract the information in the documents that is relevant and helpful for the "
    "current search query, so that it fits into the reasoning. Write it after '**Final Information**'. If the "
    "documents hold nothing helpful, write '**Final Information**\nNo helpful information found.'"
)
FINAL_INFORMATION = "**Final Information**"


@dataclass
class SearchO1Options:
    """Search-o1's settings. ``max_searches = 5`` is the released code's limit for single-hop QA
    (it uses 10 for multi-hop); documents per search are ``EvalConfig.rollout.top_k`` (the paper
    retrieves 10)."""

    max_searches: int = setting(5, help="Most searches per question (then the model is told the limit is exceeded).")
    max_turns: int = setting(10, help="Most reasoning generations per question.")
    reasoning_tokens: int = setting(512, help="Tokens per reasoning generation.")
    condense_tokens: int = setting(256, help="Tokens per Reason-in-Documents generation.")

    def __post_init__(self) -> None:
        if min(self.max_searches, self.max_turns, self.reasoning_tokens, self.condense_tokens) < 1:
            raise ValueError(f"search-o1 settings must all be >= 1, got {self}")


def open_query(chunk: str) -> str | None:
    """The query of a reasoning chunk cut at ``<|end_search_query|>``: the text after its last
    ``<|begin_search_query|>``, or ``None`` when the chunk opens no query."""
    at = chunk.rfind(BEGIN_QUERY)
    if at < 0:
        return None
    return chunk[at + len(BEGIN_QUERY) :].strip() or None


def final_information(text: str) -> str:
    """The condensed information of a Reason-in-Documents reply: what follows ``**Final Information**``
    (the whole reply when the marker is missing)."""
    at = text.rfind(FINAL_INFORMATION)
    return (text[at + len(FINAL_INFORMATION) :] if at >= 0 else text).strip()


def result_block(info: str) -> str:
    """What is inserted after a query: its closing tag and the result between the result tags."""
    return f"{END_QUERY}\n\n{BEGIN_RESULT}\n{info}\n{END_RESULT}\n\n"


@EVAL_BASELINES.register(
    "search-o1", help="Search-o1: agentic search with the model's own search queries and a reason-in-documents step"
)
class SearchO1(GeneratorBaseline):
    """Search-o1: the model's own searches, Reason-in-Documents, an answer in ``\\boxed{}``."""

    name = "search-o1"
    Options = SearchO1Options

    def _condense_prompt(self, session: Session, run: QuestionRun, query: str, hits: list[Hit]) -> str:
        user = (
            f"Previous reasoning steps:\n{run.text.strip()}\n\nCurrent search query: {query}\n\n"
            f"Searched documents:\n{format_documents(hits)}"
        )
        return session.head(REASON_IN_DOCUMENTS, user)

    def run_batch(self, session: Session, runs: list[QuestionRun]) -> None:
        o: SearchO1Options = self.options
        heads = {
            r.record.id: session.head(INSTRUCTION.format(max_searches=o.max_searches), f"Question: {r.record.question}")
            for r in runs
        }
        for turn in range(o.max_turns):
            active = [r for r in runs if not r.done]
            gens = session.generate(
                active, [heads[r.record.id] + r.text for r in active], max_tokens=o.reasoning_tokens, stop=(END_QUERY,)
            )
            searching, queries = [], []
            for r, g in zip(active, gens, strict=True):
                r.text += g.text
                query = open_query(g.text) if g.finish_reason == "stop" else None
                if query is None:
                    r.stop_reason = "answer" if "\\boxed{" in g.text else ("eos" if g.finish_reason == "stop" else "length")
                elif query in r.state.setdefault("asked", []):
                    r.text += result_block("You have searched this query. Please refer to previous results.")
                elif len(r.retrievals) >= o.max_searches:
                    r.text += result_block("The maximum search limit is exceeded. You are not allowed to search.")
                else:
                    r.state["asked"].append(query)
                    searching.append(r)
                    queries.append(query)
            hits = session.search(searching, queries, action=turn)
            prompts = [self._condense_prompt(session, r, q, h) for r, q, h in zip(searching, queries, hits, strict=True)]
            for r, g in zip(searching, session.generate(searching, prompts, max_tokens=o.condense_tokens), strict=True):
                r.text += result_block(final_information(g.text))
        for r in runs:
            r.answer = read_answer(r.text.split(END_RESULT)[-1]) if r.text else None
            r.stop_reason = r.stop_reason or "max_turns"
            r.state = {}


__all__ = ["INSTRUCTION", "REASON_IN_DOCUMENTS", "SearchO1", "SearchO1Options", "final_information", "open_query"]
