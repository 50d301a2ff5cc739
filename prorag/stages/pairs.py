"""Stage 2 of ProRAG, part 2: step preference pairs from the search trees (docs/METHOD.md §2).

Among siblings visited at least ``min_visits`` times, a judge (:mod:`prorag.supervision.judge`)
labels one step chosen and one rejected, or none; Q and N go along as hints. ``pairs_per_set: all``
with the oracle also writes every other (valid, invalid) combination: the same labels, several
times more pairs, which a small PRM needs.

One JSON line per pair (the PRM trainer's contract): ids and texts of the context, chosen and
rejected actions (actions never include the retrieval that follows), kinds, Q/N, judge, reason,
depth. ``id`` is ``QUESTION_ID@ADDRESS`` (``#C>R`` for the extra pairs); the file is appended per
sibling set and a rerun skips sets that already gave a pair. :func:`judge_agreement` compares two
judges on the same sibling sets. ``pointwise`` (on by default) also writes ``pointwise.jsonl``: one
line per judged node with its context, step and the judge's verdict as ``label`` 1/0
(:func:`make_point`); only a judge that labels each step gives them (the oracle; an LLM judge names
one pair, so it writes none).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prorag.agent.schema import STEP_OPEN
from prorag.core.config import setting
from prorag.data.jsonl import JsonlAppender, read_jsonl
from prorag.data.records import Record
from prorag.method.search_tree import Node, SearchTree, format_address, iter_paths, state_ids
from prorag.supervision.judge import Candidate, Judge, Judgement, JudgeRequest, LLMJudge, OracleJudge, StepView
from prorag.supervision.llm_teacher import LLMTeacherConfig

log = logging.getLogger(__name__)


@dataclass
class PairsConfig:
    """Settings of pair extraction (``prorag pairs``)."""

    judge: Literal["oracle", "llm"] = setting(
        "oracle",
        help="Who decides which sibling step is better: `oracle` (the gold decomposition) or `llm` (an OpenAI-compatible judge).",
    )
    # `all`: also every other (valid, invalid) combination of the siblings, when the judge labels each sibling (the oracle; an
    # LLM judge names one pair, so it still gives one).
    pairs_per_set: Literal["one", "all"] = setting(
        "one", help="`one`: the judge's chosen and rejected step (the paper); `all`: every (valid, invalid) sibling combination."
    )
    min_visits: int = setting(2, help="A sibling takes part only with at least this many visits (N).")
    llm: LLMTeacherConfig | None = setting(
        None, help="The LLM judge's server, model, concurrency, retries and reply cache (`judge: llm`)."
    )
    chunk_size: int = setting(256, help="Sibling sets judged per batch (the LLM judge runs a batch's requests concurrently).")
    pointwise: bool = setting(
        True,
        help="Also write `pointwise.jsonl` beside the pairs file: every judged node's step with the judge's verdict as a "
        "label 1/0 (the PRM's pointwise term). Needs a judge that labels each step (the oracle); the LLM judge skips it.",
    )

    def __post_init__(self) -> None:
        if self.min_visits < 1:
            raise ValueError(f"PairsConfig.min_visits must be >= 1, got {self.min_visits}")
        if self.pairs_per_set not in ("one", "all"):
            raise ValueError(f"PairsConfig.pairs_per_set must be 'one' or 'all', got {self.pairs_per_set!r}")
        if self.judge == "llm" and self.llm is None:
            raise ValueError("PairsConfig: judge 'llm' needs the llm settings (base_url, model)")


# ----------------------------------------------------------------------------- sibling sets


@dataclass
class SiblingSet:
    """The children of one node that take part in judging, with the way to their state."""

    tree: SearchTree
    address: tuple[int, ...]
    path: list[Node]
    candidates: list[Node]

    @property
    def id(self) -> str:
        return f"{self.tree.id}@{format_address(self.address)}"


def sibling_sets(tree: SearchTree, min_visits: int, min_children: int = 2) -> Iterator[SiblingSet]:
    """Every node with at least ``min_children`` children visited ``min_visits`` times or more
    (two to make a pair; one is enough for pointwise labels)."""
    for address, path in iter_paths(tree.root):
        kept = [c for c in path[-1].children if c.visits >= min_visits]
        if len(kept) >= min_children:
            yield SiblingSet(tree, address, path, kept)


def step_view(node: Node) -> StepView:
    """What a judge sees of a node's action (its text shown from ``<step>``, which the
    environment wrote for every action but the first)."""
    text = node.action_text if node.action_text.lstrip().startswith(STEP_OPEN) else STEP_OPEN + node.action_text
    return StepView(node.kind, node.content, node.well_formed, text, node.env_text if node.kind == "search" else "")


def history_text(path: Sequence[Node]) -> str:
    """The decoded history of a state: every action and environment reply after the prompt."""
    return "".join(n.action_text + n.env_text for n in path)


def judge_request(s: SiblingSet) -> JudgeRequest:
    return JudgeRequest(
        id=s.id,
        record=Record.from_dict(s.tree.record, where=f"tree {s.tree.id}"),
        history=[step_view(n) for n in s.path[1:]],
        candidates=[Candidate(step_view(c), c.q, c.visits) for c in s.candidates],
        context_text=history_text(s.path),
    )


def make_pair(s: SiblingSet, judgement: Judgement, judge_name: str, *, id: str | None = None) -> dict[str, Any]:
    """One line of the pairs file (see the module docstring); ``id`` defaults to the set's."""
    chosen, rejected = s.candidates[judgement.chosen], s.candidates[judgement.rejected]
    return {
        "id": id or s.id,
        "question_id": s.tree.id,
        "question": s.tree.question,
        "partition": s.tree.record.get("metadata", {}).get("partition"),
        "context_ids": state_ids(s.tree.prompt_ids, s.path)[0],
        "chosen_ids": chosen.action_ids,
        "rejected_ids": rejected.action_ids,
        "context_text": history_text(s.path),
        "chosen_text": chosen.action_text,
        "rejected_text": rejected.action_text,
        "chosen_kind": chosen.kind,
        "rejected_kind": rejected.kind,
        "chosen_q": chosen.q,
        "chosen_n": chosen.visits,
        "rejected_q": rejected.q,
        "rejected_n": rejected.visits,
        "judge": judge_name,
        "reason": judgement.reason,
        "depth": chosen.depth,
    }


