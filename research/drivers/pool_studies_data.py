"""Per-seed test EM of paired arms in each process ablation, read from the committed results files.

A study is one pi_rft and its RL arms; a cell is one contrast in one study (a step-reward arm against
outcome-only GRPO or against its own shuffled control) at the last RL step (``last``) or at the
dev-chosen step (``dev``). :func:`study_seed_ems` returns one record per cell, with test EM as fractions
and only the seeds both arms hold, in one order:

    {"contrast", "metric": "em", "study", "source", "arm", "reference", "step", "seeds", "arm_values", "reference_values"}

:func:`study_seed_validity` does the same for the oracle's verdicts on the test steps. Each cell carries
the mean the LOG (and the README up to 3bcb8f8) quoted, so that ``--check`` catches a file or key path
that reads another arm. Pure standard library.

    python3 research/drivers/pool_studies_data.py [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Where each file schema keeps one arm's per-seed test EM, per step: a key path in which "{arm}"
# is the arm's key and "{seed}" the level whose keys are the seeds, and the divisor that turns
# the stored value into a fraction.
SCHEMAS: dict[str, dict[str, tuple[tuple[str, ...], float]]] = {
    # `prorag ablate` output (process_*.json of 11-23/24/25, family)
    "ablate": {"last": (("stats", "{arm}", "per_seed", "{seed}", "em"), 1.0)},
    # process_rebuild_small_2026-11-26.json: the step-48 runs of build 2
    "rebuild": {"last": (("arms", "{arm}", "seeds", "{seed}", "em"), 1.0)},
    # early_stopping_small_2026-11-26.json: build 2's runs at their dev-best step, percent
    "early_stopping": {"dev": (("arms", "{arm}", "seeds", "{seed}", "test_em"), 100.0)},
    # process_*_third_rft and rl_unscreened: each run tested at step 48 and at its dev-best step
    "runs": {
        "last": (("runs", "{arm}", "{seed}", "test_last", "em"), 1.0),
        "dev": (("runs", "{arm}", "{seed}", "test_best", "em"), 1.0),
    },
    # process_norm_step_kind_2026-11-27.json, percent
    "step_kind": {
        "last": (("arms", "last", "{arm}", "{seed}", "em"), 100.0),
        "dev": (("arms", "best", "{arm}", "{seed}", "em"), 100.0),
    },
}

OFE_GRPO = "oracle-first-error vs grpo"
PRM_GRPO = "learned prm vs grpo"
ORACLE_GRPO = "oracle every step vs grpo"
PRM_SHUF = "learned prm vs its shuffled control"
OFE_SHUF = "oracle-first-error vs its shuffled control"
OFEK_GRPO = "oracle-first-error by step kind vs grpo"
# The bare extra term in the advantage: a source's step rewards shuffled within groups, against GRPO.
PRM_SHUF_GRPO = "learned prm shuffled vs grpo"
OFE_SHUF_GRPO = "oracle-first-error shuffled vs grpo"
# The learned PRM up to the first step it scores below 0 (`prm-first-error`, advantage dual_signed).
PRMFE_SHUF = "learned prm to its first error vs its shuffled control"
PRMFE_GRPO = "learned prm to its first error vs grpo"
PRMFE_SHUF_GRPO = "learned prm to its first error shuffled vs grpo"
# The step term held on the outcome's side of 0 (`advantage: dual_signed`).
OFE_SGN_GRPO = "oracle-first-error signed vs grpo"
OFE_SGN_SHUF = "oracle-first-error signed vs its shuffled control"
OFE_SGN_SHUF_GRPO = "oracle-first-error signed shuffled vs grpo"
PRM_SGN_GRPO = "learned prm signed vs grpo"
PRM_SGN_SHUF = "learned prm signed vs its shuffled control"
PRM_SGN_SHUF_GRPO = "learned prm signed shuffled vs grpo"
# The same signed oracle arm with the warm-up's SFT loss replayed in RL, against outcome RL with the same replay.
OFE_SGN_PTX = "oracle-first-error signed with sft replay vs outcome rl with sft replay"
# The step term only on the groups whose outcomes all agree (`dual_silent`) or disagree (`dual_informative`).
OFE_SIL_GRPO = "oracle-first-error on silent groups vs grpo"
OFE_SIL_SHUF = "oracle-first-error on silent groups vs its shuffled control"
OFE_SIL_SHUF_GRPO = "oracle-first-error on silent groups shuffled vs grpo"
OFE_INF_GRPO = "oracle-first-error on informative groups vs grpo"
OFE_INF_SHUF = "oracle-first-error on informative groups vs its shuffled control"
OFE_INF_SHUF_GRPO = "oracle-first-error on informative groups shuffled vs grpo"
# The other methods' process rewards on the one trainer (the tiny model's family study).
HIPRAG_GRPO = "hiprag vs grpo"
CPSEARCH_GRPO = "cp-search vs grpo"
P2S_GRPO = "p2s vs grpo"

TINY = "tiny model, demo world"
WIDE = "tiny, wide world"
B1, B2, B3, B4 = "small, build 1", "small, build 2", "small, build 3", "small, build 4"
B5, B7, B8, B9 = "small, build 5", "small, build 7", "small, build 8", "small, build 9"

# The result files (under results/) and their schemas.
TINY_PROCESS = "process_2026-11-23.json"
TINY_OFE = "process_oracle_first_error_2026-11-24.json"  # beside family_2026-11-24.json, the same GRPO runs
TINY_FAMILY = "family_2026-11-24.json"
WIDE_PROCESS = "process_wide_2026-11-24.json"
B1_PROCESS = "process_small_2026-11-24.json"
B1_OFE = "process_small_oracle_first_error_2026-11-25.json"  # GRPO re-run beside it: process_small's per-seed EM
B2_PROCESS = "process_rebuild_small_2026-11-26.json"
B2_DEV = "early_stopping_small_2026-11-26.json"
B3_OFE = "process_ofe_third_rft_2026-11-26.json"
B3_PRM = "process_prm_third_rft_2026-11-27.json"  # repeats B3_OFE's w12/ofe/ofesh runs unchanged
B3_OFEK = "process_norm_step_kind_2026-11-27.json"
B4_UNSCREENED = "rl_unscreened_2026-11-27.json"
B5_RUNS = "rl_build5_2026-11-27.json"
B7_RUNS = "rl_build7_2026-11-28.json"  # written by rl_seed_runs.py's predecessor; the same runs schema
B8_RUNS = "rl_build8_2026-11-28.json"  # research/drivers/rl_seed_runs.py
B8_PTX = "rl_oracle_ptx_build8_2026-11-29.json"  # the same schema; arms with the SFT replay
B9_PTX = "rl_oracle_two_pass_build9_2026-11-29.json"  # the same schema; two passes (96 steps) with the SFT replay

FILE_SCHEMA: dict[str, str] = {
    TINY_PROCESS: "ablate",
    TINY_OFE: "ablate",
    TINY_FAMILY: "ablate",
    WIDE_PROCESS: "ablate",
    B1_PROCESS: "ablate",
    B1_OFE: "ablate",
    B2_PROCESS: "rebuild",
    B2_DEV: "early_stopping",
    B3_OFE: "runs",
    B3_PRM: "runs",
    B3_OFEK: "step_kind",
    B4_UNSCREENED: "runs",
    B5_RUNS: "runs",
    B7_RUNS: "runs",
    B8_RUNS: "runs",
    B8_PTX: "runs",
    B9_PTX: "runs",
}

OFE = "prorag-oracle-first-error"  # the arm's name in `prorag ablate` output

# One row per cell: (contrast, study, step, file, arm key, reference key, the mean paired difference in
# EM points that the LOG (or the README up to 3bcb8f8) quotes, or None where neither quotes one).
CELLS: list[tuple[str, str, str, str, str, str, float | None]] = [
    # tiny model, demo world: the process ablation of 11-23; the oracle up to the first error
    # against GRPO re-run beside the family (the README's starred cell)
    (PRM_GRPO, TINY, "last", TINY_PROCESS, "prorag", "grpo", 1.2),
    (ORACLE_GRPO, TINY, "last", TINY_PROCESS, "prorag-oracle", "grpo", -2.2),
    (PRM_SHUF, TINY, "last", TINY_PROCESS, "prorag", "prorag-shuffled", 1.3),
    (OFE_GRPO, TINY, "last", TINY_OFE, OFE, "grpo", 1.8),
    # tiny, wide world
    (PRM_GRPO, WIDE, "last", WIDE_PROCESS, "prorag", "grpo", 1.4),
    (ORACLE_GRPO, WIDE, "last", WIDE_PROCESS, "prorag-oracle", "grpo", 0.5),
    (OFE_GRPO, WIDE, "last", WIDE_PROCESS, OFE, "grpo", 0.8),
    (PRM_SHUF, WIDE, "last", WIDE_PROCESS, "prorag", "prorag-shuffled", 0.2),
    # small, build 1
    (PRM_GRPO, B1, "last", B1_PROCESS, "prorag", "grpo", -0.1),
    (ORACLE_GRPO, B1, "last", B1_PROCESS, "prorag-oracle", "grpo", -1.0),
    (PRM_SHUF, B1, "last", B1_PROCESS, "prorag", "prorag-shuffled", 0.5),
    (OFE_GRPO, B1, "last", B1_OFE, OFE, "grpo", 0.4),
    # small, build 2: step 48 in process_rebuild, the dev-best step in early_stopping (same runs)
    (OFE_GRPO, B2, "last", B2_PROCESS, "oracle_first_error", "grpo", 5.25),
    (PRM_GRPO, B2, "last", B2_PROCESS, "prm", "grpo", 4.7),
    (PRM_SHUF, B2, "last", B2_PROCESS, "prm", "prm_shuffled", 2.5),
    (OFE_SHUF, B2, "last", B2_PROCESS, "oracle_first_error", "oracle_first_error_shuffled", 2.15),
    (OFE_GRPO, B2, "dev", B2_DEV, "oracle_first_error", "grpo", 0.9),
    (PRM_GRPO, B2, "dev", B2_DEV, "prm", "grpo", 0.5),
    (PRM_SHUF, B2, "dev", B2_DEV, "prm", "prm_shuffled", 0.0),
    (OFE_SHUF, B2, "dev", B2_DEV, "oracle_first_error", "oracle_first_error_shuffled", 1.0),
    # small, build 3: GRPO is w12 (seeds 0-6)
    (OFE_GRPO, B3, "last", B3_OFE, "ofe", "w12", -1.8),
    (OFE_GRPO, B3, "dev", B3_OFE, "ofe", "w12", -0.7),
    (OFE_SHUF, B3, "last", B3_OFE, "ofe", "ofesh", 0.1),
    (OFE_SHUF, B3, "dev", B3_OFE, "ofe", "ofesh", 0.0),
    (PRM_GRPO, B3, "last", B3_PRM, "prm", "w12", -2.50),
    (PRM_GRPO, B3, "dev", B3_PRM, "prm", "w12", -0.8),
    (PRM_SHUF, B3, "last", B3_PRM, "prm", "prmsh", -1.4),
    (PRM_SHUF, B3, "dev", B3_PRM, "prm", "prmsh", -1.25),
    # ofek has seeds 0-5; the README gives no dev-chosen cell for it
    (OFEK_GRPO, B3, "last", B3_OFEK, "ofek", "w12", -0.9),
    (OFEK_GRPO, B3, "dev", B3_OFEK, "ofek", "w12", None),
    # The shuffled controls against GRPO (the bare term; where the README quotes none, each arm's
    # per-seed EM is checked in the rows above)
    (PRM_SHUF_GRPO, TINY, "last", TINY_PROCESS, "prorag-shuffled", "grpo", None),
    (PRM_SHUF_GRPO, WIDE, "last", WIDE_PROCESS, "prorag-shuffled", "grpo", None),
    (PRM_SHUF_GRPO, B1, "last", B1_PROCESS, "prorag-shuffled", "grpo", None),
    (PRM_SHUF_GRPO, B2, "last", B2_PROCESS, "prm_shuffled", "grpo", None),
    (PRM_SHUF_GRPO, B3, "last", B3_PRM, "prmsh", "w12", -1.1),  # README: "their shuffled controls cost 1.1 and 1.9"
    (OFE_SHUF_GRPO, B2, "last", B2_PROCESS, "oracle_first_error_shuffled", "grpo", None),
    (OFE_SHUF_GRPO, B3, "last", B3_OFE, "ofesh", "w12", -1.9),
    # the same at the dev-chosen step (LOG 2026-11-26 evening, 2026-11-26 late night, 2026-11-27)
    (PRM_SHUF_GRPO, B2, "dev", B2_DEV, "prm_shuffled", "grpo", 0.5),
    (PRM_SHUF_GRPO, B3, "dev", B3_PRM, "prmsh", "w12", 0.46),
    (OFE_SHUF_GRPO, B2, "dev", B2_DEV, "oracle_first_error_shuffled", "grpo", -0.1),
    (OFE_SHUF_GRPO, B3, "dev", B3_OFE, "ofesh", "w12", -0.68),
    # small, build 4: unscreened RL questions; GRPO is ngrpo (the file's w12 is screened GRPO)
    (OFE_GRPO, B4, "last", B4_UNSCREENED, "nofe", "ngrpo", 0.36),
    (OFE_GRPO, B4, "dev", B4_UNSCREENED, "nofe", "ngrpo", -0.54),
    (OFE_SHUF, B4, "last", B4_UNSCREENED, "nofe", "nofesh", 2.89),
    (OFE_SHUF, B4, "dev", B4_UNSCREENED, "nofe", "nofesh", -0.86),
    (OFE_SHUF_GRPO, B4, "last", B4_UNSCREENED, "nofesh", "ngrpo", -2.54),
    (OFE_SHUF_GRPO, B4, "dev", B4_UNSCREENED, "nofesh", "ngrpo", 0.32),
    # the learned PRM to its first error (builds 5, 7 and 8; unscreened, dual_signed; GRPO only on build 5);
    # the dev-chosen cells are the LOG's (the README gives the last step's)
    (PRMFE_GRPO, B5, "last", B5_RUNS, "prmfesgn", "ngrpo", 3.61),
    (PRMFE_GRPO, B5, "dev", B5_RUNS, "prmfesgn", "ngrpo", -0.82),
    (PRMFE_SHUF, B5, "last", B5_RUNS, "prmfesgn", "prmfesgnsh", 3.75),
    (PRMFE_SHUF, B5, "dev", B5_RUNS, "prmfesgn", "prmfesgnsh", -0.57),
    (PRMFE_SHUF, B7, "last", B7_RUNS, "prmfesgn", "prmfesgnsh", 2.58),
    (PRMFE_SHUF, B7, "dev", B7_RUNS, "prmfesgn", "prmfesgnsh", -2.25),
    (PRMFE_SHUF, B8, "last", B8_RUNS, "prmfesgn", "prmfesgnsh", -0.70),
    # build 8 at the dev-chosen step: dev chose step 0 (pi_rft itself) in every run of these arms, so the paired
    # differences are all 0 and have no standard error to weigh them by (the pooling leaves such a cell out)
    (PRMFE_SHUF, B8, "dev", B8_RUNS, "prmfesgn", "prmfesgnsh", 0.0),
    (PRMFE_SHUF_GRPO, B5, "last", B5_RUNS, "prmfesgnsh", "ngrpo", -0.14),
    (PRMFE_SHUF_GRPO, B5, "dev", B5_RUNS, "prmfesgnsh", "ngrpo", -0.25),
    # build 5, `advantage: dual_signed`: the oracle up to the first error and the learned PRM on every step
    (OFE_SGN_GRPO, B5, "last", B5_RUNS, "nofesgn", "ngrpo", 3.82),
    (OFE_SGN_GRPO, B5, "dev", B5_RUNS, "nofesgn", "ngrpo", 0.04),
    (OFE_SGN_SHUF, B5, "last", B5_RUNS, "nofesgn", "nofesgnsh", 3.43),
    (OFE_SGN_SHUF, B5, "dev", B5_RUNS, "nofesgn", "nofesgnsh", 0.29),
    (OFE_SGN_SHUF_GRPO, B5, "last", B5_RUNS, "nofesgnsh", "ngrpo", 0.39),
    (OFE_SGN_SHUF_GRPO, B5, "dev", B5_RUNS, "nofesgnsh", "ngrpo", -0.25),
    (PRM_SGN_GRPO, B5, "last", B5_RUNS, "prmsgn", "ngrpo", 3.39),
    (PRM_SGN_GRPO, B5, "dev", B5_RUNS, "prmsgn", "ngrpo", 0.0),
    (PRM_SGN_SHUF, B5, "last", B5_RUNS, "prmsgn", "prmsgnsh", 1.14),
    (PRM_SGN_SHUF, B5, "dev", B5_RUNS, "prmsgn", "prmsgnsh", 0.64),
    (PRM_SGN_SHUF_GRPO, B5, "last", B5_RUNS, "prmsgnsh", "ngrpo", 2.25),
    (PRM_SGN_SHUF_GRPO, B5, "dev", B5_RUNS, "prmsgnsh", "ngrpo", None),
    # build 8: the signed oracle against GRPO (seeds 0-1; dev chose step 0 in all four runs)
    (OFE_SGN_GRPO, B8, "last", B8_RUNS, "nofesgn", "ngrpo", None),
    (OFE_SGN_GRPO, B8, "dev", B8_RUNS, "nofesgn", "ngrpo", 0.0),
    # the signed oracle beside the SFT replay: build 8 one pass (48 steps, seeds 0-2), build 9 two passes (96, seeds 0-1)
    (OFE_SGN_PTX, B8, "last", B8_PTX, "nofesgnptx", "ngrpoptx", -0.50),
    (OFE_SGN_PTX, B8, "dev", B8_PTX, "nofesgnptx", "ngrpoptx", None),
    (OFE_SGN_PTX, B9, "last", B9_PTX, "nofesgnptx2", "ngrpoptx2", 1.00),
    (OFE_SGN_PTX, B9, "dev", B9_PTX, "nofesgnptx2", "ngrpoptx2", -1.25),
    # build 4, unscreened: the oracle's step term on the silent groups only, and on the informative groups only
    (OFE_SIL_GRPO, B4, "last", B4_UNSCREENED, "nofesil", "ngrpo", -0.64),
    (OFE_SIL_GRPO, B4, "dev", B4_UNSCREENED, "nofesil", "ngrpo", None),
    (OFE_SIL_SHUF, B4, "last", B4_UNSCREENED, "nofesil", "nofesilsh", 0.54),
    (OFE_SIL_SHUF, B4, "dev", B4_UNSCREENED, "nofesil", "nofesilsh", None),
    (OFE_SIL_SHUF_GRPO, B4, "last", B4_UNSCREENED, "nofesilsh", "ngrpo", -1.18),
    (OFE_SIL_SHUF_GRPO, B4, "dev", B4_UNSCREENED, "nofesilsh", "ngrpo", None),
    (OFE_INF_GRPO, B4, "last", B4_UNSCREENED, "nofeinf", "ngrpo", 0.79),
    (OFE_INF_GRPO, B4, "dev", B4_UNSCREENED, "nofeinf", "ngrpo", None),
    (OFE_INF_SHUF, B4, "last", B4_UNSCREENED, "nofeinf", "nofeinfsh", 1.57),
    (OFE_INF_SHUF, B4, "dev", B4_UNSCREENED, "nofeinf", "nofeinfsh", None),
    (OFE_INF_SHUF_GRPO, B4, "last", B4_UNSCREENED, "nofeinfsh", "ngrpo", -0.79),
    (OFE_INF_SHUF_GRPO, B4, "dev", B4_UNSCREENED, "nofeinfsh", "ngrpo", None),
    # the tiny model's family study: each method's own process reward against GRPO run beside it
    (HIPRAG_GRPO, TINY, "last", TINY_FAMILY, "hiprag", "grpo", -0.2),
    (CPSEARCH_GRPO, TINY, "last", TINY_FAMILY, "cpsearch", "grpo", 0.5),
    (P2S_GRPO, TINY, "last", TINY_FAMILY, "p2s", "grpo", 1.2),
]

TOLERANCE = 0.06  # points: the rounding of the README's and the LOG's numbers


def per_seed_em(data: dict[str, Any], schema: str, step: str, arm: str) -> dict[int, float]:
    """One arm's test EM (a fraction) per seed at `step`, read along the schema's key path."""
    path, divisor = SCHEMAS[schema][step]
    node: Any = data
    for i, key in enumerate(path):
        if key == "{seed}":
            rest = path[i + 1 :]
            out = {}
            for seed, sub in node.items():
                for k in rest:
                    sub = sub[k]
                out[int(seed)] = sub / divisor
            return out
        node = node[arm if key == "{arm}" else key]
    raise ValueError(f"schema {schema!r} has no seed level")


def study_seed_ems() -> list[dict]:
    """The paired per-seed test EM of every cell in CELLS, in that order."""
    cache: dict[str, dict[str, Any]] = {}
    records = []
    for contrast, study, step, file, arm, reference, _ in CELLS:
        if file not in cache:
            cache[file] = json.loads((ROOT / "results" / file).read_text())
        arm_em = per_seed_em(cache[file], FILE_SCHEMA[file], step, arm)
        ref_em = per_seed_em(cache[file], FILE_SCHEMA[file], step, reference)
        seeds = sorted(set(arm_em) & set(ref_em))
        records.append(
            {
                "contrast": contrast,
                "metric": "em",
                "study": study,
                "source": f"results/{file}",
                "arm": arm,
                "reference": reference,
                "step": step,
                "seeds": seeds,
                "arm_values": [arm_em[s] for s in seeds],
                "reference_values": [ref_em[s] for s in seeds],
            }
        )
    return records


# The oracle's verdicts on the test steps (`prorag.evaluation.step_errors`): valid searches and valid
# sub-answers, in percent of the steps of that kind, per seed; where each study keeps them, and the
# paired means over seeds its LOG entry quotes (searches, sub-answers).
VALIDITY_METRICS = {"valid_search": ("search_valid", "search"), "valid_subanswer": ("conclude_valid", "conclude")}
VALIDITY_CELLS: list[tuple[str, str, str, str, str, tuple[float, float]]] = [
    # study, file, where the rates lie, arm, reference, (valid searches, valid sub-answers) in the LOG
    (B1, B1_OFE, "counts_by_run", OFE, "grpo", (1.0, 1.3)),
    (B3, "step_validity_build3_2026-11-27.json", "rates", "ofe", "w12", (0.5, 0.2)),
    (B4, B4_UNSCREENED, "counts_by_arm", "nofe", "ngrpo", (5.3, 3.0)),
]


def per_seed_validity(data: dict[str, Any], layout: str, arm: str, metric: str) -> dict[int, float]:
    """One arm's valid-step rate (a fraction) per seed at the last step, in one of three layouts:
    ``rates`` (percents per seed), ``counts_by_arm`` (verdict counts per arm and seed) and
    ``counts_by_run`` (verdict counts per ``ARM-seedS`` evaluation)."""
    if layout == "rates":
        return {int(seed): row[metric] / 100 for seed, row in data["arms"]["last"][arm].items()}
    valid, total = VALIDITY_METRICS[metric]
    if layout == "counts_by_arm":
        runs = {int(seed): row for seed, row in data["step_validity"]["arms"][arm].items()}
    else:
        prefix = f"{arm}-seed"
        counts = data["step_validity"]["systems"]["counts"]
        runs = {int(name[len(prefix) :]): row for name, row in counts.items() if name.startswith(prefix)}
    return {seed: row[valid] / row[total] for seed, row in runs.items()}


def study_seed_validity() -> list[dict]:
    """The paired per-seed valid-step rates of every study in VALIDITY_CELLS, for both metrics, at
    the last RL step; records like :func:`study_seed_ems`' with ``metric`` and the rates in
    the rates in ``arm_values``/``reference_values``."""
    records = []
    for study, file, layout, arm, reference, _ in VALIDITY_CELLS:
        data = json.loads((ROOT / "results" / file).read_text())
        for metric in VALIDITY_METRICS:
            arm_rate = per_seed_validity(data, layout, arm, metric)
            ref_rate = per_seed_validity(data, layout, reference, metric)
            seeds = sorted(set(arm_rate) & set(ref_rate))
            records.append(
                {
                    "contrast": OFE_GRPO,
                    "metric": metric,
                    "study": study,
                    "source": f"results/{file}",
                    "arm": arm,
                    "reference": reference,
                    "step": "last",
                    "seeds": seeds,
                    "arm_values": [arm_rate[s] for s in seeds],
                    "reference_values": [ref_rate[s] for s in seeds],
                }
            )
    return records


def check(records: list[dict]) -> bool:
    """Print each record's mean paired difference (points) beside the number the README or the LOG
    quotes for it; True if all agree to their rounding. ``records``: :func:`study_seed_ems`'s and
    :func:`study_seed_validity`'s."""
    quoted: dict[tuple[str, str, str, str], float | None] = {(c, "em", s, st): v for c, s, st, *_, v in CELLS}
    for study, *_, values in VALIDITY_CELLS:
        for metric, v in zip(VALIDITY_METRICS, values, strict=True):
            quoted[(OFE_GRPO, metric, study, "last")] = v
    print(f"{'contrast':72} {'study':24} {'step':5} {'n':>2} {'mean':>7} {'quoted':>7}  ok")
    ok_all = True
    for r in records:
        diffs = [a - b for a, b in zip(r["arm_values"], r["reference_values"], strict=True)]
        mean = 100 * sum(diffs) / len(diffs)
        value = quoted[(r["contrast"], r["metric"], r["study"], r["step"])]
        if value is None:
            shown, ok = "–", "no cell"
        else:
            shown, good = f"{value:+.2f}", abs(mean - value) <= TOLERANCE
            ok, ok_all = ("yes" if good else "NO"), ok_all and good
        label = r["contrast"] if r["metric"] == "em" else f"{r['contrast']}, {r['metric']}"
        print(f"{label:72} {r['study']:24} {r['step']:5} {len(diffs):2d} {mean:+7.2f} {shown:>7}  {ok}")
    return ok_all


if __name__ == "__main__":
    result = study_seed_ems()
    print(json.dumps(result, indent=1))
    if "--check" in sys.argv[1:]:
        sys.exit(0 if check(result + study_seed_validity()) else 1)
