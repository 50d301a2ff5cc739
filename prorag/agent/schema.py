"""The ProRAG trajectory format, shared by every stage (docs/METHOD.md §1): tags, parsers, I_step, I_traj.

Actions: ``<step> t </step>`` then ``<subquery> q </subquery>`` (search; the environment appends
``<retrieval>`` with one ``Doc i(Title: t) text`` per line, never a target), ``<subanswer>`` or
``<answer>`` (terminal). :func:`render_trajectory` is the one layout: no whitespace between an
action's blocks, one space inside, one newline (:data:`BLOCK_SEPARATOR`) between blocks; the parser
is more tolerant (any whitespace), and ``parse(render(x)) == x``. Only the ten exact tag strings are
tags (single special tokens); look-alikes are text. After a search or conclusion the environment
writes the next ``<step>`` opener, so :attr:`TokenAction.span` starts at the first model-written token.
:func:`i_traj` accepts actions ending in exactly one answer, each search followed by its retrieval;
re-searches and non-search conclusions are allowed (the rewards judge them), ``strict=True`` is the
reference grammar ``(S Q R S A)* S F``. :func:`i_step`: exactly ``<step> T </step><X> C </X>``, T, C
non-empty, no tag inside. The text (:func:`parse_trajectory`) and token (:func:`parse_token_actions`)
parsers run one never-raising state machine, so they cut any input alike; an action ends at its stop
tag, a retrieval tag or an environment token, and a retrieval block is opaque.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from prorag.retrieval.base import Hit, format_documents

STEP_OPEN = "<step>"
STEP_CLOSE = "</step>"
SUBQUERY_OPEN = "<subquery>"
SUBQUERY_CLOSE = "</subquery>"
RETRIEVAL_OPEN = "<retrieval>"
RETRIEVAL_CLOSE = "</retrieval>"
SUBANSWER_OPEN = "<subanswer>"
SUBANSWER_CLOSE = "</subanswer>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

#: The ten tags, in this order; each is one special token of the tokenizer (prorag.models.tags).
TAGS: tuple[str, ...] = (
    STEP_OPEN,
    STEP_CLOSE,
    SUBQUERY_OPEN,
    SUBQUERY_CLOSE,
    RETRIEVAL_OPEN,
    RETRIEVAL_CLOSE,
    SUBANSWER_OPEN,
    SUBANSWER_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
)

#: Generation stops after any of these (or end-of-sequence): one call writes one action.
STOP_TAGS: tuple[str, ...] = (SUBQUERY_CLOSE, SUBANSWER_CLOSE, ANSWER_CLOSE)

#: Per-token loss weights of the control tokens in the format-aware SFT loss, as in the
#: reference code (the answer tags weigh most, then the action tags, then ``</step>``); every
#: other tag and every ordinary token weighs 1. Read-only.
CONTROL_TAG_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {
        STEP_OPEN: 1.0,
        STEP_CLOSE: 2.0,
        SUBQUERY_OPEN: 3.0,
        SUBQUERY_CLOSE: 3.0,
        RETRIEVAL_OPEN: 1.0,
        RETRIEVAL_CLOSE: 1.0,
        SUBANSWER_OPEN: 3.0,
        SUBANSWER_CLOSE: 3.0,
        ANSWER_OPEN: 5.0,
        ANSWER_CLOSE: 5.0,
    }
)

#: What separates consecutive blocks (actions, retrieval blocks) in a rendered trajectory.
BLOCK_SEPARATOR = "\n"


class ActionKind(Enum):
    """The three kinds of action; the value is the name used in files and logs."""

    SEARCH = "search"
    CONCLUDE = "conclude"
    ANSWER = "answer"


#: The (opening, closing) tag pair of each kind's content block.
ACTION_TAGS: Mapping[ActionKind, tuple[str, str]] = MappingProxyType(
    {
        ActionKind.SEARCH: (SUBQUERY_OPEN, SUBQUERY_CLOSE),
        ActionKind.CONCLUDE: (SUBANSWER_OPEN, SUBANSWER_CLOSE),
        ActionKind.ANSWER: (ANSWER_OPEN, ANSWER_CLOSE),
    }
)

_KIND_OF_OPENER = {opener: kind for kind, (opener, _) in ACTION_TAGS.items()}
_KIND_OF_CLOSER = {closer: kind for kind, (_, closer) in ACTION_TAGS.items()}
_TAG_RE = re.compile("|".join(re.escape(tag) for tag in TAGS))


@dataclass(frozen=True)
class Action:
    """One action of a trajectory, as rendered or as parsed from text.

    ``kind`` is ``None`` only for a malformed action that has no action tag at all (e.g. a
    completion cut mid-thought). ``thought`` and ``content`` (the sub-query, sub-answer or
    answer) are stripped; for a malformed action they are a best effort (the text after
    ``<step>`` / after the action tag, up to the next tag; ``""`` when absent).
    ``retrieval`` is the environment's text that followed a search action (stripped, without
    the tags), ``None`` for other kinds or when it is missing.

    ``char_span`` is ``[start, end)`` in the parsed string: from ``<step>`` through the
    action's closing tag, excluding the retrieval block. ``token_span`` is left ``None`` by
    the text parser; a rollout engine that knows the token ids may fill it in from
    :func:`parse_token_actions`. ``errors`` says why a malformed action is malformed.
    """

    kind: ActionKind | None
    thought: str
    content: str
    retrieval: str | None = None
    well_formed: bool = True
    char_span: tuple[int, int] = (0, 0)
    token_span: tuple[int, int] | None = None
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParsedTrajectory:
    """The result of :func:`parse_trajectory`.

    ``valid`` is I_traj (the grammar of the module docstring, two searches in a row and
    non-search conclusions allowed); ``strict_valid`` is I_traj under the reference code's
    grammar ``(S Q R S A)* S F``. ``answer`` is the stripped content of the last answer
    action whose ``<answer> … </answer>`` pair is complete (even if the trajectory is
    invalid), else ``None``. ``errors`` lists every problem found, in text order, e.g.
    ``"action 3: empty <subquery>"``; it is empty exactly when ``valid`` is true.
    """

    actions: list[Action]
    answer: str | None
    valid: bool
    strict_valid: bool
    errors: list[str]


@dataclass(frozen=True)
class TokenAction:
    """One action found in a token id sequence by :func:`parse_token_actions`.

    ``span`` is ``[start, end)`` over the ids: from the first model-written token of the
    action (the ``<step>`` token, or the token after it when the environment wrote the
    opener, see ``env_opener``) through the action's closing tag. It never contains a
    retrieval token nor a token whose env mask is 0. ``thought_span`` and ``content_span``
    are the token ranges strictly between ``<step>`` and ``</step>`` and between the action
    tags (``None`` when the opening tag is absent; when the closing tag is missing they run
    up to the next tag or to where the action stops). ``kind``, ``well_formed`` and ``errors`` are as in :class:`Action`.
    """

    kind: ActionKind | None
    well_formed: bool
    span: tuple[int, int]
    thought_span: tuple[int, int] | None = None
    content_span: tuple[int, int] | None = None
    env_opener: bool = False
    errors: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------
# The state machine shared by the text and token parsers. It sees a sequence of elements:
# a tag, a piece of text (a text segment between tags, or one token), blank or not, written
# by the model or by the environment (token level only).


@dataclass(frozen=True, slots=True)
class _El:
    tag: str | None  # one of TAGS, or None for text
    blank: bool  # text made only of whitespace (False for tags)
    env: bool = False  # written by the environment (env mask 0)


@dataclass(slots=True)
class _RawAction:
    start: int  # element range [start, end) of the action
    end: int
    kind: ActionKind | None
    errors: list[str]
    thought: tuple[int, int] | None  # element ranges of the contents
    content: tuple[int, int] | None
    content_closed: bool
    retrieval: tuple[int, int] | None = None  # element range inside the retrieval block


@dataclass(slots=True)
class _Scan:
    actions: list[_RawAction]
    layout_errors: list[tuple[int, str]]  # (element index, message) outside any action
    n_retrievals: int
    unretrieved: list[tuple[int, int]]  # (element index, action number) of searches lacking retrieval


def _next_tag(els: Sequence[_El], p: int, end: int) -> int:
    while p < end and els[p].tag is None:
        p += 1
    return p


def _has_text(els: Sequence[_El], a: int, b: int) -> bool:
    return any(els[k].tag is None and not els[k].blank for k in range(a, b))


def _first_error(els: Sequence[_El], start: int, end: int) -> str | None:
    """Why ``els[start:end]`` is not ``<step> T </step> <X> C </X>``; ``None`` if it is."""
    if els[start].tag != STEP_OPEN:
        return f"missing <step>: the action starts with {els[start].tag}"
    q = _next_tag(els, start + 1, end)
    if q == end:
        return "unclosed <step>"
    if els[q].tag != STEP_CLOSE:
        return f"{els[q].tag} inside <step>"
    if not _has_text(els, start + 1, q):
        return "empty <step>"
    p = q + 1
    while p < end and els[p].tag is None and els[p].blank:
        p += 1
    if p == end:
        return "no action tag after </step>"
    opener = els[p].tag
    if opener is None:
        return "text between </step> and the action tag"
    if opener not in _KIND_OF_OPENER:
        return f"{opener} after </step> (expected <subquery>, <subanswer> or <answer>)"
    closer = ACTION_TAGS[_KIND_OF_OPENER[opener]][1]
    q = _next_tag(els, p + 1, end)
    if q == end:
        return f"unclosed {opener}"
    if els[q].tag != closer:
        return f"{els[q].tag} inside {opener}"
    if not _has_text(els, p + 1, q):
        return f"empty {opener}"
    if q != end - 1:  # cannot happen: an action ends at its first stop tag
        return f"text after {closer}"
    return None


def _scan_action(els: Sequence[_El], start: int) -> _RawAction:
    """Cut one action starting at the tag ``els[start]`` and judge it."""
    n = len(els)
    end = start + 1
    if els[start].tag not in STOP_TAGS:
        while end < n:
            e = els[end]
            if e.env or e.tag in (RETRIEVAL_OPEN, RETRIEVAL_CLOSE):
                break
            end += 1
            if e.tag in STOP_TAGS:
                break
        if els[end - 1].tag not in STOP_TAGS:
            while end > start + 1 and els[end - 1].tag is None and els[end - 1].blank:
                end -= 1
    opener = next((k for k in range(start, end) if els[k].tag in _KIND_OF_OPENER), None)
    thought = content = None
    closed = False
    if els[start].tag == STEP_OPEN:
        thought = (start + 1, _next_tag(els, start + 1, end))
    kind: ActionKind | None
    if opener is not None:
        kind = _KIND_OF_OPENER[els[opener].tag or ""]
        q = _next_tag(els, opener + 1, end)
        content = (opener + 1, q)
        closed = q < end and els[q].tag == ACTION_TAGS[kind][1]
    else:
        kind = _KIND_OF_CLOSER.get(els[end - 1].tag or "")
    error = _first_error(els, start, end)
    return _RawAction(start, end, kind, [] if error is None else [error], thought, content, closed)


def _scan(els: Sequence[_El]) -> _Scan:
    """Cut elements into actions and retrieval blocks; note what lies outside both."""
    actions: list[_RawAction] = []
    layout: list[tuple[int, str]] = []
    n_retrievals = 0
    unretrieved: list[tuple[int, int]] = []
    pending: _RawAction | None = None  # a search action still waiting for its retrieval
    answered = False
    i, n = 0, len(els)
    while i < n:
        e = els[i]
        if e.tag is None:
            if not e.blank and not e.env:
                layout.append((i, "text after </answer>" if answered else "text outside any block"))
            i += 1
        elif e.tag == RETRIEVAL_OPEN:
            n_retrievals += 1
            j = i + 1
            while j < n and els[j].tag != RETRIEVAL_CLOSE:
                j += 1
            if pending is not None:
                pending.retrieval = (i + 1, j)
                pending = None
            else:
                layout.append((i, f"retrieval block {n_retrievals} has no search action before it"))
            if j == n:
                layout.append((i, "unclosed <retrieval>"))
            i = j + 1
        elif e.tag == RETRIEVAL_CLOSE:
            layout.append((i, "stray </retrieval>"))
            i += 1
        elif e.env and e.tag != STEP_OPEN:
            layout.append((i, f"environment-written {e.tag} outside a retrieval block"))
            i += 1
        else:
            if pending is not None:
                unretrieved.append((i, len(actions)))
            action = _scan_action(els, i)
            actions.append(action)
            pending = action if action.kind is ActionKind.SEARCH else None
            answered = answered or action.kind is ActionKind.ANSWER
            i = action.end
    if pending is not None:
        unretrieved.append((n, len(actions)))
    return _Scan(actions, layout, n_retrievals, unretrieved)


def _grammar_errors(scan: _Scan, where: Callable[[int], str]) -> list[str]:
    """Every reason the scanned trajectory is not valid, in order; empty iff valid."""
    located: list[tuple[int, str]] = [(i, f"{msg} ({where(i)})") for i, msg in scan.layout_errors]
    located.extend((i, f"search action {k} has no <retrieval> block") for i, k in scan.unretrieved)
    for k, action in enumerate(scan.actions, start=1):
        located.extend((action.start, f"action {k}: {msg}") for msg in action.errors)
    located.sort(key=lambda item: item[0])  # stable: equal positions keep their order
    errors = [msg for _, msg in located]
    answers = [k for k, a in enumerate(scan.actions, start=1) if a.kind is ActionKind.ANSWER]
    if not answers:
        errors.append("no <answer> action")
    elif len(answers) > 1:
        errors.append(f"more than one <answer> action (actions {', '.join(map(str, answers))})")
    if answers and answers[-1] != len(scan.actions):
        errors.append(f"action {len(scan.actions)} comes after the answer (action {answers[-1]})")
    return errors


def _follows_reference_grammar(scan: _Scan) -> bool:
    """``(S Q R S A)* S F`` on the kinds; the rest of validity is checked by the caller."""
    kinds = [a.kind for a in scan.actions]
    if not kinds or kinds[-1] is not ActionKind.ANSWER or len(kinds) % 2 != 1:
        return False
    pairs = kinds[:-1]
    return all(pairs[k] is ActionKind.SEARCH for k in range(0, len(pairs), 2)) and all(
        pairs[k] is ActionKind.CONCLUDE for k in range(1, len(pairs), 2)
    )


# ---------------------------------------------------------------------------------------
# Text parsing


def _text_elements(text: str) -> tuple[list[_El], list[int], list[int]]:
    """Split ``text`` into tags and the text segments between them, with char offsets."""
    els: list[_El] = []
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    for m in _TAG_RE.finditer(text):
        if m.start() > pos:
            els.append(_El(None, not text[pos : m.start()].strip()))
            starts.append(pos)
            ends.append(m.start())
        els.append(_El(m.group(), False))
        starts.append(m.start())
        ends.append(m.end())
        pos = m.end()
    if pos < len(text):
        els.append(_El(None, not text[pos:].strip()))
        starts.append(pos)
        ends.append(len(text))
    return els, starts, ends


def _snippet(s: str, limit: int = 30) -> str:
    s = s.strip()
    return repr(s if len(s) <= limit else s[:limit] + "...")


def parse_trajectory(text: str) -> ParsedTrajectory:
    """Parse a completion (the text after the prompt) into actions and judge it; never raises.

    Malformed input yields actions marked not well formed, ``valid=False`` and the reasons
    in ``errors``; see the module docstring for how malformed text is cut into actions.
    """
    els, starts, ends = _text_elements(text)
    scan = _scan(els)

    def chars(rng: tuple[int, int] | None) -> str:
        if rng is None or rng[0] >= rng[1]:
            return ""
        return text[starts[rng[0]] : ends[rng[1] - 1]].strip()

    def where(i: int) -> str:
        if i >= len(els):
            return "at the end"
        if els[i].tag is None:
            segment = text[starts[i] : ends[i]]
            return f"at char {starts[i] + len(segment) - len(segment.lstrip())}: {_snippet(segment)}"
        return f"at char {starts[i]}"

    actions = [
        Action(
            kind=raw.kind,
            thought=chars(raw.thought),
            content=chars(raw.content),
            retrieval=None if raw.retrieval is None else chars(raw.retrieval),
            well_formed=not raw.errors,
            char_span=(starts[raw.start], ends[raw.end - 1]),
            errors=tuple(raw.errors),
        )
        for raw in scan.actions
    ]
    errors = _grammar_errors(scan, where)
    answer = None
    for raw, action in zip(scan.actions, actions, strict=True):
        if raw.kind is ActionKind.ANSWER and raw.content_closed:
            answer = action.content
    valid = not errors
    return ParsedTrajectory(
        actions=actions,
        answer=answer,
        valid=valid,
        strict_valid=valid and _follows_reference_grammar(scan),
        errors=errors,
    )


def i_step(action_text: str) -> int:
    """I_step: 1 iff ``action_text`` is exactly one well-formed action, else 0.

    E.g. ``"<step> t </step><subquery> q </subquery>"`` -> 1. Surrounding whitespace is
    allowed; anything else (a second action, a retrieval block, stray text) gives 0.
    """
    scan = _scan(_text_elements(action_text)[0])
    # A lone search action has no retrieval after it: that is the grammar's business, not I_step's.
    ok = len(scan.actions) == 1 and not scan.actions[0].errors
    ok = ok and not scan.layout_errors and not scan.n_retrievals
    return int(ok)


def i_traj(text: str, *, strict: bool = False) -> int:
    """I_traj: 1 iff the completion follows the grammar and ends in exactly one answer.

    ``strict=True`` uses the reference code's grammar ``(S Q R S A)* S F`` (no two searches
    in a row, no conclusion without a search before it).
    """
    parsed = parse_trajectory(text)
    return int(parsed.strict_valid if strict else parsed.valid)


def extract_answer(text: str) -> str | None:
    """The final answer of a possibly malformed completion, for evaluation.

    The stripped text between the last ``</answer>`` and the last ``<answer>`` before it
    (possibly ``""``); ``None`` if there is no such pair. Unlike ``parse_trajectory(text).answer``
    this does not care about the rest of the completion.
    """
    end = text.rfind(ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(ANSWER_OPEN) : end].strip()


# ---------------------------------------------------------------------------------------
# Token parsing


def parse_token_actions(
    ids: Sequence[int],
    tag_ids: Mapping[str, int],
    env_mask: Sequence[int] | None = None,
    *,
    blank_ids: Collection[int] = (),
) -> list[TokenAction]:
    """Find the actions of a completion directly in its token ids (never decoded).

    ``tag_ids`` maps each of the ten :data:`TAGS` to its (single) token id. ``env_mask``
    has one entry per id, 0 where the environment wrote the token (retrieval blocks,
    separators, ``<step>`` openers); ``None`` means the model wrote everything.
    ``blank_ids`` are the ids of tokens made only of whitespace (e.g. ``"\\n"``): the text
    parser allows whitespace between ``</step>`` and the action tag and does not count it
    as content, and these ids let the token parser do the same. With the default (none),
    any token between ``</step>`` and the action tag makes the action malformed, which
    never happens to text laid out as :func:`render_trajectory` does.

    Well-formedness is judged from the tag ids alone: tag order and non-blank tokens between
    them, exactly as the text parser judges the same text. Raises ``ValueError`` only for
    bad arguments (a missing tag, two tags sharing an id, a mask of another length).
    """
    missing = [tag for tag in TAGS if tag not in tag_ids]
    if missing:
        raise ValueError(f"tag_ids lacks {', '.join(missing)}")
    tag_of = {int(tag_ids[tag]): tag for tag in TAGS}
    if len(tag_of) != len(TAGS):
        raise ValueError(f"tag ids must be distinct, got {dict((t, tag_ids[t]) for t in TAGS)}")
    id_list = [int(t) for t in ids]
    if env_mask is None:
        mask = [1] * len(id_list)
    else:
        mask = [int(m) for m in env_mask]
        if len(mask) != len(id_list):
            raise ValueError(f"env_mask has {len(mask)} entries for {len(id_list)} ids")
    blanks = {int(b) for b in blank_ids}
    els = [_El(tag_of.get(t), t not in tag_of and t in blanks, m == 0) for t, m in zip(id_list, mask, strict=True)]
    out = []
    for raw in _scan(els).actions:
        env_opener = els[raw.start].env  # only a <step> opener can be env-written here
        out.append(
            TokenAction(
                kind=raw.kind,
                well_formed=not raw.errors,
                span=(raw.start + 1 if env_opener else raw.start, raw.end),
                thought_span=raw.thought,
                content_span=raw.content,
                env_opener=env_opener,
                errors=tuple(raw.errors),
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# Rendering: the one way to write each block.


def _clean(what: str, s: str) -> str:
    """Strip a model-side content; refuse one that cannot be written as a well-formed block."""
    if not isinstance(s, str):
        raise TypeError(f"{what} must be a string, got {type(s).__name__}")
    out = s.strip()
    if not out:
        raise ValueError(f"{what} is empty: a well-formed action has non-empty contents")
    m = _TAG_RE.search(out)
    if m:
        raise ValueError(f"{what} contains the tag {m.group()} (contents may not contain tags): {_snippet(out)}")
    return out


def step_opener() -> str:
    """The ``<step>`` that opens every action (environment-written after the first action)."""
    return STEP_OPEN


def _render_action(kind: ActionKind, thought: str, content: str) -> str:
    opener, closer = ACTION_TAGS[kind]
    thought, content = _clean("thought", thought), _clean(kind.value, content)
    return f"{STEP_OPEN} {thought} {STEP_CLOSE}{opener} {content} {closer}"


def render_search(thought: str, query: str) -> str:
    """``<step> thought </step><subquery> query </subquery>`` (contents stripped).

    Raises ``ValueError`` if a content is empty or contains a tag: the renderer only writes
    well-formed actions. Same for :func:`render_conclude` and :func:`render_answer`.
    """
    return _render_action(ActionKind.SEARCH, thought, query)


def render_conclude(thought: str, subanswer: str) -> str:
    """``<step> thought </step><subanswer> subanswer </subanswer>`` (contents stripped)."""
    return _render_action(ActionKind.CONCLUDE, thought, subanswer)


def render_answer(thought: str, answer: str) -> str:
    """``<step> thought </step><answer> answer </answer>`` (contents stripped)."""
    return _render_action(ActionKind.ANSWER, thought, answer)


def render_final(answer: str) -> str:
    """``<answer> answer </answer>`` alone, with no thought: what a one-shot baseline (naive
    generation, standard RAG) is trained to write after its prompt."""
    opener, closer = ACTION_TAGS[ActionKind.ANSWER]
    return f"{opener} {_clean(ActionKind.ANSWER.value, answer)} {closer}"


def _defang(match: re.Match[str]) -> str:
    return "&lt;" + match.group()[1:]


def count_tags(text: str) -> int:
    """How many verbatim tags ``text`` holds."""
    return sum(1 for _ in _TAG_RE.finditer(text))


def defang_tags(text: str) -> str:
    """``text`` with the ``<`` of every verbatim tag written as ``&lt;`` (``<answer>`` ->
    ``&lt;answer>``): text that must never read as a tag (retrieved documents, a tag a model
    spelled out of ordinary tokens) parses as plain text."""
    return _TAG_RE.sub(_defang, text)


def render_retrieval(hits_or_text: str | Sequence[Hit]) -> str:
    """``<retrieval>\\nDOCS\\n</retrieval>``: the environment's block after a search.

    DOCS is the given text, or :func:`format_documents` of the given hits (one per line,
    ``Doc i(Title: t) text``), stripped; an empty result (no hits) gives
    ``<retrieval>\\n\\n</retrieval>`` and parses back as ``""``. A corpus is outside our
    control, so a tag that occurs verbatim in a document is defanged by writing its ``<``
    as ``&lt;`` (``<answer>`` -> ``&lt;answer>``): the block can never be closed early, and
    a tokenizer with the tags as special tokens never sees a control token in retrieved
    text. Apart from that, ``parse(render(docs))`` gives back ``docs`` stripped.
    """
    docs = hits_or_text if isinstance(hits_or_text, str) else format_documents(list(hits_or_text))
    docs = defang_tags(docs.strip())
    return f"{RETRIEVAL_OPEN}\n{docs}\n{RETRIEVAL_CLOSE}"


def render_env_turn(retrieval: str | Sequence[Hit] | None = None) -> str:
    """What the environment appends after the model stops on ``</subquery>`` or ``</subanswer>``.

    After a search (pass its ``retrieval``): ``"\\n" + render_retrieval(retrieval) + "\\n<step>"``;
    after a conclusion (pass nothing): ``"\\n<step>"``. The model then writes the rest of the
    next action, i.e. ``render_search(...)[len(step_opener()):]`` and so on, so that the
    whole completion is exactly :func:`render_trajectory` of its actions.
    """
    if retrieval is None:
        return BLOCK_SEPARATOR + step_opener()
    return BLOCK_SEPARATOR + render_retrieval(retrieval) + BLOCK_SEPARATOR + step_opener()


def render_action(action: Action) -> str:
    """The model-written text of one action (no retrieval block)."""
    if action.kind is None:
        raise ValueError("cannot render an action without a kind")
    return _render_action(action.kind, action.thought, action.content)


def render_trajectory(actions: Sequence[Action]) -> str:
    """Write a trajectory: actions, and the retrieval block after each search that has one,
    separated by :data:`BLOCK_SEPARATOR`. Only ``kind``, ``thought``, ``content`` and
    ``retrieval`` are used (spans and flags are ignored).

    ``retrieval`` on a non-search action is an error (it has nowhere to go); a search action
    with ``retrieval=None`` is written without a block (e.g. the last action of a truncated
    rollout), which is not a valid trajectory.
    """
    blocks: list[str] = []
    for k, action in enumerate(actions, start=1):
        blocks.append(render_action(action))
        if action.retrieval is not None and action.kind is not ActionKind.SEARCH:
            raise ValueError(f"action {k} is not a search action but has a retrieval")
        if action.retrieval is not None:
            blocks.append(render_retrieval(action.retrieval))
    return BLOCK_SEPARATOR.join(blocks)


__all__ = [
    "ACTION_TAGS",
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "BLOCK_SEPARATOR",
    "CONTROL_TAG_WEIGHTS",
    "RETRIEVAL_CLOSE",
    "RETRIEVAL_OPEN",
    "STEP_CLOSE",
    "STEP_OPEN",
    "STOP_TAGS",
    "SUBANSWER_CLOSE",
    "SUBANSWER_OPEN",
    "SUBQUERY_CLOSE",
    "SUBQUERY_OPEN",
    "TAGS",
    "Action",
    "ActionKind",
    "ParsedTrajectory",
    "TokenAction",
    "count_tags",
    "defang_tags",
    "extract_answer",
    "i_step",
    "i_traj",
    "parse_token_actions",
    "parse_trajectory",
    "render_action",
    "render_answer",
    "render_conclude",
    "render_env_turn",
    "render_retrieval",
    "render_search",
    "render_trajectory",
    "step_opener",
]