def set_pairs(s: SiblingSet, judgement: Judgement, judge_name: str, pairs_per_set: str = "one") -> list[dict[str, Any]]:
    """The pairs file's lines for one judged sibling set: the judge's pair, then (``"all"``,
    with per-sibling verdicts) every other valid sibling against every invalid one, each with
    the reasons of its two steps."""
    rows = [make_pair(s, judgement, judge_name)]
    if pairs_per_set != "all" or judgement.verdicts is None:
        return rows
    verdicts = judgement.verdicts
    for c, (c_ok, c_why) in enumerate(verdicts):
        for r, (r_ok, r_why) in enumerate(verdicts):
            if not c_ok or r_ok or (c, r) == (judgement.chosen, judgement.rejected):
                continue
            extra = Judgement(c, r, f"chosen: {c_why}; rejected: {r_why}", verdicts)
            rows.append(make_pair(s, extra, judge_name, id=f"{s.id}#{c}>{r}"))
    return rows


def make_point(s: SiblingSet, index: int, verdict: tuple[bool, str], judge_name: str) -> dict[str, Any]:
    """One line of ``pointwise.jsonl``: candidate ``index`` of ``s`` with the judge's verdict on
    it, ``label`` 1 (valid) or 0; ``id`` is ``QUESTION_ID@ADDRESS`` of the set, then ``/index``."""
    node = s.candidates[index]
    return {
        "id": f"{s.id}/{index}",
        "question_id": s.tree.id,
        "question": s.tree.question,
        "partition": s.tree.record.get("metadata", {}).get("partition"),
        "context_ids": state_ids(s.tree.prompt_ids, s.path)[0],
        "step_ids": node.action_ids,
        "context_text": history_text(s.path),
        "step_text": node.action_text,
        "kind": node.kind,
        "label": int(verdict[0]),
        "reason": verdict[1],
        "q": node.q,
        "n": node.visits,
        "judge": judge_name,
        "depth": node.depth,
    }


