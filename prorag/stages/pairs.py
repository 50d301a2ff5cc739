"""Stage 2 of ProRAG, part 2: step preference pairs from the search trees (docs/METHOD.md §2).

Among siblings visited at least ``min_visits`` times, a judge (:mod:`prorag.supervision.judge`)
labels one step chosen and one rejected, or none; Q and N go along as hints. ``pairs_per_set: all``
with the oracle also writes every other (valid, invalid) combination: the same labels, several
times more pairs, which a small PRM needs.

One JSON line per pair (the PRM trainer's contract): ids and texts of the context, chosen and
rejected actions (actions never include the retrieval that follows), kinds, Q/N, judge, reason,
depth. ``id`` is ``QUESTION_ID@ADDRESS`` (``#C>R`` for the extra pairs); the file is appended per
sibling set and a rerun skips sets that already gave a pair. :func:`judge_agreement` compares two
judges on the same sibling sets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
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


def sibling_sets(tree: SearchTree, min_visits: int) -> Iterator[SiblingSet]:
    """Every node with at least two children visited ``min_visits`` times or more."""
    for address, path in iter_paths(tree.root):
        kept = [c for c in path[-1].children if c.visits >= min_visits]
        if len(kept) >= 2:
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


def set_id(pair_id: str) -> str:
    """The sibling set a pair's id comes from (an extra pair's id ends in ``#C>R``)."""
    return pair_id.split("#", 1)[0]


# ----------------------------------------------------------------------------- extraction


@dataclass
class PairsSummary:
    """What a run judged: ``sibling_sets`` seen (``already_done`` of them paired by an earlier run),
    ``judged``, ``pairs`` (sets that gave the judge's own pair) and ``extra_pairs`` (the further
    valid x invalid combinations of ``pairs_per_set: all``)."""

    sibling_sets: int = 0
    already_done: int = 0
    judged: int = 0
    pairs: int = 0
    extra_pairs: int = 0

    def describe(self) -> str:
        extra = f" (+{self.extra_pairs} more combinations)" if self.extra_pairs else ""
        return (
            f"{self.sibling_sets} sibling sets ({self.already_done} already paired): judged {self.judged}, "
            f"wrote {self.pairs} pairs{extra}, {self.judged - self.pairs} without a pair"
        )


def make_judge(config: PairsConfig) -> Judge:
    """The configured judge."""
    if config.judge == "oracle":
        return OracleJudge()
    assert config.llm is not None  # checked by PairsConfig
    return LLMJudge(config.llm)


def extract_pairs(
    trees: Sequence[SearchTree], out_path: str | Path, config: PairsConfig | None = None, *, judge: Judge | None = None
) -> PairsSummary:
    """Judge every sibling set of ``trees`` not yet paired in ``out_path`` and append the pairs."""
    cfg = config or PairsConfig()
    judge = judge or make_judge(cfg)
    summary = PairsSummary()
    out = Path(out_path)
    with JsonlAppender(out) as appender:  # repairs a cut last line before the done ids are read
        done = {set_id(row["id"]) for row in read_jsonl(out, tolerate_truncated_tail=True)} if out.stat().st_size else set()
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
    "judge_request",
    "make_judge",
    "make_pair",
    "sibling_sets",
    "step_view",
]
