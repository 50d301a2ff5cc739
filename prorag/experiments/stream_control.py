"""Does RL learn at all? Each run's training rewards against the start policy's on the same questions.

A run's training reward rising over a pass says little by itself: the questions change from batch to
batch, and a stream that happens to get easier (or harder) moves the curve as much as the updates do.
The control that takes the questions out is the start policy sampled on the same stream: RL at
learning rate 0 (the ``frozen`` arm of ``prorag ablate``, :data:`FROZEN_ARM`), whose optimiser runs
and changes nothing. A seed feeds every arm the same questions in the same order and batches (as
long as the arms share ``rl.limit``, the question filter and the batch size), so the rows that log a
training signal at the same step in two runs of one seed scored samples of the same questions. Their
difference is what the updates did to questions the policy had not yet been trained on (one pass:
every batch is new), with each batch's difficulty taken out.

A schedule that learns sits above its ``frozen`` stream over the second half of the pass; one whose
updates are noise at the signal it has, or that trades answers for something else the reward pays
for, sits at or below it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prorag.core.statistics import mean_and_ci, paired_t_test
from prorag.data.jsonl import read_jsonl

#: The control arm's name in an arms ablation (reserved: no extra arm may take it).
FROZEN_ARM = "frozen"
#: Its assignments on top of outcome-only GRPO: the same run, optimiser steps of size 0.
FROZEN_ASSIGNMENTS: tuple[str, ...] = ("learning_rate=0",)
#: The training signal compared: the rollouts' answer exact match, what every arm is meant to raise
#: whatever its reward adds (a format bonus or step rewards can rise while answers fall).
STREAM_KEY = "answer_em"


def stream_difference(
    rows: Sequence[Mapping[str, Any]], control_rows: Sequence[Mapping[str, Any]], key: str = STREAM_KEY, parts: int = 4
) -> dict[str, Any]:
    """A run's training ``key`` against a control run's on the same rollout batches.

    Rows are paired by ``step`` (the rows that log ``key``: a dev evaluation at a step shares that
    step's row, and one before the first step has a row without ``key``); steps only one run
    reached are left out. Returned: the number of paired batches, the run's and the
    control's means over ``parts`` equal stretches of them (the trend, with the stream's own trend
    beside it), and the mean of the differences over the second half with its paired t-test across
    batches (``None`` below two batches). The second half is the part to read: by then the run has
    had half a pass of updates, and its first batches are the start policy's in both runs."""

    def by_step(source: Sequence[Mapping[str, Any]]) -> dict[int, float]:
        return {int(r["step"]): float(r[key]) for r in source if key in r}

    mine, theirs = by_step(rows), by_step(control_rows)
    steps = sorted(set(mine) & set(theirs))
    if not steps:
        raise ValueError(f"no rollout batch logs '{key}' at the same step in both runs")
    size = max(1, len(steps) // parts)
    stretches = [steps[i * size : (i + 1) * size] for i in range(parts)] if len(steps) >= parts else [steps]

    def mean(values: list[float]) -> float:
        return round(sum(values) / len(values), 4)

    second = steps[len(steps) // 2 :]
    test = paired_t_test([mine[s] for s in second], [theirs[s] for s in second]) if len(second) >= 2 else None
    return {
        "batches": len(steps),
        "run_by_part": [mean([mine[s] for s in part]) for part in stretches if part],
        "control_by_part": [mean([theirs[s] for s in part]) for part in stretches if part],
        "second_half_diff": mean([mine[s] - theirs[s] for s in second]),
        "second_half_p": None if test is None else round(test.p_value, 4),
    }


def stream_statistics(
    metrics_files: Mapping[str, Mapping[int, Path]], control_files: Mapping[int, Path], key: str = STREAM_KEY
) -> dict[str, Any]:
    """Every arm's runs against the control's runs of the same seeds (:func:`stream_difference`).

    ``metrics_files[arm][seed]`` and ``control_files[seed]`` are runs' ``metrics.jsonl``; a seed
    missing on either side, or a file not there, is left out of that arm, and a seed whose two runs
    share no logged batch is listed under ``unpaired_seeds``. Per arm: ``per_seed``
    (each seed's :func:`stream_difference`) and, over two seeds or more, ``second_half_diff`` (the
    mean over seeds of each seed's second-half difference), its 95% CI over seeds and the p-value
    of the seeds' differences against 0: the number that says whether the schedule learns."""
    controls = {s: list(read_jsonl(f)) for s, f in control_files.items() if Path(f).is_file()}
    out: dict[str, Any] = {"control": FROZEN_ARM, "key": key, "arms": {}}
    for arm, files in metrics_files.items():
        per_seed: dict[str, Any] = {}
        unpaired: list[str] = []
        for seed, path in files.items():
            if seed not in controls or not Path(path).is_file():
                continue
            try:
                per_seed[str(seed)] = stream_difference(list(read_jsonl(path)), controls[seed], key)
            except ValueError:  # no batch in common (a run that logs no `key`, or other steps)
                unpaired.append(str(seed))
        row: dict[str, Any] = {"per_seed": per_seed, **({"unpaired_seeds": unpaired} if unpaired else {})}
        diffs = [d["second_half_diff"] for d in per_seed.values()]
        if len(diffs) >= 2:
            mean, ci = mean_and_ci(diffs)
            test = paired_t_test(diffs, [0.0] * len(diffs))
            row |= {"second_half_diff": mean, "second_half_ci95": ci, "second_half_p": test.p_value}
        out["arms"][arm] = row
    return out


def stream_table(stream: Mapping[str, Any]) -> str:
    """:func:`stream_statistics` as console lines: each arm's training EM minus the control's over
    the second half of the pass, in points, mean ± 95% CI over seeds."""
    lines = [f"training {stream['key']} against {stream['control']} (the start policy on the same questions), second half:"]
    for arm, row in stream["arms"].items():
        seeds = ", ".join(f"{100 * d['second_half_diff']:+.1f}" for d in row["per_seed"].values())
        summary = (
            f"{100 * row['second_half_diff']:+.1f} ± {100 * row['second_half_ci95']:.1f} (p={row['second_half_p']:.3f}); "
            if "second_half_diff" in row
            else ""
        )
        lines.append(f"  {arm}: {summary}seeds {seeds or '(none paired)'}")
    return "\n".join(lines)


__all__ = ["FROZEN_ARM", "FROZEN_ASSIGNMENTS", "STREAM_KEY", "stream_difference", "stream_statistics", "stream_table"]
