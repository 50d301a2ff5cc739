"""Which RL questions to train on: screening by the initial policy's pass rate.

Outcome-only GRPO learns nothing from a question whose G samples are all right or all wrong:
every advantage in the group is 0. On the built-in worlds 70-80% of the groups agree (the
``groups_em_agree`` the RL stage logs), so most of each rollout batch is generated and then
discarded by the advantage, and the few informative groups are diluted in the token-mean loss.
DAPO's remedy (Yu et al., 2025, "dynamic sampling") over-samples and keeps only the groups
whose outcomes disagree. This module does the same once, before training: every candidate
question gets ``group_size`` samples from the initial policy at the RL rollout settings, and
``question_filter: mixed`` keeps the questions with a pass rate strictly between 0 and 1.

The choice made: screening once is far cheaper than DAPO's per-step over-sampling (one
generation pass over the questions actually screened, stopped as soon as ``limit`` questions
are kept) and keeps TRL's batch shapes fixed; its cost is that the pass rates are those of
pi_init, not of the policy as it learns. It is an outcome criterion: it also drops the
all-wrong questions, where a process reward is the only signal, so it favours outcome-only
training; compare arms on one screened set (same seed, same initial policy: same set).

Because a question two words can answer (yes or no) is one whose samples rarely all agree,
``mixed`` keeps such questions far above their share of the pool, and outcome RL then learns the
answer's form (the measurements are in docs/LOG.md, 2026-11-24). ``screening_strata`` (a metadata field, e.g.
``type``) holds the kept questions to the pool's shares instead: each value of the field gets a
quota of ``limit`` in proportion to its share of the candidates (:func:`stratum_quotas`), and a
mixed question is kept only while its stratum's quota has room. A stratum with too few mixed
questions leaves its quota short rather than handing it to another (which would bring the
shift back), so fewer than ``limit`` questions may be kept; screening then runs to the end.

Screening results are appended chunk by chunk (flushed) to ``screening.jsonl`` in the run folder (or the
config's ``screening_file``), one row per question (``id``, ``key``, ``em`` of each sample,
``kept``); a resumed run, or another run with the same key, re-screens nothing already there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from prorag.agent.rollout import RolloutConfig, RolloutEngine
from prorag.data.jsonl import JsonlAppender, read_jsonl
from prorag.data.records import Record
from prorag.method.advantages import disagreeing_groups
from prorag.method.rewards.outcome import trajectory_em

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
    to ``total`` exactly; equal remainders go to the stratum seen first (deterministic)."""
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
    screening until every quota is met."""
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
    engine = RolloutEngine(model, tokenizer, retriever, rollout)
    kept: list[Record] = []
    screened = 0
    starts = range(0, len(records), chunk_questions)
    appender = JsonlAppender(path) if path is not None else None
    try:
        for start in tqdm(starts, desc="rl screening", unit="chunk", disable=not progress):
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
