"""Step judges: which of two sibling steps is the logically valid one (docs/METHOD.md §2, stage 2).

A judge labels one sibling chosen (valid) and one rejected (invalid), or none; Q and N are hints
only, since a lucky step can lead to a right answer and a valid one can sit in a failed branch.
One interface (:class:`Judge`: :class:`JudgeRequest` in, :class:`Judgement` or None out).

``oracle`` (:class:`OracleJudge`) replays the history against the gold decomposition
(:func:`step_verdict`): a search is valid iff it targets an open hop (names its subject and, where
known, asks its relation) and repeats no earlier sub-query; a conclusion iff its sub-answer matches
an open hop's gold and the retrieved documents contain it; an answer iff correct *and* grounded in
the history (:func:`answer_grounded`: a right guess is a hallucination); malformed is invalid.
:func:`choose_pair` takes the valid sibling of highest Q and the invalid one of lowest Q.
``llm`` (:class:`LLMJudge`): any OpenAI-compatible chat model asked for strict JSON
(:func:`parse_judgement`), through the teacher's cached, retried client.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from prorag.agent.gold import gold_hops
from prorag.agent.schema import parse_trajectory
from prorag.core.lazy_modules import lazy_module
from prorag.core.metrics import exact_match, normalize_answer
from prorag.data.records import Record
from prorag.supervision.llm_teacher import ChatClient, LLMTeacherConfig, LLMTeacherError, LLMUsage

if TYPE_CHECKING:
    import asyncio
else:
    asyncio = lazy_module("asyncio")  # 40 ms: imported by the first judged batch, not for --help


@dataclass(frozen=True)
class StepView:
    """What a judge sees of one action: its kind, content (sub-query, sub-answer or answer),
    I_step, its text as written, and after a search the retrieved text."""

    kind: str | None
    content: str
    well_formed: bool = True
    text: str = ""
    retrieval_text: str = ""


@dataclass(frozen=True)
class Candidate:
    """One sibling step with the tree's statistics (hints for the judge)."""

    step: StepView
    q: float
    n: int


@dataclass
class JudgeRequest:
    """One set of siblings to judge: the question's record, the history that leads to them
    (``context_text`` is that history as the policy saw it, for an LLM) and the candidates."""

    id: str
    record: Record
    history: list[StepView]
    candidates: list[Candidate]
    context_text: str = ""


@dataclass(frozen=True)
class Judgement:
    """Indices (into the request's candidates) of the chosen and the rejected step, and why.

    ``verdicts`` holds ``(valid, reason)`` for every candidate when the judge labels each one
    (the oracle does; an LLM judge names only its pair): with it, every valid sibling can be
    paired with every invalid one (``PairsConfig.pairs_per_set = "all"``)."""

    chosen: int
    rejected: int
    reason: str
    verdicts: tuple[tuple[bool, str], ...] | None = None


class Judge(Protocol):
    name: str

    def judge(self, requests: Sequence[JudgeRequest]) -> list[Judgement | None]: ...


def choose_pair(valid: Sequence[bool], q: Sequence[float], n: Sequence[int]) -> tuple[int, int] | None:
    """Chosen = the valid sibling with the highest Q (then most visits), rejected = the invalid
    one with the lowest Q (then most visits: the most surely bad); None when the siblings are
    all valid or all invalid (no pair from equally good or equally bad steps)."""
    good = [i for i, v in enumerate(valid) if v]
    bad = [i for i, v in enumerate(valid) if not v]
    if not good or not bad:
        return None
    chosen = max(good, key=lambda i: (q[i], n[i], -i))
    rejected = min(bad, key=lambda i: (q[i], -n[i], i))
    return chosen, rejected


# ----------------------------------------------------------------------------- the oracle


#: Question words and glue that say nothing about which hop a query targets.
_FUNCTION_WORDS = frozenset(
    "who whom whose what which when where why how is are was were be been do does did of in on at to for by from with "
    "and or as its his her their it this that".split()
)


@dataclass(frozen=True)
class GoldHop:
    """A hop of the gold decomposition, as the oracle uses it."""

    question: str
    query: str
    answer: str
    subject: str | None
    """The entity the hop asks about, when known (the world's ``subject``, MuSiQue's
    ``"Entity >> relation"`` left side)."""
    relation: frozenset[str] = frozenset()
    """Stems of the content words of the hop's gold sub-query other than its subject (``founder``
    for ``"Nurun founder"``): what a sub-query must ask besides naming the subject. Empty when
    the decomposition gives no gold sub-query (MuSiQue), where naming the subject is enough."""
    depends_on: frozenset[int] = frozenset()
    """Hops whose answers this hop needs (its subject, or a ``#k`` reference)."""