def set_id(pair_id: str) -> str:
    """The sibling set a pair's id comes from (an extra pair's id ends in ``#C>R``)."""
    return pair_id.split("#", 1)[0]


# ----------------------------------------------------------------------------- extraction


@dataclass
class PairsSummary:
    """What a run judged: ``sibling_sets`` seen (``already_done`` of them paired by an earlier run),
    ``judged``, ``pairs`` (sets that gave the judge's own pair), ``extra_pairs`` (the further
    valid x invalid combinations of ``pairs_per_set: all``) and ``points`` (pointwise labels
    written this run, ``valid_points`` of them label 1)."""

    sibling_sets: int = 0
    already_done: int = 0
    judged: int = 0
    pairs: int = 0
    extra_pairs: int = 0
    points: int = 0
    valid_points: int = 0

    def describe(self) -> str:
        extra = f" (+{self.extra_pairs} more combinations)" if self.extra_pairs else ""
        points = f"; {self.points} pointwise labels ({self.valid_points} valid)" if self.points else ""
        return (
            f"{self.sibling_sets} sibling sets ({self.already_done} already paired): judged {self.judged}, "
            f"wrote {self.pairs} pairs{extra}, {self.judged - self.pairs} without a pair{points}"
        )


def make_judge(config: PairsConfig) -> Judge:
    """The configured judge."""
    if config.judge == "oracle":
        return OracleJudge()
    assert config.llm is not None  # checked by PairsConfig
    return LLMJudge(config.llm)


def pointwise_file(pairs_path: str | Path) -> Path:
    """Where the pointwise labels of a pairs file go: beside it, ``NAME.pointwise.jsonl``."""
    path = Path(pairs_path)
    return path.with_name(f"{path.stem}.pointwise.jsonl")


def _done_ids(path: Path, set_of: Callable[[str], str]) -> set[str]:
    """The sibling sets a JSONL file of pairs or points already has lines of (``set_of``: a
    line's id to its set's)."""
    if not path.stat().st_size:
        return set()
    return {set_of(row["id"]) for row in read_jsonl(path, tolerate_truncated_tail=True)}


def extract_points(trees: Sequence[SearchTree], out_path: str | Path, judge: Any, min_visits: int) -> tuple[int, int]:
    """Append to ``out_path`` a pointwise line (:func:`make_point`) for every node visited
    ``min_visits`` times or more, from ``judge.verdicts`` (one ``(valid, reason)`` per candidate, or
    None for a question it cannot judge); sets already in the file are skipped. Returns the lines
    written and how many are labelled valid. A single child is judged too: pointwise labels need
    no sibling, and the nodes whose siblings all agree (no pair) are as informative here."""
    written = valid = 0
    with JsonlAppender(Path(out_path)) as appender:
        done = _done_ids(Path(out_path), lambda point_id: point_id.rsplit("/", 1)[0])
        for s in (s for tree in trees for s in sibling_sets(tree, min_visits, min_children=1)):
            if s.id in done:
                continue
            verdicts = judge.verdicts(judge_request(s))
            if verdicts is None:
                continue
            rows = [make_point(s, i, v, judge.name) for i, v in enumerate(verdicts)]
            appender.extend(rows)
            written += len(rows)
            valid += sum(r["label"] for r in rows)
    return written, valid


