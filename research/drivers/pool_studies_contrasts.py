"""Every contrast the process studies tested, read back from the committed results files.

The LOG and the README (up to commit 3bcb8f8) reported each study's contrasts one at a time: a step
reward against outcome-only GRPO, against its shuffled control, the control against GRPO, one step
reward against another, at the last step and at the dev-chosen step, over seeds and per question, on
the questions that are not yes/no, by hop count and by the oracle's verdicts on the test steps. This
module lists those pairs (:data:`STEP_REWARD_PAIRS`, :data:`OUTCOME_RL_PAIRS`) and recomputes each
outcome that the committed files hold (:func:`tested_contrasts`): a paired t over seeds from the
per-seed values, a paired t over the 400 test questions of seed-averaged EM where the files keep each
question's EM (else the per-question p the file stored), a one-sample t against pi_rft's fixed score.
What the files do not hold is transcribed from the LOG (:data:`LOG_ONLY`). The pairs that a prediction
named before their runs carry it (:data:`PREDICTED`).

Surprising choice: by-hop contrasts are computed here although the LOG printed their means only; a
table that shows a difference invites the reader to test it, so it counts as a look.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from prorag.core.statistics import paired_t_test
from research.drivers import pool_studies_data as data
from research.drivers.pool_studies_data import B1, B2, B3, B4, B5, B7, B8, B9, OFE, ROOT, TINY, WIDE

STEP_REWARDS = "step rewards"
OUTCOME_RL = "outcome RL"

# Result files beyond the pooling's inputs, with their schemas.
B1_GRPO = "rl_small_2026-11-24.json"
B2_KL = "grpo_kl_rebuild_small_2026-11-25.json"
B3_WORLDS = "rl_worlds_small_2026-11-26.json"
B3_VALIDITY = "step_validity_build3_2026-11-27.json"
B8_PTX_ONLY = "rl_ptx_build8_2026-11-29.json"
B9_FIVE = "rl_two_pass_build9_5seeds_2026-11-29.json"
SCHEMA: dict[str, str] = {
    **data.FILE_SCHEMA,
    B1_GRPO: "small_rl",
    B2_KL: "rebuild",
    B3_WORLDS: "runs",
    B8_PTX_ONLY: "runs",
    B9_FIVE: "runs",
}
# Runs files whose valid-step rates live in another file (build 3's evaluations, judged afterwards).
VALIDITY_FILE = {data.B3_OFE: B3_VALIDITY, data.B3_PRM: B3_VALIDITY}

#: The outcomes a pair is tested on: (metric, step, test). ``dev_em`` is dev EM at the last step.
OUTCOMES: tuple[tuple[str, str, str], ...] = (
    ("em", "last", "seeds"),
    ("em", "last", "questions"),
    ("em", "dev", "seeds"),
    ("em", "dev", "questions"),
    ("non_yes_no_em", "last", "seeds"),
    ("valid_search", "last", "seeds"),
    ("valid_subanswer", "last", "seeds"),
    ("dev_em", "last", "seeds"),
    ("hop1", "last", "seeds"),
    ("hop2", "last", "seeds"),
    ("hop3", "last", "seeds"),
    ("hop4", "last", "seeds"),
)
METRIC_NAMES = {
    "em": "test EM",
    "non_yes_no_em": "test EM, non-yes/no questions",
    "valid_search": "valid searches (oracle's verdicts)",
    "valid_subanswer": "valid sub-answers (oracle's verdicts)",
    "dev_em": "dev EM at the last step",
    "hop1": "test EM, 1-hop",
    "hop2": "test EM, 2-hop",
    "hop3": "test EM, 3-hop",
    "hop4": "test EM, 4-hop",
}


@dataclass(frozen=True)
class Pair:
    """One reported comparison: ``arm`` minus ``reference`` (an arm key, or ``pi_rft`` for the fixed
    initial policy) in ``study``; ``files`` maps a step (``last``, ``dev``) to the file holding it.
    ``outcomes`` narrows the tested outcomes (all of :data:`OUTCOMES` when empty)."""

    family: str
    study: str
    label: str
    arm: str
    reference: str
    files: dict[str, str]
    outcomes: tuple[tuple[str, str, str], ...] = field(default=())


def _pairs(family: str, study: str, files: dict[str, str], rows: list[tuple[str, str, str]]) -> list[Pair]:
    return [Pair(family, study, label, arm, ref, files) for label, arm, ref in rows]


def _both(file: str) -> dict[str, str]:
    return {"last": file, "dev": file}


STEP_REWARD_PAIRS: list[Pair] = [
    *_pairs(
        STEP_REWARDS,
        TINY,
        {"last": data.TINY_PROCESS},
        [
            ("learned PRM vs GRPO", "prorag", "grpo"),
            ("oracle, every step, vs GRPO", "prorag-oracle", "grpo"),
            ("PRM's shuffled control vs GRPO", "prorag-shuffled", "grpo"),
            ("learned PRM vs its shuffled control", "prorag", "prorag-shuffled"),
        ],
    ),
    *_pairs(STEP_REWARDS, TINY, {"last": data.TINY_OFE}, [("oracle, first error, vs GRPO", OFE, "grpo")]),
    *_pairs(
        STEP_REWARDS,
        TINY,
        {"last": data.TINY_FAMILY},
        [
            ("learned PRM vs GRPO (run again beside the family)", "prorag", "grpo"),
            ("oracle, every step, vs GRPO (run again beside the family)", "prorag-oracle", "grpo"),
            ("HiPRAG vs GRPO", "hiprag", "grpo"),
            ("CP-Search vs GRPO", "cpsearch", "grpo"),
            ("P2S vs GRPO", "p2s", "grpo"),
            ("offline DPO on step pairs vs GRPO", "dpo", "grpo"),
        ],
    ),
    *_pairs(
        STEP_REWARDS,
        WIDE,
        {"last": data.WIDE_PROCESS},
        [
            ("learned PRM vs GRPO", "prorag", "grpo"),
            ("oracle, every step, vs GRPO", "prorag-oracle", "grpo"),
            ("oracle, first error, vs GRPO", OFE, "grpo"),
            ("PRM's shuffled control vs GRPO", "prorag-shuffled", "grpo"),
            ("learned PRM vs its shuffled control", "prorag", "prorag-shuffled"),
        ],
    ),
    *_pairs(
        STEP_REWARDS,
        B1,
        {"last": data.B1_PROCESS},
        [
            ("learned PRM vs GRPO", "prorag", "grpo"),
            ("oracle, every step, vs GRPO", "prorag-oracle", "grpo"),
            ("PRM's shuffled control vs GRPO", "prorag-shuffled", "grpo"),
            ("learned PRM vs its shuffled control", "prorag", "prorag-shuffled"),
        ],
    ),
    *_pairs(STEP_REWARDS, B1, {"last": data.B1_OFE}, [("oracle, first error, vs GRPO", OFE, "grpo")]),
    *_pairs(
        STEP_REWARDS,
        B2,
        {"last": data.B2_PROCESS, "dev": data.B2_DEV},
        [
            ("oracle, first error, vs GRPO", "oracle_first_error", "grpo"),
            ("oracle's shuffled control vs GRPO", "oracle_first_error_shuffled", "grpo"),
            ("oracle, first error, vs its shuffled control", "oracle_first_error", "oracle_first_error_shuffled"),
            ("learned PRM vs GRPO", "prm", "grpo"),
            ("PRM's shuffled control vs GRPO", "prm_shuffled", "grpo"),
            ("learned PRM vs its shuffled control", "prm", "prm_shuffled"),
            ("learned PRM vs the oracle, first error", "prm", "oracle_first_error"),
            ("learned PRM vs the oracle's shuffled control", "prm", "oracle_first_error_shuffled"),
            ("oracle, first error, vs GRPO with a KL penalty", "oracle_first_error", "grpo_kl0.1"),
            ("learned PRM vs GRPO with a KL penalty", "prm", "grpo_kl0.1"),
            ("PRM's shuffled control vs GRPO with a KL penalty", "prm_shuffled", "grpo_kl0.1"),
            ("oracle, first error, with a KL penalty vs GRPO with the same KL", "oracle_first_error_kl0.1", "grpo_kl0.1"),
            ("oracle, first error, vs GRPO at half the learning rate", "oracle_first_error", "grpo_lr1e-4"),
        ],
    ),
    *_pairs(
        STEP_REWARDS,
        B3,
        _both(data.B3_PRM),
        [
            ("oracle, first error, vs GRPO", "ofe", "w12"),
            ("oracle's shuffled control vs GRPO", "ofesh", "w12"),
            ("oracle, first error, vs its shuffled control", "ofe", "ofesh"),
            ("learned PRM vs GRPO", "prm", "w12"),
            ("PRM's shuffled control vs GRPO", "prmsh", "w12"),
            ("learned PRM vs its shuffled control", "prm", "prmsh"),
            ("learned PRM vs the oracle, first error", "prm", "ofe"),
        ],
    ),
    *_pairs(
        STEP_REWARDS,
        B3,
        _both(data.B3_OFEK),
        [
            ("oracle, first error, standardised by step kind, vs GRPO", "ofek", "w12"),
            ("oracle, first error, by step kind vs per group", "ofek", "ofe"),
        ],
    ),
    *_pairs(
        STEP_REWARDS,
        B4,
        _both(data.B4_UNSCREENED),
        [
            ("oracle, first error, vs GRPO", "nofe", "ngrpo"),
            ("oracle's shuffled control vs GRPO", "nofesh", "ngrpo"),
            ("oracle, first error, vs its shuffled control", "nofe", "nofesh"),
            ("oracle on silent groups only vs GRPO", "nofesil", "ngrpo"),
            ("its shuffled control vs GRPO (silent groups)", "nofesilsh", "ngrpo"),
            ("oracle on silent groups only vs its shuffled control", "nofesil", "nofesilsh"),
            ("oracle on silent groups only vs on every group", "nofesil", "nofe"),
            ("silent-groups control vs every-group control", "nofesilsh", "nofesh"),
            ("oracle on informative groups only vs GRPO", "nofeinf", "ngrpo"),
            ("its shuffled control vs GRPO (informative groups)", "nofeinfsh", "ngrpo"),
            ("oracle on informative groups only vs its shuffled control", "nofeinf", "nofeinfsh"),
            ("oracle on informative groups only vs on every group", "nofeinf", "nofe"),
        ],
    ),
    *_pairs(
        STEP_REWARDS,
        B5,
        _both(data.B5_RUNS),
        [
            ("oracle, first error, sign-preserving, vs GRPO", "nofesgn", "ngrpo"),
            ("its shuffled control vs GRPO (oracle, sign-preserving)", "nofesgnsh", "ngrpo"),
            ("oracle, first error, sign-preserving, vs its shuffled control", "nofesgn", "nofesgnsh"),
            ("learned PRM, sign-preserving, vs GRPO", "prmsgn", "ngrpo"),
            ("its shuffled control vs GRPO (PRM, sign-preserving)", "prmsgnsh", "ngrpo"),
            ("learned PRM, sign-preserving, vs its shuffled control", "prmsgn", "prmsgnsh"),
            ("learned PRM to its first error vs GRPO", "prmfesgn", "ngrpo"),
            ("its shuffled control vs GRPO (PRM to its first error)", "prmfesgnsh", "ngrpo"),
            ("learned PRM to its first error vs its shuffled control", "prmfesgn", "prmfesgnsh"),
            ("learned PRM to its first error vs on every step", "prmfesgn", "prmsgn"),
            ("oracle, first error, vs learned PRM to its first error", "nofesgn", "prmfesgn"),
            ("oracle, first error, vs learned PRM on every step", "nofesgn", "prmsgn"),
        ],
    ),
    *_pairs(
        STEP_REWARDS,
        B7,
        _both(data.B7_RUNS),
        [("learned PRM to its first error vs its shuffled control", "prmfesgn", "prmfesgnsh")],
    ),
    *_pairs(
        STEP_REWARDS,
        B8,
        _both(data.B8_RUNS),
        [
            ("learned PRM to its first error vs its shuffled control", "prmfesgn", "prmfesgnsh"),
            ("oracle, first error, sign-preserving, vs GRPO", "nofesgn", "ngrpo"),
            ("oracle, first error, vs the PRM's shuffled control", "nofesgn", "prmfesgnsh"),
            ("oracle, first error, vs learned PRM to its first error", "nofesgn", "prmfesgn"),
        ],
    ),
    *_pairs(
        STEP_REWARDS,
        B8,
        _both(data.B8_PTX),
        [("oracle, first error, with SFT replay vs outcome RL with SFT replay", "nofesgnptx", "ngrpoptx")],
    ),
    *_pairs(
        STEP_REWARDS,
        B9,
        _both(data.B9_PTX),
        [("oracle, first error, with SFT replay vs outcome RL with SFT replay (96 steps)", "nofesgnptx2", "ngrpoptx2")],
    ),
]

_RL_OUTCOMES = (("em", "last", "seeds"), ("em", "dev", "seeds"), ("non_yes_no_em", "last", "seeds"))


def _rl(study: str, files: dict[str, str], label: str, arm: str, ref: str, outcomes=_RL_OUTCOMES) -> Pair:
    return Pair(OUTCOME_RL, study, label, arm, ref, files, tuple(outcomes))


OUTCOME_RL_PAIRS: list[Pair] = [
    _rl(B1, {"last": B1_GRPO}, "GRPO vs pi_rft", "grpo", "pi_rft"),
    _rl(B2, {"last": B2_KL, "dev": data.B2_DEV}, "GRPO vs pi_rft", "grpo", "pi_rft"),
    _rl(B2, {"last": B2_KL, "dev": data.B2_DEV}, "GRPO with a KL penalty vs pi_rft", "grpo_kl0.1", "pi_rft"),
    _rl(B2, {"last": B2_KL, "dev": data.B2_DEV}, "GRPO with a KL penalty vs without", "grpo_kl0.1", "grpo"),
    _rl(B2, {"last": data.B2_PROCESS, "dev": data.B2_DEV}, "GRPO at half the learning rate vs GRPO", "grpo_lr1e-4", "grpo"),
    _rl(B2, {"dev": data.B2_DEV}, "GRPO at half the learning rate, step 12, vs pi_rft", "grpo_lr1e-4_step12", "pi_rft"),
    _rl(B3, _both(data.B3_PRM), "GRPO vs pi_rft", "w12", "pi_rft"),
    _rl(B3, _both(B3_WORLDS), "GRPO on fresh worlds vs on the RL share of the worlds", "fresh", "w12"),
    _rl(B4, _both(data.B4_UNSCREENED), "GRPO vs pi_rft (screened questions)", "w12", "pi_rft"),
    _rl(B4, _both(data.B4_UNSCREENED), "GRPO vs pi_rft (unscreened questions)", "ngrpo", "pi_rft"),
    _rl(B5, _both(data.B5_RUNS), "GRPO vs pi_rft", "ngrpo", "pi_rft"),
    _rl(
        B5,
        _both(data.B5_RUNS),
        "GRPO with the batch's std vs each group's",
        "ngrpob",
        "ngrpo",
        [*_RL_OUTCOMES, ("em", "last", "questions")],
    ),
    _rl(B8, _both(data.B8_RUNS), "GRPO vs pi_rft", "ngrpo", "pi_rft"),
    _rl(B8, _both(data.B8_RUNS), "GRPO at half the learning rate vs pi_rft", "ngrpolr1", "pi_rft"),
    _rl(
        B8,
        _both(B8_PTX_ONLY),
        "outcome RL with SFT replay vs without",
        "ngrpoptx",
        "ngrpo",
        [*_RL_OUTCOMES, ("em", "last", "questions")],
    ),
    _rl(B8, _both(B8_PTX_ONLY), "the replay alone vs outcome RL", "ptxonly", "ngrpo"),
    _rl(
        B8,
        _both(B8_PTX_ONLY),
        "outcome RL with SFT replay vs the replay alone",
        "ngrpoptx",
        "ptxonly",
        [*_RL_OUTCOMES, ("em", "last", "questions")],
    ),
    _rl(B8, _both(B8_PTX_ONLY), "outcome RL with SFT replay vs pi_rft", "ngrpoptx", "pi_rft"),
    _rl(B8, _both(B8_PTX_ONLY), "the replay alone vs pi_rft", "ptxonly", "pi_rft"),
    _rl(B9, _both(B9_FIVE), "outcome RL with SFT replay vs pi_rft (96 steps)", "ngrpoptx2", "pi_rft"),
    _rl(B9, _both(B9_FIVE), "the replay alone vs pi_rft (96 steps)", "ptxonly2", "pi_rft"),
    _rl(
        B9,
        _both(B9_FIVE),
        "outcome RL with SFT replay vs the replay alone (96 steps)",
        "ngrpoptx2",
        "ptxonly2",
        [*_RL_OUTCOMES, ("em", "last", "questions")],
    ),
]

#: Contrasts the committed files cannot recompute, as the LOG reports them: (family, study, label,
#: metric, step, test, seeds or questions, mean in points, p, where in the LOG).
LOG_ONLY: list[tuple[str, str, str, str, str, str, int, float, float, str]] = [
    (STEP_REWARDS, B1, "learned PRM vs GRPO", "valid_search", "last", "seeds", 5, 0.7, 0.56, "2026-11-24"),
    (STEP_REWARDS, B1, "learned PRM vs GRPO", "valid_subanswer", "last", "seeds", 5, 2.4, 0.14, "2026-11-24"),
    (STEP_REWARDS, B1, "oracle, every step, vs GRPO", "valid_search", "last", "seeds", 5, 2.2, 0.07, "2026-11-24"),
    (STEP_REWARDS, B1, "oracle, every step, vs GRPO", "valid_subanswer", "last", "seeds", 5, 1.3, 0.20, "2026-11-24"),
    (STEP_REWARDS, B1, "PRM's shuffled control vs GRPO", "valid_search", "last", "seeds", 5, 0.2, 0.83, "2026-11-24"),
    (STEP_REWARDS, B1, "PRM's shuffled control vs GRPO", "valid_subanswer", "last", "seeds", 5, 1.1, 0.48, "2026-11-24"),
    (STEP_REWARDS, B1, "oracle, first error, vs oracle, every step", "em", "last", "seeds", 5, 1.45, 0.15, "2026-11-25"),
    (OUTCOME_RL, TINY, "GRPO vs pi_rft", "em", "last", "questions", 400, -2.1, 0.073, "2026-11-23"),
    (OUTCOME_RL, WIDE, "GRPO vs pi_rft", "em", "last", "seeds", 5, -1.4, 0.04, "2026-11-24"),
    (OUTCOME_RL, WIDE, "GRPO vs pi_rft", "em", "last", "questions", 400, -1.4, 0.056, "2026-11-24"),
    (
        OUTCOME_RL,
        B1,
        "GRPO with grouped scoring vs one forward (runs unpaired)",
        "em",
        "last",
        "seeds",
        5,
        -2.6,
        0.024,
        "2026-11-25",
    ),
]

#: Predictions the LOG committed before the runs they are about: (study, arm, reference, metric, step) ->
#: (what was predicted, whether it held). No study named one primary contrast in advance; the closest is the
#: replication of builds 6-8, which named one contrast and its range before any number of those builds.
PREDICTED: dict[tuple[str, str, str, str, str], tuple[str, str]] = {
    (B5, "nofesgn", "ngrpo", "em", "last"): ("+1.5 to +3", "above the range"),
    (B5, "nofesgnsh", "ngrpo", "em", "last"): ("within 1 EM", "held"),
    (B5, "nofesgn", "nofesgnsh", "em", "last"): ("+1.5 to +2.5, p < 0.1", "above the range"),
    (B5, "prmsgn", "prmsgnsh", "em", "last"): ("-1 to +1.5, p > 0.1", "held at seven seeds"),
    (B5, "prmsgn", "ngrpo", "em", "last"): ("-1.5 to +2", "failed"),
    (B5, "prmfesgn", "prmfesgnsh", "em", "last"): ("+1.5 to +3.5", "above the range"),
    (B5, "prmfesgn", "prmsgn", "em", "last"): ("+1 or more", "failed"),
    (B7, "prmfesgn", "prmfesgnsh", "em", "last"): ("+1.5 to +5 (replication)", "held"),
    (B7, "prmfesgn", "prmfesgnsh", "dev_em", "last"): ("positive (replication)", "held"),
    (B8, "prmfesgn", "prmfesgnsh", "em", "last"): ("+1.5 to +5 (replication)", "failed"),
    (B8, "prmfesgn", "prmfesgnsh", "dev_em", "last"): ("positive (replication)", "failed"),
    (B8, "nofesgn", "prmfesgn", "dev_em", "last"): ("+2 or more", "failed"),
    (B8, "nofesgnptx", "ngrpoptx", "em", "last"): ("-2.5 to +1.5", "held"),
    (B9, "nofesgnptx2", "ngrpoptx2", "em", "last"): ("-2 to +2", "held"),
    (B9, "nofesgnptx2", "ngrpoptx2", "valid_subanswer", "last"): ("above 0 in both seeds", "failed"),
    (B5, "ngrpo", "pi_rft", "em", "last"): ("a gain", "failed"),
    (B5, "ngrpob", "ngrpo", "em", "last"): ("+1.5 to +4, p < 0.1", "held"),
    (B8, "ngrpoptx", "ptxonly", "em", "last"): ("-1.5 to +1.5", "held"),
    (B9, "ngrpoptx2", "pi_rft", "em", "last"): ("p < 0.01", "held"),
    (B9, "ptxonly2", "pi_rft", "em", "last"): ("p < 0.01", "held"),
    (B9, "ngrpoptx2", "ptxonly2", "em", "last"): ("-1 to +3, not significant", "held"),
}


@cache
def load(file: str) -> dict[str, Any]:
    """A committed results file, read once."""
    return json.loads((ROOT / "results" / file).read_text())


def _step_key(node: dict[str, Any], step: str) -> dict[str, Any]:
    return node["test_last" if step == "last" else "test_best"]


def _hops(test: dict[str, Any]) -> dict[str, Any] | None:
    return test.get("by_hops") or test.get("em_by_hops")


def _runs_metric(file: str, step: str, arm: str, metric: str) -> dict[int, float] | None:
    runs = load(file)["runs"].get(arm)
    if runs is None:
        return None
    out: dict[int, float] = {}
    for seed, node in runs.items():
        if metric == "dev_em":
            if step != "last":
                return None
            curve = node["dev_em_by_step"]
            out[int(seed)] = curve[max(curve, key=int)]
            continue
        test = _step_key(node, step)
        if metric in ("em", "non_yes_no_em"):
            value = test.get(metric)
        elif metric.startswith("hop"):
            hops = _hops(test)
            value = hops[metric[3:]]["em"] if hops and metric[3:] in hops else None
        else:
            value = test.get(f"{metric}_rate")
        if value is None:
            return None
        out[int(seed)] = value
    return out


def _validity(file: str, step: str, arm: str, metric: str) -> dict[int, float] | None:
    """Valid-step rates where the runs' tests do not hold them: in the file's ``step_validity`` counts
    (the last step), or in the separate file a study judged its evaluations in."""
    if file in VALIDITY_FILE:
        rates = load(VALIDITY_FILE[file])["arms"]["last" if step == "last" else "best"].get(arm)
        return None if rates is None else {int(s): row[metric] / 100 for s, row in rates.items()}
    counts = load(file).get("step_validity", {}).get("arms", {}).get(arm)
    if counts is None or step != "last":
        return None
    valid, total = data.VALIDITY_METRICS[metric]
    return {int(s): row[valid] / row[total] for s, row in counts.items()}


def seed_values(file: str, step: str, arm: str, metric: str) -> dict[int, float] | None:
    """One arm's per-seed value of ``metric`` (a fraction) at ``step`` in ``file``, or None where the file
    does not hold it."""
    schema, d = SCHEMA[file], load(file)
    if schema == "runs":
        values = _runs_metric(file, step, arm, metric)
        if values is None and metric.startswith("valid"):
            values = _validity(file, step, arm, metric)
        return values
    if schema == "ablate":
        if step != "last" or arm not in d["stats"]:
            return None
        seeds = d["stats"][arm]["per_seed"]
        if any(metric not in row for row in seeds.values()):
            return None
        return {int(s): row[metric] for s, row in seeds.items()}
    if schema == "rebuild":
        arms = d["arms"]
        if step != "last" or arm not in arms:
            return None
        key = {"valid_search": "valid_searches", "valid_subanswer": "valid_sub_answers"}.get(metric, metric)
        rows = arms[arm]["seeds"]
        if metric == "dev_em":
            return {int(s): row["dev_em"][-1][1] for s, row in rows.items()}
        if any(key not in row for row in rows.values()):
            return None
        return {int(s): row[key] for s, row in rows.items()}
    if schema == "early_stopping":
        if step != "dev" or arm not in d["arms"] or metric not in ("em", "non_yes_no_em"):
            return None
        key = "test_em" if metric == "em" else metric
        return {int(s): row[key] / 100 for s, row in d["arms"][arm]["seeds"].items()}
    if schema == "step_kind":
        rows = d["arms"]["last" if step == "last" else "best"].get(arm)
        if rows is None or metric not in ("em", "valid_search", "valid_subanswer"):
            return None
        return {int(s): row[metric] / 100 for s, row in rows.items()}
    if schema == "small_rl":
        if step != "last" or metric != "em":
            return None
        return {int(s): row["test_em"] for s, row in d["arms"][arm]["seeds"].items()}
    raise ValueError(f"no reader for schema {schema!r}")


def pi_rft_value(file: str, metric: str) -> float | None:
    """pi_rft's score on the test questions, the fixed reference of outcome RL's contrasts."""
    d = load(file)
    if "pi_rft" in d and isinstance(d["pi_rft"], dict):
        return d["pi_rft"].get(metric)
    if "build" in d:
        return d["build"]["pi_rft_test"].get(metric)
    if "pi_rft_test_em" in d:
        return d["pi_rft_test_em"] / 100 if metric == "em" else None
    if "initial_policy" in d:
        return d["initial_policy"]["test_em"] if metric == "em" else None
    return None


def _question_em(file: str, step: str, arm: str) -> dict[int, str] | None:
    if SCHEMA[file] != "runs" or arm not in load(file)["runs"]:
        return None
    out = {}
    for seed, node in load(file)["runs"][arm].items():
        text = _step_key(node, step).get("em_by_question")
        if text is None:
            return None
        out[int(seed)] = text
    return out


def question_test(pair: Pair, step: str) -> tuple[float, float, int, str] | None:
    """Arm minus reference on the test questions' seed-averaged EM (a fraction), its p, the number of
    questions and how it was had: ``recomputed`` from each question's EM kept in the file, or ``stored``
    (the p the study's collector wrote). None where the file holds neither."""
    file = pair.files.get(step)
    if file is None or pair.reference == "pi_rft":
        return None
    arm_q, ref_q = _question_em(file, step, pair.arm), _question_em(file, step, pair.reference)
    if arm_q and ref_q:
        seeds = sorted(set(arm_q) & set(ref_q))
        if len(seeds) >= 1:
            n = len(arm_q[seeds[0]])
            a = [sum(int(arm_q[s][i]) for s in seeds) / len(seeds) for i in range(n)]
            b = [sum(int(ref_q[s][i]) for s in seeds) / len(seeds) for i in range(n)]
            test = paired_t_test(a, b)
            return test.mean_diff, test.p_value, n, "recomputed"
    d, schema = load(file), SCHEMA[file]
    if schema == "ablate" and step == "last" and pair.reference == "grpo" and "vs_grpo" in d["stats"].get(pair.arm, {}):
        t = d["stats"][pair.arm]["vs_grpo"]
        return t["mean_diff"], t["p_value"], t["n"], "stored"
    tests = d.get("tests", {})
    if schema == "rebuild" and step == "last":
        t = tests.get(f"{pair.arm}_vs_{pair.reference}", {})
        if "p_per_question_seed_averaged" in t:
            return t["mean_ci95"][0] / 100, t["p_per_question_seed_averaged"], 400, "stored"
    t = tests.get(f"{pair.arm}_minus_{pair.reference}_{'last' if step == 'last' else 'best'}_per_question")
    if t is not None:
        return t["mean_diff"], t["p"], t["n"], "stored"
    return None


def seeds_test(pair: Pair, metric: str, step: str) -> tuple[float, float, int] | None:
    """Arm minus reference over seeds (a fraction): the mean paired difference, its paired t p and the
    number of seeds both hold (a one-sample t against pi_rft's fixed score where that is the reference).
    None where the file lacks the metric or fewer than two seeds pair. Differences that are all equal (two
    seeds that both gained +1.10, or every run stopped at pi_rft) have no spread and so no test: p is NaN,
    which Holm leaves out of the family, where ``paired_t_test``'s limit (p 0 or 1) would count as one."""
    file = pair.files.get(step)
    if file is None:
        return None
    arm = seed_values(file, step, pair.arm, metric)
    if arm is None:
        return None
    if pair.reference == "pi_rft":
        constant = pi_rft_value(file, metric)
        if constant is None:
            return None
        ref = {s: constant for s in arm}
    else:
        ref = seed_values(file, step, pair.reference, metric)
        if ref is None:
            return None
    seeds = sorted(set(arm) & set(ref))
    if len(seeds) < 2:
        return None
    test = paired_t_test([arm[s] for s in seeds], [ref[s] for s in seeds])
    diffs = [arm[s] - ref[s] for s in seeds]
    return test.mean_diff, (test.p_value if max(diffs) - min(diffs) > 1e-12 else math.nan), len(seeds)


def _row(pair: Pair, metric: str, step: str, test: str, mean: float, p: float, n: int, source: str) -> dict[str, Any]:
    predicted = PREDICTED.get((pair.study, pair.arm, pair.reference, metric, step)) if test == "seeds" else None
    return {
        "family": pair.family,
        "study": pair.study,
        "contrast": pair.label,
        "arm": pair.arm,
        "reference": pair.reference,
        "metric": metric,
        "step": step,
        "test": test,
        "n": n,
        "mean": round(100 * mean, 3),
        "p": p,
        "source": source,
        "predicted": None if predicted is None else {"range": predicted[0], "outcome": predicted[1]},
    }


def tested_contrasts() -> list[dict[str, Any]]:
    """Every pair's outcomes that the committed files hold, then the LOG-only ones; each row with its
    family, study, contrast, metric, step, test (``seeds`` or ``questions``), n, mean in points, nominal p
    and source (``results/FILE`` or ``LOG YYYY-MM-DD``)."""
    rows = []
    for pair in STEP_REWARD_PAIRS + OUTCOME_RL_PAIRS:
        for metric, step, test in pair.outcomes or OUTCOMES:
            if test == "questions":
                found = question_test(pair, step)
                if found is not None:
                    mean, p, n, how = found
                    rows.append(_row(pair, metric, step, test, mean, p, n, f"results/{pair.files[step]} ({how})"))
                continue
            result = seeds_test(pair, metric, step)
            if result is not None:
                mean, p, n = result
                rows.append(_row(pair, metric, step, test, mean, p, n, f"results/{pair.files[step]}"))
    for family, study, label, metric, step, test, n, mean, p, date in LOG_ONLY:
        rows.append(
            {
                "family": family,
                "study": study,
                "contrast": label,
                "arm": None,
                "reference": None,
                "metric": metric,
                "step": step,
                "test": test,
                "n": n,
                "mean": mean,
                "p": p,
                "source": f"LOG {date}",
                "predicted": None,
            }
        )
    return rows
