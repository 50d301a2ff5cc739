"""Which RL questions to train on: screening by the initial policy's pass rate.

Outcome-only GRPO learns nothing from a question whose G samples are all right or all wrong (every
advantage in the group is 0), and on the built-in worlds most groups agree (``groups_em_agree`` in the
RL stage's log). DAPO (Yu et al., 2025, "dynamic sampling") over-samples and keeps the groups whose
outcomes disagree; this module does it once, before training: each candidate gets ``group_size``
samples from the initial policy at the RL rollout settings, and ``question_filter: mixed`` keeps those
with a pass rate strictly between 0 and 1. Once is far cheaper than per step and keeps TRL's batch
shapes fixed; the cost is that the pass rates are pi_init's, not the learning policy's. It drops the
all-wrong questions too, where a process reward is the only signal, so it favours outcome-only
training: compare arms on one screened set (same seed, same initial policy: same set).

``mixed`` keeps yes/no questions far above their share (their samples rarely all agree), and outcome
RL then learns the answer's form; ``screening_strata`` holds them to the pool's shares (:func:`stratum_quotas`).
Rows go to ``screening.jsonl`` (or ``screening_file``): a resumed run, or one with the same key, re-screens none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prorag.agent.rollout_config import RolloutConfig
from prorag.core.lazy_modules import lazy_module
from prorag.data.jsonl import JsonlAppender, read_jsonl
from prorag.data.records import Record
from prorag.method.advantages import disagreeing_groups
from prorag.method.rewards.outcome import trajectory_em

if TYPE_CHECKING:
    import torch
    from tqdm import auto as tqdm_auto
else:
    torch = lazy_module("torch")
    tqdm_auto = lazy_module("tqdm.auto")  # 50 ms (asyncio): imported when a bar starts


log = logging.getLogger(__name__)

#: The values of ``RLConfig.question_filter``.
QUESTION_FILTERS: tuple[str, ...] = ("none", "mixed")

#: The optimiser step that :func:`~prorag.stages.rl.row_seed` keys the RL stage's screening streams
#: by: before the first step, so no training row ever shares a stream with a screening sample.
SCREENING_STEP = -1


def mixed_questions(em: Sequence[Sequence[float]]) -> list[bool]:
    """For each question's sample EMs, whether they disagree (some right, some wrong)."""
    values = torch.tensor([v for row in em for v in row], dtype=torch.float32)
    groups = torch.tensor([q for q, row in enumerate(em) for _ in row], dtype=torch.long)
    mixed = set(disagreeing_groups(values, groups))
    return [q in mixed for q in range(len(em))]


def stratum_quotas(labels: Sequence[str], total: int) -> dict[str, int]:
    """How many of ``total`` kept questions each stratum gets: its share of ``labels`` (one label
    per candidate question) times ``total``, rounded by largest remainder so that the quotas sum
    to ``total`` exactly; equal remainders go to the stratum seen first (deterministic).

    With ``screening_strata`` (a metadata field, e.g. ``type``) a mixed question is kept only while
    its stratum's quota has room. A stratum with too few mixed questions leaves its quota short rather
    than handing it to another (which would bring the shift back), so fewer than ``limit`` questions
    may be kept; screening then runs to the end."""
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    if not counts:
        return {}
    exact = {label: total * n / len(labels) for label, n in counts.items()}
    quotas = {label: int(x) for label, x in exact.items()}
    order = sorted(counts, key=lambda label: -(exact[label] - quotas[label]))  # stable: first seen wins ties
    for label in order[: total - sum(quotas.values())]:
        quotas[label] += 1
    return quotas


