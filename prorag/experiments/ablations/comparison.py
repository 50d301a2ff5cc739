"""An arms comparison's numbers from each arm's evaluations per seed: what both `prorag ablate` and
`prorag compare` report.

:func:`process_statistics` gives per arm the mean ± 95% CI over seeds of EM, F1 and the per-seed
metrics read beside them (:func:`read_evaluation`, :func:`training_signals`), EM by question type and
hops, and the tests of each arm against the reference and against its control (``vs_OTHER*`` keys).
Surprising choices: the per-question test averages each arm over the seeds both arms ran only (an arm
with extra seeds would otherwise pair different rollout streams); the test to read first is the one
over seeds, since a whole run's seed noise is larger than a question's; and the runs are also tested
as unpaired sets (permutation), because runs that share a seed part within a few RL steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prorag.core.metrics import yes_no_scores
from prorag.core.statistics import mean_and_ci, paired_t_test, permutation_test
from prorag.data.jsonl import read_json, read_jsonl
from prorag.evaluation.step_errors import STEP_VALIDITY_RATES

#: Per-seed evaluation metrics (``metrics.json``) the family comparison reports beside EM and F1.
FAMILY_METRICS: tuple[str, ...] = (
    "cover_em",
    "format_valid_rate",
    "mean_retrieval_steps",
    "searches_below_hops_rate",
    "over_search_rate",
    "under_search_rate",
    *STEP_VALIDITY_RATES,
)
#: Per-seed evaluation metrics the process ablation reports beside EM and F1: how often and how deep
#: each arm searches, and how many of its steps the oracle finds valid (step rewards are meant to
#: change the steps, so a change shows here first).
PROCESS_METRICS: tuple[str, ...] = ("format_valid_rate", "mean_retrieval_steps", "searches_below_hops_rate", *STEP_VALIDITY_RATES)
#: Per-seed values an arm is tested on against its reference and its control, paired over the seeds
#: both ran: ``(per-seed key, suffix of the vs_OTHER_SUFFIX result)``.
PAIRED_OVER_SEEDS: tuple[tuple[str, str], ...] = (
    ("em", "by_seed"),
    ("non_yes_no_em", "non_yes_no_by_seed"),
    *((rate, f"{rate}_by_seed") for rate in STEP_VALIDITY_RATES),
)
#: Every test an arm gets against another, as the suffix of its ``vs_OTHER_SUFFIX`` key: the per-question
#: t-test (no suffix), those over seeds (:data:`PAIRED_OVER_SEEDS`) and the unpaired permutation test.
TEST_KINDS: tuple[str, ...] = ("", *(f"_{suffix}" for _, suffix in PAIRED_OVER_SEEDS), "_runs")


def _group_means(
    scores: Mapping[str, float], key_of: Mapping[str, str], searches: Mapping[str, float] | None = None
) -> dict[str, dict[str, float]]:
    """Mean of per-question ``scores`` in each group of ``key_of`` (question id -> group), and of
    per-question ``searches`` (``searches``, where every question of the group has one)."""
    groups: dict[str, list[str]] = {}
    for qid in scores:
        if qid in key_of:
            groups.setdefault(key_of[qid], []).append(qid)
    out: dict[str, dict[str, float]] = {}
    for key, qids in sorted(groups.items()):
        out[key] = {"n": len(qids), "em": sum(scores[q] for q in qids) / len(qids)}
        if searches is not None and all(q in searches for q in qids):
            out[key]["searches"] = sum(searches[q] for q in qids) / len(qids)
    return out


def _seed_averaged(em_by_seed: Mapping[str, Mapping[str, float]], seeds: Sequence[str]) -> dict[str, float]:
    """Per-question EM averaged over ``seeds`` (the questions every one of those seeds answered)."""
    questions = set.intersection(*(set(em_by_seed[s]) for s in seeds))
    return {q: sum(em_by_seed[s][q] for s in seeds) / len(seeds) for q in questions}


def _versus(
    stats: Mapping[str, Any], em_by_seed: Mapping[str, Mapping[str, Mapping[str, float]]], arm: str, other: str
) -> dict[str, dict[str, Any]]:
    """The tests of ``arm`` against ``other`` under ``vs_OTHER*`` keys (see :func:`process_statistics`).

    The per-question test averages each arm over the seeds both ran: where one arm has seeds the
    other lacks (a study that finished its arms unevenly), averaging each over its own seeds would
    pair a question's score under some rollout streams with its score under others."""
    out: dict[str, dict[str, Any]] = {}
    common = sorted(em_by_seed[arm].keys() & em_by_seed[other].keys())
    mine, theirs = (_seed_averaged(em_by_seed[a], common or sorted(em_by_seed[a])) for a in (arm, other))
    shared = sorted(mine.keys() & theirs.keys())
    out[f"vs_{other}"] = asdict(paired_t_test([mine[q] for q in shared], [theirs[q] for q in shared]))
    # Over the seeds both have: EM, EM on the questions whose answer has to be found (not yes/no),
    # where a gain is not a gain in the answer's form, and the oracle's step-validity rates, where
    # step rewards show first (PAIRED_OVER_SEEDS).
    for metric, suffix in PAIRED_OVER_SEEDS:
        pair = [stats[a]["per_seed"] for a in (arm, other)]
        both = sorted(s for s in pair[0].keys() & pair[1].keys() if all(metric in p[s] for p in pair))
        if len(both) >= 2:
            values = [[p[s][metric] for s in both] for p in pair]
            # The paired difference's own 95% CI (t over the seeds' differences): what a reader
            # quotes as "+x ± y EM", beside the test's p-value.
            _, ci95 = mean_and_ci(a - b for a, b in zip(*values, strict=True))
            out[f"vs_{other}_{suffix}"] = asdict(paired_t_test(*values)) | {"ci95": ci95, "seeds": both}
    # The runs as two sets, unpaired: runs whose float paths part within a few steps share a
    # seed in name only, so this test does not lean on the pairing.
    runs = [[v["em"] for v in stats[a]["per_seed"].values()] for a in (arm, other)]
    if min(map(len, runs)) >= 2:
        out[f"vs_{other}_runs"] = asdict(permutation_test(*runs))
    return out


