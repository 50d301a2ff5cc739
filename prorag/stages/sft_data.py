"""Stage 1's data: gold trajectories of a record file, written once to JSONL (``prorag sft-data``).

For every record with a gold decomposition, :func:`build_sft_data` writes one trajectory whose
``<retrieval>`` blocks hold the project's retriever output for each hop's keywords, with thoughts
by the template teacher or the LLM teacher; hops whose gold page was missed go in ``missing_gold``.

Rendering is :func:`~prorag.agent.gold.render_gold`'s alone. The LLM needs the hits before it
writes, so a chunk is rendered twice over one memoising retriever: first collecting hits, then
with the LLM's thoughts. Rows are appended chunk by chunk; ids already written are skipped, a cut
last line is repaired, and a record that cannot be written well is dropped, counted and retried by
the next run. ``limit`` takes the first N records, so a rerun resumes the same set.

The length budget is in characters (``max_chars``: prompt or question plus the trajectory's text),
as no tokenizer is at hand here: a longer trajectory (an over-long question, pasted documents) is
skipped with a counted warning, not written; SFT's ``max_length`` later drops, in tokens, what
this coarse bound lets through.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypeVar

from prorag.agent.gold import GoldTrajectory, Hop, Teacher, TemplateTeacher, gold_hops, render_gold
from prorag.core.config import setting
from prorag.core.errors import DataError
from prorag.data.jsonl import JsonlAppender, read_jsonl
from prorag.data.records import Record, read_records
from prorag.retrieval.base import Hit, Retriever
from prorag.supervision.llm_teacher import LLMTeacher, LLMTeacherConfig, LLMUsage, PrecomputedTeacher, TeacherItem

log = logging.getLogger(__name__)

TeacherKind = Literal["template", "llm"]
T = TypeVar("T", Record, GoldTrajectory)
#: ``SFTDataConfig.max_chars``'s default: far above a gold trajectory of real records (a few thousand characters).
DEFAULT_MAX_CHARS = 65_536


@dataclass
class SFTDataConfig:
    """Settings of ``prorag sft-data``."""

    teacher: TeacherKind = setting("template", help="Who writes the thoughts: `template` (offline) or `llm` (needs `llm`).")
    top_k: int = setting(3, help="Documents per retrieval; use the `top_k` the policy will search with.")
    limit: int | None = setting(None, help="Only the first `limit` records of the file.")
    chunk_size: int = setting(256, help="Records rendered (and sent to the LLM) together before their rows are appended.")
    max_chars: int | None = setting(
        DEFAULT_MAX_CHARS,
        help="Longest trajectory in characters (question or prompt plus text); a longer one is skipped with a counted "
        "warning, not written (null: no bound). Characters, as sft-data has no tokenizer: 65536 is about 16K tokens "
        "at 4 characters a token, 8 times SFT's default max_length, which drops in tokens what this lets through.",
    )
    llm: LLMTeacherConfig | None = setting(
        None, help='The LLM teacher\'s settings (`teacher="llm"`); a `cache_path` of None becomes `OUT.llm_cache.jsonl`.'
    )

    def __post_init__(self) -> None:
        if self.teacher not in ("template", "llm"):
            raise ValueError(f"SFTDataConfig.teacher must be 'template' or 'llm', got {self.teacher!r}")
        if self.teacher == "llm" and self.llm is None:
            raise ValueError("the llm teacher needs its settings (base URL and model)")
        if self.top_k < 1 or self.chunk_size < 1:
            raise ValueError("SFTDataConfig.top_k and chunk_size must be >= 1")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"SFTDataConfig.limit must be >= 0, got {self.limit}")
        if self.max_chars is not None and self.max_chars < 1:
            raise ValueError(f"SFTDataConfig.max_chars must be >= 1 (or null: no bound), got {self.max_chars}")


@dataclass
class SFTDataSummary:
    """Counts of one ``build_sft_data`` run."""

    records: int = 0
    """Records considered (after ``limit``)."""
    written: int = 0
    skipped_no_decomposition: int = 0
    already_done: int = 0
    """Records whose id the output already held (resumed)."""
    duplicate_ids: int = 0
    """Records whose id appeared earlier in the same file (only the first is written)."""
    over_long: int = 0
    """Trajectories longer than ``max_chars`` (skipped, not written)."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Records not written, by reason."""
    hops: int = 0
    """Hops of the written trajectories."""
    missing_gold_hops: int = 0
    """Written hops whose gold page the retriever did not return."""
    missing_gold_trajectories: int = 0
    """Written trajectories with at least one such hop."""
    llm: LLMUsage | None = None

    def describe(self, llm_config: LLMTeacherConfig | None = None) -> str:
        dropped = ", ".join(f"{n} {r}" for r, n in sorted(self.dropped.items())) or "0"
        lines = [
            f"wrote {self.written} trajectories ({self.hops} hops) of {self.records} records",
            f"  skipped: {self.skipped_no_decomposition} without a gold decomposition, {self.already_done} already done"
            + (f", {self.duplicate_ids} duplicate ids" if self.duplicate_ids else "")
            + (f", {self.over_long} over max_chars" if self.over_long else ""),
            f"  dropped: {dropped}",
            f"  gold page not retrieved: {self.missing_gold_hops} hops, in {self.missing_gold_trajectories} trajectories",
        ]
        if self.llm is not None and llm_config is not None:
            lines.append(self.llm.describe(llm_config))
        return "\n".join(lines)


