"""HiPRAG's over-search equivalence judges: is an answer given without documents the same as the reference?

A search step is over-search when the policy, re-asked its sub-query with no documents, answers it
the way the step needed (:mod:`prorag.supervision.hiprag`). The question put to a judge is an
:class:`Equivalence`: the sub-query, the re-asked answer and the reference (the hop's gold
sub-answer on a record with a decomposition, else the step's own conclusion). Two judges
(:class:`~prorag.method.rewards.hiprag.OverSearchJudgeConfig`):

* ``oracle`` (:class:`OracleEquivalence`, default): exact match after SQuAD normalisation.
* ``llm`` (:class:`LLMEquivalence`): any OpenAI-compatible endpoint through the served client, asked
  with ``prompts/over_search.txt`` (or ``prompt_file``) for ``{"equivalent": "yes"}`` or ``"no"``.
  Anything else is *unparsable*: counted, logged, and judged not equivalent, so a talkative judge
  shows up as a count instead of inventing over-search. An exact match is equivalent without a request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prorag.core.metrics import exact_match
from prorag.method.rewards.hiprag import EquivalenceEndpointConfig, OverSearchJudgeConfig

log = logging.getLogger(__name__)

#: The shipped judge prompt; fields ``{question}``, ``{answer}``, ``{reference}``.
OVER_SEARCH_PROMPT = Path(__file__).with_name("prompts") / "over_search.txt"
PROMPT_FIELDS = ("{question}", "{answer}", "{reference}")


@dataclass(frozen=True)
class Equivalence:
    """One question to a judge: the sub-query, the answer re-asked without documents, the reference."""

    question: str
    answer: str
    reference: str


class EquivalenceJudge(Protocol):
    """Decides a batch of :class:`Equivalence` questions in one call, a verdict per question, in order."""

    def __call__(self, items: Sequence[Equivalence]) -> list[bool]: ...


class OracleEquivalence:
    """Equivalent when the answer equals the reference after normalisation (empty never matches)."""

    def __call__(self, items: Sequence[Equivalence]) -> list[bool]:
        return [bool(exact_match(i.answer, [i.reference])) for i in items]


def prompt_template(path: Path, fields: Sequence[str]) -> str:
    """A judge prompt file's text; one without all of ``fields`` is refused (it would judge nothing).
    Shared by every LLM judge (this one, ``acc_l``'s)."""
    text = path.read_text(encoding="utf-8")
    missing = [f for f in fields if f not in text]
    if missing:
        raise ValueError(f"{path}: a judge prompt needs the fields {', '.join(missing)}")
    return text


def judge_template(config: EquivalenceEndpointConfig) -> str:
    """The over-search judge prompt: ``prompt_file`` or the shipped one, with its three fields."""
    return prompt_template(Path(config.prompt_file) if config.prompt_file else OVER_SEARCH_PROMPT, PROMPT_FIELDS)


def equivalence_prompt(template: str, item: Equivalence) -> str:
    """The prompt of one question (``str.replace``, so braces in the texts are left alone)."""
    return template.replace("{question}", item.question).replace("{answer}", item.answer).replace("{reference}", item.reference)


def parse_equivalence(reply: str) -> bool | None:
    """``True``/``False`` for the reply ``{"equivalent": "yes"|"no"}`` (case and surrounding
    whitespace aside), ``None`` for anything else: strict, so prose or a second key is not guessed."""
    try:
        obj = json.loads(reply.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or list(obj) != ["equivalent"] or not isinstance(obj["equivalent"], str):
        return None
    return {"yes": True, "no": False}.get(obj["equivalent"].strip().lower())


class LLMEquivalence:
    """The ``llm`` judge (module docstring). ``generator`` defaults to the served client of ``config``
    (:class:`~prorag.models.served.ServedGenerator`: concurrency, retries with backoff on 429/5xx, the
    key from ``api_key_env``, greedy replies cached by the hash of model and prompt, on disk with
    ``cache_path``); ``asked`` and ``unparsable`` count the questions sent and the replies not read
    (:func:`parse_equivalence`). An exact match is equivalent without a request: no judge would say
    otherwise, and it saves the call."""

    def __init__(self, config: EquivalenceEndpointConfig, generator: Any = None) -> None:
        self.config = config
        self.template = judge_template(config)
        if generator is None:
            from prorag.models.served import ServedGenerator  # the client (httpx, asyncio): when a judge is built

            generator = ServedGenerator(config)
        self.generator = generator
        self.asked = 0
        self.unparsable = 0

    def __call__(self, items: Sequence[Equivalence]) -> list[bool]:
        verdicts = {i: True for i in items if exact_match(i.answer, [i.reference])}
        todo = list(dict.fromkeys(i for i in items if i not in verdicts))
        if todo:
            prompts = [equivalence_prompt(self.template, i) for i in todo]
            replies = self.generator.generate(prompts, max_tokens=self.config.max_tokens, temperature=0.0)
            self.asked += len(todo)
            for item, reply in zip(todo, replies, strict=True):
                verdict = parse_equivalence(reply.text)
                if verdict is None:
                    self.unparsable += 1
                    log.warning(
                        "over-search judge: unparsable reply %r to %r (judged not equivalent)", reply.text[:200], item.question
                    )
                verdicts[item] = bool(verdict)
        return [verdicts[i] for i in items]


ORACLE = OracleEquivalence()


def equivalence_judge(config: OverSearchJudgeConfig) -> EquivalenceJudge:
    """The judge ``config`` names (its endpoint and prompt checked now, before any rollout)."""
    if config.judge == "llm":
        assert config.llm is not None  # OverSearchJudgeConfig refuses llm without an endpoint
        return LLMEquivalence(config.llm)
    return ORACLE


__all__ = [
    "ORACLE",
    "OVER_SEARCH_PROMPT",
    "Equivalence",
    "EquivalenceJudge",
    "LLMEquivalence",
    "OracleEquivalence",
    "equivalence_judge",
    "equivalence_prompt",
    "judge_template",
    "parse_equivalence",
    "prompt_template",
]