def process_statistics(
    predictions: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
    reference: str = "grpo",
    extras: Mapping[str, Mapping[int, Mapping[str, float | None]]] | None = None,
    controls: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An arms ablation's numbers from each arm's per-seed prediction rows (``predictions.jsonl``).

    Per arm: per-seed EM/F1, their mean ± 95% CI over seeds (:func:`mean_and_ci`), EM by question
    ``type`` and ``hops`` (of the seed-averaged per-question EM) and, for every arm but
    ``reference``, a paired t-test of seed-averaged per-question EM against it (over the questions
    both have, each averaged over the seeds both ran). Averaging over seeds first takes the seed
    noise out of each question's score.
    That test treats the questions as the sample and so ignores how much a whole run varies with
    its seed, which is the larger noise here (one seed that collapses moves every question), so
    each arm also gets ``vs_REFERENCE_by_seed``: a paired t-test of per-seed EM over the seeds both
    have (the same seed gives both arms the same rollout streams), the test to read first, with the
    differences' 95% CI (``ci95``) and the seeds it pairs (``seeds``), and
    ``vs_REFERENCE_non_yes_no_by_seed``, the same on the EM of the questions that are not yes/no,
    ``vs_REFERENCE_valid_search_rate_by_seed`` (and sub-answers, answers) the same on the oracle's
    step-validity rates where the evaluations measured them (:data:`PAIRED_OVER_SEEDS`), and
    ``vs_REFERENCE_runs``, an exact permutation test of the two arms' per-seed EM as unpaired sets
    (:func:`permutation_test`; the same seed's runs part within a few RL steps, so the pairing may
    buy nothing).
    ``extras[arm][seed]`` adds per-seed scalars (``None``: not measured) with their mean and CI, as
    do the yes/no scores of the rows (:func:`yes_no_scores`): an arm can gain EM there by saying
    one word more often, which ``yes_no_constant_em`` puts in proportion.
    ``controls`` (arm -> its control arm, e.g. :data:`CONTROLS`) adds the same tests against the
    arm's control, under ``vs_CONTROL*`` keys, and names it under ``control``, where both ran."""
    out: dict[str, Any] = {}
    em_by_seed: dict[str, dict[str, dict[str, float]]] = {}
    for arm, by_seed in predictions.items():
        per_seed = {
            str(s): {m: sum(float(r[m]) for r in rows) / len(rows) for m in ("em", "f1")}
            | (yes_no_scores((r.get("prediction"), r["golden_answers"]) for r in rows if "golden_answers" in r) or {})
            for s, rows in by_seed.items()
        }
        for seed, values in (extras or {}).get(arm, {}).items():
            per_seed.setdefault(str(seed), {}).update({k: v for k, v in values.items() if v is not None})
        em, em_ci = mean_and_ci(v["em"] for v in per_seed.values())
        f1, f1_ci = mean_and_ci(v["f1"] for v in per_seed.values())
        scores: dict[str, list[float]] = {}
        steps: dict[str, list[float]] = {}
        meta: dict[str, dict[str, str]] = {"type": {}, "hops": {}}
        for rows in by_seed.values():
            for r in rows:
                scores.setdefault(str(r["id"]), []).append(float(r["em"]))
                if "retrieval_steps" in r:
                    steps.setdefault(str(r["id"]), []).append(float(r["retrieval_steps"]))
                for key in meta:
                    if key in r:
                        meta[key][str(r["id"])] = str(r[key])
        em_by_seed[arm] = {str(s): {str(r["id"]): float(r["em"]) for r in rows} for s, rows in by_seed.items()}
        averaged = {q: sum(v) / len(v) for q, v in scores.items()}
        searches = {q: sum(v) / len(v) for q, v in steps.items() if len(v) == len(scores[q])}
        out[arm] = {"per_seed": per_seed, "em": em, "em_ci95": em_ci, "f1": f1, "f1_ci95": f1_ci}
        for key in sorted({k for v in per_seed.values() for k in v} - {"em", "f1"}):
            values = [v[key] for v in per_seed.values() if key in v]
            out[arm][key], out[arm][f"{key}_ci95"] = mean_and_ci(values) if len(values) > 1 else (values[0], 0.0)
        out[arm] |= {f"by_{key}": _group_means(averaged, meta[key], searches) for key in meta if meta[key]}
    for arm in out:
        if arm != reference and reference in em_by_seed:
            out[arm] |= _versus(out, em_by_seed, arm, reference)
        control = (controls or {}).get(arm)
        if control in out:
            out[arm]["control"] = control
            out[arm] |= _versus(out, em_by_seed, arm, control)
    return out


#: Training-log means an arms table reports: ``metrics.jsonl`` key -> the stats key.
TRAINING_SIGNALS: dict[str, str] = {
    "step_time": "seconds_per_rl_step",
    "groups_em_agree": "groups_em_agree",
    "groups_reward_agree": "groups_reward_agree",
    "advantage_process_share": "advantage_process_share",
    "advantage_silent_share": "advantage_silent_share",
}


def training_signals(metrics_file: Path) -> dict[str, float | None]:
    """Means over an RL run's ``metrics.jsonl`` of :data:`TRAINING_SIGNALS` (``None`` where never
    logged, e.g. an offline arm): the wall time of one optimiser step, and the share of rollout
    groups whose samples all agree on EM, or all get one outcome reward. The last two are how
    much outcome signal an arm had: a group whose outcome rewards all agree has zero outcome
    advantage, so only a step reward can teach on it, and the gap between the two counts the
    groups that agree on the answer but whose outcome rewards still differ (its format terms).
    Then what the arm's advantages were made of (:func:`~prorag.method.advantages.advantage_composition`):
    the share of their size the step rewards add to outcome GRPO's, and the share that falls on
    the groups GRPO is silent on (both 0 for GRPO)."""
    rows = list(read_jsonl(metrics_file)) if metrics_file.exists() else []
    out: dict[str, float | None] = {}
    for key, name in TRAINING_SIGNALS.items():
        values = [float(r[key]) for r in rows if key in r]
        out[name] = sum(values) / len(values) if values else None
    return out


def read_evaluation(folder: Path, metrics: Sequence[str] = ()) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """One evaluation folder (``prorag eval --out``) as an arm's seed: its prediction rows, and the
    ``metrics`` its ``metrics.json`` holds, ``None`` where not measured (no over-search without
    re-asking; no ``metrics.json`` at all where only the predictions were kept)."""
    rows = list(read_jsonl(folder / "predictions.jsonl"))
    measured = read_json(folder / "metrics.json") if (folder / "metrics.json").is_file() else {}
    return rows, {m: measured.get(m) for m in metrics}