def hop_subject(raw: dict[str, Any]) -> str | None:
    """The entity a raw decomposition hop asks about: its ``subject`` field (built-in world),
    else the left side of MuSiQue's ``"Entity >> relation"`` (resolved form), else None."""
    if raw.get("subject"):
        return str(raw["subject"])
    question = str(raw.get("question_resolved") or raw.get("question") or "")
    if ">>" in question:
        left = question.split(">>", 1)[0].strip()
        if left and not left.startswith("#"):
            return left
    return None


def oracle_hops(record: Record) -> list[GoldHop]:
    """The record's gold hops with their subjects and dependencies (MuSiQue's ``#k`` references
    in the unresolved question; in the world, a subject that is an earlier hop's answer)."""
    raw_hops = record.metadata.get("decomposition") or []
    out: list[GoldHop] = []
    for i, (raw, hop) in enumerate(zip(raw_hops, gold_hops(record), strict=True)):
        subject = hop_subject(raw)
        deps = {int(k) - 1 for k in re.findall(r"#(\d+)", str(raw.get("question", "")))}
        if subject is not None:
            deps |= {j for j in range(i) if normalize_answer(out[j].answer) == normalize_answer(subject)}
        relation = relation_stems(str(raw["query"]), subject) if raw.get("query") and subject else frozenset()
        out.append(
            GoldHop(
                hop.question,
                hop.query,
                hop.answer,
                subject,
                depends_on=frozenset(d for d in deps if 0 <= d < i),
                relation=relation,
            )
        )
    return out