# ----------------------------------------------------------------------------- pure parts


def done_ids(out_path: str | os.PathLike[str]) -> set[str]:
    """Ids of the rows already in ``out_path`` (empty if it does not exist; a cut last line is ignored)."""
    path = Path(out_path)
    if not path.exists():
        return set()
    return {str(row["id"]) for row in read_jsonl(path, tolerate_truncated_tail=True) if "id" in row}


def select_records(records: Sequence[Record], done: set[str], limit: int | None, summary: SFTDataSummary) -> list[Record]:
    """The records still to write: the first ``limit``, minus those without a gold decomposition,
    already done, or repeating an earlier id (each counted in ``summary``)."""
    chosen = list(records)[:limit] if limit is not None else list(records)
    summary.records = len(chosen)
    seen: set[str] = set()
    todo = []
    for r in chosen:
        if r.id in seen:
            summary.duplicate_ids += 1
            continue
        seen.add(r.id)
        if not gold_hops(r):
            summary.skipped_no_decomposition += 1
        elif r.id in done:
            summary.already_done += 1
        else:
            todo.append(r)
    return todo


def trajectory_chars(traj: GoldTrajectory) -> int:
    """What :attr:`SFTDataConfig.max_chars` bounds: the prompt (a baseline's) or the question, plus the text."""
    return len(traj.prompt if traj.prompt is not None else traj.question) + len(traj.text)


def within_max_chars(items: Sequence[T], size: Callable[[T], int], max_chars: int | None) -> tuple[list[T], int]:
    """The records or trajectories whose ``size`` is at most ``max_chars`` (all with ``None``), and
    how many were longer; those are named, with their size, in one warning line. Records are
    measured by their question before rendering (no search, no LLM call for a question already too
    long), trajectories once rendered."""
    if max_chars is None:
        return list(items), 0
    kept = [x for x in items if size(x) <= max_chars]
    over = [x for x in items if size(x) > max_chars]
    if over:
        names = ", ".join(f"{x.id} ({size(x)})" for x in over[:5]) + (", ..." if len(over) > 5 else "")
        log.warning("sft-data: %d over max_chars=%d characters, skipped: %s", len(over), max_chars, names)
    return kept, len(over)


class _MemoRetriever:
    """A retriever that searches each ``(query, partition, k)`` once and replays it afterwards."""

    def __init__(self, inner: Retriever) -> None:
        self.inner = inner
        self.memo: dict[tuple[str, str | None, int], list[Hit]] = {}

    def search(self, queries: Sequence[str], k: int = 3, partitions: Sequence[str | None] | None = None) -> list[list[Hit]]:
        parts = list(partitions) if partitions is not None else [None] * len(queries)
        keys = [(q, p, k) for q, p in zip(queries, parts, strict=True)]
        new = list(dict.fromkeys(key for key in keys if key not in self.memo))
        if new:
            found = self.inner.search([q for q, _, _ in new], k=k, partitions=[p for _, p, _ in new])
            self.memo.update(zip(new, found, strict=True))
        return [self.memo[key] for key in keys]