def extract_pairs(
    trees: Sequence[SearchTree], out_path: str | Path, config: PairsConfig | None = None, *, judge: Judge | None = None
) -> PairsSummary:
    """Judge every sibling set of ``trees`` not yet paired in ``out_path`` and append the pairs;
    with ``config.pointwise`` and a judge that has per-step ``verdicts``, also the pointwise labels
    (:func:`extract_points`, into :func:`pointwise_file`)."""
    cfg = config or PairsConfig()
    judge = judge or make_judge(cfg)
    summary = PairsSummary()
    out = Path(out_path)
    with JsonlAppender(out) as appender:  # repairs a cut last line before the done ids are read
        done = _done_ids(out, set_id)
        sets = [s for tree in trees for s in sibling_sets(tree, cfg.min_visits)]
        summary.sibling_sets = len(sets)
        todo = [s for s in sets if s.id not in done]
        summary.already_done = len(sets) - len(todo)
        for start in range(0, len(todo), cfg.chunk_size):
            chunk = todo[start : start + cfg.chunk_size]
            for s, judgement in zip(chunk, judge.judge([judge_request(s) for s in chunk]), strict=True):
                summary.judged += 1
                if judgement is not None:
                    rows = set_pairs(s, judgement, judge.name, cfg.pairs_per_set)
                    appender.extend(rows)
                    summary.pairs += 1
                    summary.extra_pairs += len(rows) - 1
            log.info("pairs: %d of %d sibling sets judged", min(start + cfg.chunk_size, len(todo)), len(todo))
    if cfg.pointwise and hasattr(judge, "verdicts"):
        summary.points, summary.valid_points = extract_points(trees, pointwise_file(out), judge, cfg.min_visits)
        log.info("pairs: %d pointwise labels (%d valid) in %s", summary.points, summary.valid_points, pointwise_file(out))
    elif cfg.pointwise:
        log.info("pairs: the %s judge gives no per-step verdict, so no pointwise labels are written", judge.name)
    return summary


def judge_agreement(a: Sequence[Judgement | None], b: Sequence[Judgement | None]) -> dict[str, Any]:
    """How two judges' decisions on the same sibling sets compare.

    ``agreement``: share of sets with the same decision (the same pair, or no pair from both);
    ``both_pair``: sets where both gave a pair, of which ``same_pair`` gave the same one and
    ``conflict`` a reversed preference (one's chosen is the other's rejected); ``one_only``: a
    pair from one judge and none from the other.
    """
    if len(a) != len(b):
        raise ValueError(f"{len(a)} against {len(b)} decisions")
    n = len(a)
    both_none = sum(x is None and y is None for x, y in zip(a, b, strict=True))
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    same = sum((x.chosen, x.rejected) == (y.chosen, y.rejected) for x, y in pairs)
    conflict = sum(x.chosen == y.rejected or x.rejected == y.chosen for x, y in pairs)
    return {
        "n": n,
        "agreement": (both_none + same) / n if n else float("nan"),
        "both_none": both_none,
        "both_pair": len(pairs),
        "same_pair": same,
        "conflict": conflict,
        "one_only": n - both_none - len(pairs),
    }


def agreement_report(trees: Sequence[SearchTree], a: Judge, b: Judge, *, sample: int, min_visits: int) -> dict[str, Any]:
    """:func:`judge_agreement` of two judges on the first ``sample`` sibling sets."""
    sets = [s for tree in trees for s in sibling_sets(tree, min_visits)][:sample]
    requests = [judge_request(s) for s in sets]
    return {"judges": [a.name, b.name], **judge_agreement(a.judge(requests), b.judge(requests))}


__all__ = [
    "PairsConfig",
    "PairsSummary",
    "SiblingSet",
    "agreement_report",
    "set_id",
    "set_pairs",
    "extract_pairs",
    "history_text",
    "judge_agreement",
    "extract_points",
    "judge_request",
    "make_judge",
    "make_pair",
    "make_point",
    "pointwise_file",
    "sibling_sets",
    "step_view",
]