def stem(word: str) -> str:
    """A crude suffix stripper, enough to equate a relation's word forms (``founder``/``founded``,
    ``director``/``directed``, ``works``/``work``, ``based``/``base``) without a stemming library."""
    for suffix in ("ing", "ed", "er", "or", "es", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def relation_stems(query: str, subject: str | None) -> frozenset[str]:
    """Stems of a sub-query's content words, leaving out the subject's words and function words."""
    drop = set(normalize_answer(subject).split()) if subject else set()
    return frozenset(stem(w) for w in normalize_answer(query).split() if w not in _FUNCTION_WORDS and w not in drop)


def mentions(text: str, phrase: str) -> bool:
    """Whether the normalised ``phrase`` occurs in the normalised ``text`` as whole words."""
    p = normalize_answer(phrase)
    return bool(p) and f" {p} " in f" {normalize_answer(text)} "


def targets(query: str, hop: GoldHop) -> bool:
    """Whether a sub-query asks for ``hop``.

    With a known subject it must name it and, when the hop's relation is known, ask that
    relation: more than half of the relation stems of the sub-query and of the gold sub-query
    together are shared (Jaccard > 1/2). That tells ``"Nurun founder"`` from ``"Nurun founded
    year"`` and ``"Siril born"`` from ``"Siril birth year"``, and accepts ``"Saenax directed by"``
    for ``"Saenax director"``. It is lexical: a synonym the gold sub-query lacks
    (``"birthplace"`` for ``"born"``) is not recognised. Without a known subject, the sub-query
    must hold at least half of the content words of the hop's own query."""
    if hop.subject:
        if not mentions(query, hop.subject):
            return False
        if not hop.relation:
            return True
        asked = relation_stems(query, hop.subject)
        return 2 * len(asked & hop.relation) > len(asked | hop.relation)
    wanted = {w for w in normalize_answer(hop.query).split() if w not in _FUNCTION_WORDS}
    have = set(normalize_answer(query).split())
    return bool(wanted) and len(wanted & have) * 2 >= len(wanted)


@dataclass
class Progress:
    """What a history has achieved: resolved hops, sub-queries asked, text retrieved."""

    resolved: set[int] = field(default_factory=set)
    queries: set[str] = field(default_factory=set)
    evidence: list[str] = field(default_factory=list)

    def open_hops(self, hops: Sequence[GoldHop]) -> list[int]:
        """Hops not resolved whose inputs are: the hops a valid next step may work on."""
        return [i for i, h in enumerate(hops) if i not in self.resolved and h.depends_on <= self.resolved]


def conclusion_hop(content: str, hops: Sequence[GoldHop], progress: Progress) -> int | None:
    """The open hop whose gold sub-answer the conclusion states (normalised equality), if any."""
    said = normalize_answer(content)
    return next((i for i in progress.open_hops(hops) if said and said == normalize_answer(hops[i].answer)), None)


def replay(hops: Sequence[GoldHop], history: Sequence[StepView]) -> Progress:
    """Walk the history: searches add their sub-query and retrieved text; a conclusion that
    states an open hop's gold sub-answer resolves that hop (supported or not: the history is
    what it is, only the candidate step is judged)."""
    progress = Progress()
    for step in history:
        if step.kind == "search":
            progress.queries.add(normalize_answer(step.content))
            progress.evidence.append(step.retrieval_text)
        elif step.kind == "conclude":
            hop = conclusion_hop(step.content, hops, progress)
            if hop is not None:
                progress.resolved.add(hop)
    return progress


def answer_grounded(content: str, hops: Sequence[GoldHop], progress: Progress) -> bool:
    """Whether the history has worked a final answer out: every hop is resolved, or every hop but
    the last is and the answer is the last hop's sub-answer, found in the retrieved documents
    (answering straight from the last retrieval, without a conclusion step first). A comparison's
    answer is not a hop's sub-answer, so it needs every hop resolved. No decomposition: True."""
    unresolved = [i for i in range(len(hops)) if i not in progress.resolved]
    if not unresolved:
        return True
    last = len(hops) - 1
    return (
        unresolved == [last]
        and normalize_answer(content) == normalize_answer(hops[last].answer)
        and any(mentions(text, hops[last].answer) for text in progress.evidence)
    )


def step_verdict(record: Record, history: Sequence[StepView], step: StepView) -> tuple[bool, str]:
    """The oracle's rule for one step after ``history`` (see the module docstring); returns
    ``(valid, reason)``."""
    if not step.well_formed:
        return False, "malformed action"
    hops = oracle_hops(record)
    progress = replay(hops, history)
    if step.kind == "answer":
        if not exact_match(step.content, record.golden_answers):
            return False, f"wrong final answer {step.content!r}"
        if not answer_grounded(step.content, hops, progress):
            return False, "correct final answer, but the history has not worked it out (a guess)"
        return True, "correct final answer"
    if step.kind == "search":
        if normalize_answer(step.content) in progress.queries:
            return False, "redundant: repeats an earlier sub-query"
        hit = next((i for i in progress.open_hops(hops) if targets(step.content, hops[i])), None)
        if hit is not None:
            return True, f"searches open hop {hit + 1} ({hops[hit].question})"
        done = next((i for i in sorted(progress.resolved) if targets(step.content, hops[i])), None)
        if done is not None:
            return False, f"redundant: hop {done + 1} is already resolved"
        named = next((i for i in progress.open_hops(hops) if hops[i].subject and mentions(step.content, hops[i].subject)), None)
        if named is not None:
            return False, f"names open hop {named + 1}'s subject but asks another relation"
        return False, "the sub-query targets no open hop"
    if step.kind == "conclude":
        hop = conclusion_hop(step.content, hops, progress)
        if hop is None:
            return False, f"sub-answer {step.content!r} agrees with no open hop's gold sub-answer"
        if not any(mentions(text, hops[hop].answer) for text in progress.evidence):
            return False, f"sub-answer of hop {hop + 1} is not supported by the retrieved documents"
        return True, f"supported, correct sub-answer of hop {hop + 1}"
    return False, "no action kind"


def trajectory_verdicts(record: Record, text: str) -> list[tuple[bool, str]]:
    """The oracle's verdict on every action of a whole trajectory (its text with tags), each
    judged after the actions before it: how a PRM's scores of fresh samples are checked."""
    history: list[StepView] = []
    out = []
    for action in parse_trajectory(text).actions:
        kind = action.kind.value if action.kind is not None else None
        step = StepView(kind, action.content, action.well_formed, "", action.retrieval or "")
        out.append(step_verdict(record, history, step))
        history.append(step)
    return out


class OracleJudge:
    """The offline judge of gold decompositions (see the module docstring)."""

    name = "oracle"

    def judge(self, requests: Sequence[JudgeRequest]) -> list[Judgement | None]:
        return [self.judge_one(r) for r in requests]

    def verdicts(self, request: JudgeRequest) -> tuple[tuple[bool, str], ...] | None:
        """``(valid, reason)`` of every candidate (:func:`step_verdict`), or None for a question
        without a gold decomposition: the per-step labels of ``PairsConfig.pointwise``."""
        if not request.record.metadata.get("decomposition"):
            return None
        return tuple(step_verdict(request.record, request.history, c.step) for c in request.candidates)

    def judge_one(self, request: JudgeRequest) -> Judgement | None:
        verdicts = self.verdicts(request)
        if verdicts is None:
            return None
        pick = choose_pair([v for v, _ in verdicts], [c.q for c in request.candidates], [c.n for c in request.candidates])
        if pick is None:
            return None
        chosen, rejected = pick
        reason = f"chosen: {verdicts[chosen][1]}; rejected: {verdicts[rejected][1]}"
        return Judgement(chosen, rejected, reason, tuple(verdicts))


# ----------------------------------------------------------------------------- the LLM judge


JUDGE_SYSTEM_PROMPT = (
    "You judge the reasoning steps of a question-answering agent that searches a document collection. "
    "Each step is a thought followed by one action: a search (<subquery>), an intermediate conclusion "
    "(<subanswer>) or the final answer (<answer>). You are shown the question, its reference answer, the "
    "history so far (with the documents retrieved) and several candidate next steps. Judge each candidate "
    "by strict logical validity: a step is invalid if it states something the retrieved documents do not "
    "support (hallucination), draws a wrong or illogical conclusion, or searches again for something already "
    "known (redundant search). Q (how often continuing from the step reached a correct answer) and N (how "
    "often it was tried) come from a tree search: they are hints only, never a reason by themselves.\n"
    "Reply with one JSON object and nothing else: "
    '{"chosen": <number of the best valid candidate>, "rejected": <number of an invalid candidate>, '
    '"reason": "<one sentence>"}, or {"chosen": null, "rejected": null, "reason": "<one sentence>"} '
    "when the candidates are all valid or all invalid."
)

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_judgement(text: str, n_candidates: int) -> Judgement | None:
    """Read a judge's JSON reply (candidates numbered from 1; a surrounding code fence is
    tolerated). Returns the judgement (0-based), None for an explicit "no pair", and raises
    ``ValueError`` saying what is wrong otherwise."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        raise ValueError("reply is not JSON") from None
    if not isinstance(obj, dict) or not {"chosen", "rejected"} <= obj.keys():
        raise ValueError("reply lacks chosen/rejected")
    chosen, rejected, reason = obj["chosen"], obj["rejected"], obj.get("reason", "")
    if chosen is None and rejected is None:
        return None
    for v in (chosen, rejected):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= n_candidates:
            raise ValueError("candidate number out of range")
    if chosen == rejected:
        raise ValueError("chosen equals rejected")
    return Judgement(chosen - 1, rejected - 1, str(reason))


def judge_messages(request: JudgeRequest, max_context_chars: int = 6000) -> list[dict[str, str]]:
    """The chat messages of one request: question, reference answer, history (cut from the
    left if long, the latest steps matter most) and the numbered candidates with Q and N."""
    history = request.context_text.strip() or "(no steps yet)"
    if len(history) > max_context_chars:
        history = "…" + history[-max_context_chars:]
    lines = [
        f"Question: {request.record.question}",
        f"Reference answer: {' | '.join(request.record.golden_answers)}",
        "",
        "History so far:",
        history,
        "",
        "Candidate next steps:",
    ]
    for i, c in enumerate(request.candidates, start=1):
        lines.append(f"[{i}] (Q={c.q:.2f}, N={c.n}) {' '.join(c.step.text.split())}")
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]


class LLMJudge:
    """A chat model as judge, through :class:`~prorag.supervision.llm_teacher.ChatClient` (the teacher's
    client: concurrency limit, retries, validating reply cache, usage counts)."""

    name = "llm"

    def __init__(self, config: LLMTeacherConfig, **client_kwargs: Any) -> None:
        self.config = config
        self.client = ChatClient(config, **client_kwargs)
        self.failed = 0
        """Requests with no acceptable reply after every retry (they give no pair)."""

    @property
    def usage(self) -> LLMUsage:
        return self.client.usage

    def judge(self, requests: Sequence[JudgeRequest]) -> list[Judgement | None]:
        return asyncio.run(self._judge(requests))

    async def _judge(self, requests: Sequence[JudgeRequest]) -> list[Judgement | None]:
        def check(n: int):  # noqa: ANN202 - a ChatClient check
            def accept(text: str) -> str | None:
                try:
                    parse_judgement(text, n)
                except ValueError as e:
                    return str(e)
                return None

            return accept

        async with self.client:
            try:
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(self.client.complete(judge_messages(r), check(len(r.candidates)))) for r in requests]
            except ExceptionGroup as group:
                fatal = [e for e in group.exceptions if isinstance(e, LLMTeacherError)]
                if fatal:
                    raise fatal[0] from None
                raise
        out: list[Judgement | None] = []
        for r, task in zip(requests, tasks, strict=True):
            text = task.result()
            if text is None:
                self.failed += 1
                out.append(None)
            else:
                out.append(parse_judgement(text, len(r.candidates)))
        return out


__all__ = [
    "Candidate",
    "GoldHop",
    "JUDGE_SYSTEM_PROMPT",
    "Judge",
    "JudgeRequest",
    "Judgement",
    "LLMJudge",
    "OracleJudge",
    "Progress",
    "StepView",
    "answer_grounded",
    "choose_pair",
    "conclusion_hop",
    "hop_subject",
    "judge_messages",
    "mentions",
    "oracle_hops",
    "parse_judgement",
    "replay",
    "step_verdict",
    "trajectory_verdicts",
    "targets",
]