class _HitCollector(TemplateTeacher):
    """The template teacher, remembering the hops and hits ``render_gold`` shows it per record."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[list[Hop], dict[int, list[Hit]]]] = {}

    def conclude_thought(self, record: Record, hops: Sequence[Hop], i: int, hits: Sequence[Hit]) -> str:
        self.seen.setdefault(record.id, (list(hops), {}))[1][i] = list(hits)
        return super().conclude_thought(record, hops, i, hits)

    def items(self, records: Sequence[Record]) -> list[TeacherItem]:
        out = []
        for r in records:
            hops, hits = self.seen[r.id]
            out.append(TeacherItem(r, hops, [hits[i] for i in range(len(hops))]))
        return out


def render_records(
    records: Sequence[Record], retriever: Retriever, k: int, teacher: Teacher, dropped: Counter[str]
) -> list[GoldTrajectory]:
    """``render_gold`` of ``records``; if a record cannot be rendered (``ValueError``: an empty
    sub-answer or search keywords, a tag in one), the batch is rendered record by record and
    that record is dropped (counted in ``dropped``). Pass a :class:`_MemoRetriever` so that the
    fallback does not search again."""
    try:
        return render_gold(records, retriever, k=k, teacher=teacher)
    except ValueError:
        pass
    out = []
    for r in records:
        try:
            out.extend(render_gold([r], retriever, k=k, teacher=teacher))
        except ValueError as e:
            log.warning("record %s cannot be rendered, dropped: %s", r.id, e)
            dropped["cannot be rendered"] += 1
    return out


def teach_chunk(
    records: Sequence[Record], retriever: Retriever, k: int, llm: LLMTeacher | None, dropped: Counter[str]
) -> list[GoldTrajectory]:
    """The gold trajectories of one chunk, with the template teacher (``llm`` None) or the LLM's thoughts."""
    memo = _MemoRetriever(retriever)
    if llm is None:
        return render_records(records, memo, k, TemplateTeacher(), dropped)
    collector = _HitCollector()
    renderable = {t.id for t in render_records(records, memo, k, collector, dropped)}
    ok = [r for r in records if r.id in renderable]
    thoughts = llm.write_thoughts(collector.items(ok))
    failed = sum(1 for r in ok if thoughts.get(r.id) is None)
    if failed:
        dropped["LLM teacher failed a thought"] += failed
    written = {rid: t for rid, t in thoughts.items() if t is not None}
    return render_records([r for r in ok if r.id in written], memo, k, PrecomputedTeacher(written), dropped)


# ----------------------------------------------------------------------------- the entry point


def default_cache_path(out_path: str | os.PathLike[str]) -> str:
    """``OUT.llm_cache.jsonl`` beside the output file."""
    out = Path(out_path)
    return str(out.with_name(out.name + ".llm_cache.jsonl"))


def build_sft_data(
    data: str | os.PathLike[str] | Sequence[Record],
    out_path: str | os.PathLike[str],
    config: SFTDataConfig | None = None,
    *,
    index: str | None = None,
    retriever: Retriever | None = None,
    llm: LLMTeacher | None = None,
) -> SFTDataSummary:
    """Write the gold trajectories of ``data`` (a record file or records) to ``out_path``, resuming.

    The retriever is ``retriever``, else :func:`~prorag.retrieval.index.open_retriever` of
    ``index`` (a folder or an ``http(s)://`` URL). With ``teacher="llm"`` the thoughts come from
    ``llm`` if given (tests pass one), else an :class:`~prorag.supervision.llm_teacher.LLMTeacher` of
    ``config.llm``. Returns the counts. A record file without a record is refused before anything
    is written.
    """
    cfg = config or SFTDataConfig()
    if retriever is None and index is None:
        raise ValueError("build_sft_data needs a retriever or an index")
    records = read_records(data) if isinstance(data, (str, os.PathLike)) else list(data)
    if not records and isinstance(data, (str, os.PathLike)):
        raise DataError(str(data), "no records (an empty file): no trajectories to write; nothing written")
    if retriever is None:
        from prorag.retrieval.index import open_retriever

        retriever = open_retriever(index)
    if cfg.teacher == "template":
        llm = None
    elif llm is None and cfg.llm is not None:  # SFTDataConfig checks that an llm teacher has settings
        llm_cfg = cfg.llm if cfg.llm.cache_path is not None else replace(cfg.llm, cache_path=default_cache_path(out_path))
        llm = LLMTeacher(llm_cfg)
    teacher_name = f"llm:{llm.config.model}" if llm is not None else "template"

    summary = SFTDataSummary(llm=llm.usage if llm is not None else None)
    out = Path(out_path)
    with JsonlAppender(out) as appender:  # repairs a cut last line before the done ids are read
        todo = select_records(records, done_ids(out), cfg.limit, summary)
        todo, summary.over_long = within_max_chars(todo, lambda r: len(r.question), cfg.max_chars)
        if summary.already_done:
            log.info("resuming: %d records already in %s", summary.already_done, out)
        for start in range(0, len(todo), cfg.chunk_size):
            chunk = todo[start : start + cfg.chunk_size]
            written, over = within_max_chars(
                teach_chunk(chunk, retriever, cfg.top_k, llm, summary.dropped), trajectory_chars, cfg.max_chars
            )
            summary.over_long += over
            for traj in written:
                appender.append(traj.to_dict() | {"teacher": teacher_name})
                summary.written += 1
                summary.hops += len(traj.retrievals)
                summary.missing_gold_hops += len(traj.missing_gold)
                summary.missing_gold_trajectories += bool(traj.missing_gold)
            log.info("sft-data: %d of %d records done", min(start + cfg.chunk_size, len(todo)), len(todo))
    return summary


__all__ = [
    "SFTDataConfig",
    "SFTDataSummary",
    "build_sft_data",
    "default_cache_path",
    "done_ids",
    "render_records",
    "select_records",
    "teach_chunk",
    "trajectory_chars",
    "within_max_chars",
]