def screen_questions(
    records: Sequence[Record],
    model: Any,
    tokenizer: Any,
    retriever: Any,
    rollout: RolloutConfig,
    *,
    group_size: int,
    sample_seed: Callable[[int], int],
    keep: int | None = None,
    path: str | Path | None = None,
    key: str = "",
    earlier_keys: Sequence[str] = (),
    chunk_questions: int = 64,
    progress: bool = True,
    strata: Sequence[str] | None = None,
) -> list[Record]:
    """The questions of ``records`` whose ``group_size`` samples by ``model`` disagree on EM, in
    order, at most ``keep`` of them (screening stops once that many are kept).

    Questions are screened ``chunk_questions`` at a time; sample ``j`` of the ``i``-th candidate
    samples from the stream ``sample_seed(i * group_size + j)`` (the RL stage passes
    ``row_seed(seed, SCREENING_STEP, .)``), so a question's samples do not depend on the chunking or
    on what was screened before a resume. ``path`` (JSONL) holds the screening rows: those already
    there under the same ``key`` (what they were sampled under, :func:`~prorag.stages.rl.screening_key`)
    or one of ``earlier_keys`` (the same settings as an earlier version keyed them,
    :func:`~prorag.stages.rl.screening_keys`) are reused, new ones appended under ``key``. ``strata``
    (one label per record, with ``keep``) keeps at most :func:`stratum_quotas` of each label,
    screening until every quota is met. Rows are appended chunk by chunk (flushed), one per question
    (``id``, ``key``, ``em`` of each sample, ``kept``)."""
    if strata is not None and keep is None:
        raise ValueError("strata needs keep: the quotas are shares of the number of questions kept")
    if strata is not None and len(strata) != len(records):
        raise ValueError(f"strata needs one label per record, got {len(strata)} labels for {len(records)} records")
    quotas = stratum_quotas(strata, keep) if strata is not None and keep is not None else None  # keep: checked above
    label = dict(zip((r.id for r in records), strata, strict=True)) if strata is not None else {}
    taken = dict.fromkeys(quotas or {}, 0)
    done: dict[str, list[float]] = {}
    if path is not None and Path(path).exists():
        lines = read_jsonl(path, tolerate_truncated_tail=True)
        accepted = {key, *earlier_keys}
        done = {str(row["id"]): [float(v) for v in row["em"]] for row in lines if row.get("key", "") in accepted}
    from prorag.agent.rollout import RolloutEngine  # the engine imports torch: not at import (--help)

    engine = RolloutEngine(model, tokenizer, retriever, rollout)
    kept: list[Record] = []
    screened = 0
    starts = range(0, len(records), chunk_questions)
    appender = JsonlAppender(path) if path is not None else None
    try:
        for start in tqdm_auto.tqdm(starts, desc="rl screening", unit="chunk", disable=not progress):
            if keep is not None and len(kept) >= keep:
                break  # with strata: the quotas sum to keep, so every one is met
            chunk = list(records[start : start + chunk_questions])
            todo = [(start + i, r) for i, r in enumerate(chunk) if r.id not in done]
            if todo:
                rows = [r for _, r in todo for _ in range(group_size)]
                seeds = [sample_seed(i * group_size + j) for i, _ in todo for j in range(group_size)]
                trajectories = engine.rollout(rows, row_seeds=seeds)
                ems = [trajectory_em(t, r.golden_answers, tokenizer) for t, r in zip(trajectories, rows, strict=True)]
                new = [ems[k * group_size : (k + 1) * group_size] for k in range(len(todo))]
                done.update((r.id, e) for (_, r), e in zip(todo, new, strict=True))
            flags = dict(zip((r.id for r in chunk), mixed_questions([done[r.id] for r in chunk]), strict=True))
            if todo and appender is not None:
                appender.extend([{"id": r.id, "key": key, "em": done[r.id], "kept": flags[r.id]} for _, r in todo])
            for r in chunk:
                if flags[r.id] and (quotas is None or taken[label[r.id]] < quotas[label[r.id]]):
                    kept.append(r)
                    if quotas is not None:
                        taken[label[r.id]] += 1
            screened += len(chunk)
    finally:
        if appender is not None:
            appender.close()
    log.info("RL screening: kept %d of %d screened questions (mixed outcomes)", len(kept), screened)
    if quotas is not None:
        short = {k: f"{taken[k]} of {q}" for k, q in quotas.items() if taken[k] < q}
        log.info("RL screening strata kept %s%s", taken, f"; short of quota: {short}" if short else "")
    return kept[:keep] if keep is not None else kept


__all__ = ["QUESTION_FILTERS", "SCREENING_STEP", "mixed_questions", "screen_questions", "stratum_quotas"]
