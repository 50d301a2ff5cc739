"""The numbers of docs/RESULTS.md, computed from the committed results files alone.

    python research/drivers/results_page.py            # rewrite the page's tables, the JSON and the forest plot
    python research/drivers/results_page.py --check    # exit 1 if the page's tables are not what the files give

The page's prose is written by hand; its tables sit between ``<!-- generated: NAME -->`` and
``<!-- end: NAME -->`` and this script rewrites them: the summary (each step reward against outcome-only
GRPO and against its own shuffled control, at the last and the dev-chosen step, pooled over studies by
random effects), the complete list of tested contrasts with Holm-adjusted p-values beside the nominal
ones, what the setup can detect, and how well the policy reads. Every number it prints goes to the JSON
as well, so a sentence of the prose can be checked against it.

Surprising choices: a summary cell with one study shows that study's own t interval (no pooling); Holm
runs over every look of a family, per question and over seeds alike, because the LOG reported both.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: research/ is not installed

from scipy import optimize, stats

from prorag.core.statistics import holm_adjust, mean_and_ci, paired_t_test
from prorag.data.jsonl import write_json
from research.analysis.meta_analysis import fixed_effect, random_effects, study_estimate
from research.drivers import pool_studies_contrasts as contrasts
from research.drivers import pool_studies_data as data
from research.drivers.pool_studies_data import ROOT

PAGE = ROOT / "docs" / "RESULTS.md"
SUMMARY_JSON = ROOT / "results" / "summary_2026-12-01.json"
FOREST_PNG = ROOT / "docs" / "img" / "forest.png"
PAPER_GAIN = 2.2  # EM points: ProRAG over the strongest outcome-RL baseline, averaged over five benchmarks (its Table 1)

DUAL = "ProRAG's advantage: the step term added to every step's outcome advantage"
SIGNED = "Sign-preserving advantage: the step term never reverses the outcome's sign"
REPLAY = "With the warm-up's SFT loss replayed during RL"
PLACED = "ProRAG's advantage, the step term on some groups only, or standardised by step kind"
OTHERS = "Other methods' process rewards on the same trainer"


@dataclass(frozen=True)
class StepReward:
    """One summary row: a step reward under one advantage, and the pooling module's contrast names
    for it against GRPO, against its own shuffled control, and of that control against GRPO."""

    name: str
    short: str
    group: str
    vs_grpo: str
    vs_control: str | None = None
    bare: str | None = None


SUMMARY: list[StepReward] = [
    StepReward("Oracle, every step", "Oracle, every step", DUAL, data.ORACLE_GRPO),
    StepReward("Oracle, up to the first error", "Oracle, first error", DUAL, data.OFE_GRPO, data.OFE_SHUF, data.OFE_SHUF_GRPO),
    StepReward("Learned PRM, every step", "PRM, every step", DUAL, data.PRM_GRPO, data.PRM_SHUF, data.PRM_SHUF_GRPO),
    StepReward(
        "Oracle, up to the first error",
        "Oracle, first error",
        SIGNED,
        data.OFE_SGN_GRPO,
        data.OFE_SGN_SHUF,
        data.OFE_SGN_SHUF_GRPO,
    ),
    StepReward(
        "Learned PRM, every step", "PRM, every step", SIGNED, data.PRM_SGN_GRPO, data.PRM_SGN_SHUF, data.PRM_SGN_SHUF_GRPO
    ),
    StepReward(
        "Learned PRM, up to its first error", "PRM, first error", SIGNED, data.PRMFE_GRPO, data.PRMFE_SHUF, data.PRMFE_SHUF_GRPO
    ),
    StepReward(
        "Oracle, up to the first error, sign-preserving; its GRPO is outcome RL with the same replay",
        "Oracle, first error",
        REPLAY,
        data.OFE_SGN_PTX,
    ),
    StepReward(
        "Oracle, up to the first error, only on groups whose outcomes all agree",
        "Oracle, silent groups",
        PLACED,
        data.OFE_SIL_GRPO,
        data.OFE_SIL_SHUF,
        data.OFE_SIL_SHUF_GRPO,
    ),
    StepReward(
        "Oracle, up to the first error, only on groups whose outcomes differ",
        "Oracle, informative groups",
        PLACED,
        data.OFE_INF_GRPO,
        data.OFE_INF_SHUF,
        data.OFE_INF_SHUF_GRPO,
    ),
    StepReward("Oracle, up to the first error, standardised by step kind", "Oracle, by step kind", PLACED, data.OFEK_GRPO),
    StepReward("HiPRAG", "HiPRAG", OTHERS, data.HIPRAG_GRPO),
    StepReward("CP-Search", "CP-Search", OTHERS, data.CPSEARCH_GRPO),
    StepReward("P2S", "P2S", OTHERS, data.P2S_GRPO),
]
GROUP_SHORT = {
    DUAL: "ProRAG's advantage",
    SIGNED: "sign-preserving",
    REPLAY: "sign-preserving, with SFT replay",
    PLACED: "ProRAG's advantage",
    OTHERS: "tiny model",
}
REFERENCES = ("grpo", "control")
STEPS = ("last", "dev")

#: Study names as the page writes them.
STUDY_NAMES = {
    data.TINY: "tiny model, demo world",
    data.WIDE: "tiny model, wide world",
    **{getattr(data, f"B{i}"): f"small model, build {i}" for i in (1, 2, 3, 4, 5, 7, 8, 9)},
}

#: Study names as the plot writes them.
PLOT_NAMES = {data.TINY: "tiny model, demo world", data.WIDE: "tiny model, wide world"} | {
    getattr(data, f"B{i}"): f"build {i}" for i in (1, 2, 3, 4, 5, 7, 8, 9)
}

#: Arm codes of the results files, for their readers: the page never uses them.
ARM_NAMES: dict[str, str] = {
    "grpo, w12, ngrpo": "outcome-only GRPO (`w12`: screened questions of the 12 RL-share worlds; `ngrpo`: unscreened)",
    "prorag, prm": "learned PRM on every step, ProRAG's advantage",
    "prorag-shuffled, prmsh, prm_shuffled": "its shuffled control",
    "prorag-oracle": "oracle on every step, ProRAG's advantage",
    "prorag-oracle-first-error, ofe, nofe, oracle_first_error": "oracle up to the first error, ProRAG's advantage",
    "ofesh, nofesh, oracle_first_error_shuffled": "its shuffled control",
    "ofek": "oracle up to the first error, standardised by step kind",
    "nofesil, nofesilsh": "oracle up to the first error on silent groups only (`dual_silent`), and its control",
    "nofeinf, nofeinfsh": "the same on informative groups only (`dual_informative`), and its control",
    "nofesgn, nofesgnsh": "oracle up to the first error, sign-preserving advantage (`dual_signed`), and its control",
    "prmsgn, prmsgnsh": "learned PRM on every step, sign-preserving, and its control",
    "prmfesgn, prmfesgnsh": "learned PRM up to its first error (`prm-first-error`), sign-preserving, and its control",
    "ngrpob": "outcome-only GRPO divided by the batch's reward std instead of each group's",
    "ngrpolr1, grpo_lr1e-4": "outcome-only GRPO at half the learning rate",
    "grpo_kl0.1, ngrpokl": "outcome-only GRPO with a KL penalty 0.1 to pi_rft",
    "frozen": "learning rate 0: pi_rft sampled on the same question stream",
    "ngrpoptx, ngrpoptx2": "outcome RL with SFT replay (48 and 96 steps)",
    "ptxonly, ptxonly2": "the SFT replay alone, every RL advantage 0 (48 and 96 steps)",
    "nofesgnptx, nofesgnptx2": "the sign-preserving oracle up to the first error with SFT replay (48 and 96 steps)",
    "fresh": "outcome-only GRPO on questions of 900 fresh worlds, one each",
}


# ---------------------------------------------------------------------------------------------- summary


def _points(x: float) -> float:
    return round(100 * x, 3)


def _study_row(record: dict[str, Any]) -> dict[str, Any]:
    diffs = [a - b for a, b in zip(record["arm_values"], record["reference_values"], strict=True)]
    flat = max(diffs) - min(diffs) <= 1e-12
    mean, half = mean_and_ci(diffs)
    p = math.nan if flat else paired_t_test(record["arm_values"], record["reference_values"]).p_value
    return {
        "study": record["study"],
        "source": record["source"],
        "arm": record["arm"],
        "reference": record["reference"],
        "seeds": len(diffs),
        "differences": [_points(d) for d in diffs],
        "mean": _points(mean),
        "ci": [_points(mean - half), _points(mean + half)],
        "sd": _points(statistics.stdev(diffs)),
        "p": p,
        "flat": flat,
    }


def cell(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One summary cell from its studies' records: each study's paired mean and t interval, and the
    random-effects pool of the studies with spread (DerSimonian-Laird, modified Hartung-Knapp) where there
    are two or more; with one, that study's own estimate. None where no study ran the contrast."""
    if not records:
        return None
    rows = [_study_row(r) for r in records]
    weighed = [r for r in rows if not r["flat"]]
    out: dict[str, Any] = {"studies": rows, "k": len(weighed), "seeds": sum(r["seeds"] for r in weighed)}
    if len(weighed) >= 2:
        diffs = [[d / 100 for d in r["differences"]] for r in weighed]
        estimates = [study_estimate(r["study"], d) for r, d in zip(weighed, diffs, strict=True)]
        pooled, fixed = random_effects(estimates), fixed_effect(estimates)
        out.update(
            method="random effects",
            mean=_points(pooled.mean),
            ci=[_points(pooled.ci_low), _points(pooled.ci_high)],
            se=_points(pooled.se),
            p=pooled.p_value,
            tau=_points(math.sqrt(pooled.tau2)),
            i2=round(pooled.i2, 3),
            fixed={"mean": _points(fixed.mean), "ci": [_points(fixed.ci_low), _points(fixed.ci_high)], "p": fixed.p_value},
        )
    elif weighed:
        (only,) = weighed
        out.update(method="one study", mean=only["mean"], ci=only["ci"], se=None, p=only["p"], tau=None, i2=None)
    else:
        out.update(method="no spread", mean=rows[0]["mean"], ci=None, se=None, p=math.nan, tau=None, i2=None)
    return out


def summary() -> list[dict[str, Any]]:
    """Every summary row with its four cells (against GRPO and against the control, at the last and the
    dev-chosen step) and its bare term (the control against GRPO), each cell's p Holm-adjusted over the
    family of all summary cells."""
    records = data.study_seed_ems()
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        by_key.setdefault((r["contrast"], r["step"]), []).append(r)
    rows = []
    for reward in SUMMARY:
        names = {"grpo": reward.vs_grpo, "control": reward.vs_control, "bare": reward.bare}
        cells = {
            f"{ref}_{step}": cell(by_key.get((name, step), [])) if name else None for ref, name in names.items() for step in STEPS
        }
        rows.append({"name": reward.name, "short": reward.short, "group": reward.group, "cells": cells})
    family = [c for row in rows for key, c in row["cells"].items() if c is not None and not key.startswith("bare")]
    for c, adjusted in zip(family, holm_adjust([c["p"] for c in family]), strict=True):
        c["p_holm"] = adjusted
    for row in rows:
        for key, c in row["cells"].items():
            if c is not None and key.startswith("bare"):
                c["p_holm"] = None
    return rows


# ---------------------------------------------------------------------------------------------- detection


def detectable(se: float, df: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference a two-sided t test at ``alpha`` finds with probability ``power``,
    given the estimate's standard error ``se`` and the test's degrees of freedom: the root in ``delta``
    of the noncentral t's power (noncentrality ``delta / se``)."""
    critical = float(stats.t.ppf(1 - alpha / 2, df))

    def shortfall(delta: float) -> float:
        nc = delta / se
        lower = float(stats.nct.cdf(-critical, df, nc))  # the wrong-sign tail; scipy gives NaN where it is ~0
        return float(stats.nct.sf(critical, df, nc)) + (0.0 if math.isnan(lower) else lower) - power

    high = se
    while shortfall(high) < 0:
        high *= 2
    return float(optimize.brentq(shortfall, 1e-9 * se, high))


def seeds_for(sd: float, target: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Seeds a paired t over seeds needs to find ``target`` at ``power`` when the per-seed differences
    have standard deviation ``sd``."""
    n = 2
    while detectable(sd / math.sqrt(n), n - 1, alpha, power) > target:
        n += 1
    return n


def detection(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What this setup resolves: the seed-to-seed SD of the paired differences in every last-step cell
    of the summary (against GRPO and against the control), the smallest difference five and seven seeds
    detect at that SD, the seeds the paper's claimed gain needs, and each pooled row's own resolution."""
    sds = sorted(
        s["sd"]
        for row in rows
        for key in ("grpo_last", "control_last")
        if row["cells"][key]
        for s in row["cells"][key]["studies"]
        if not s["flat"]
    )
    median = statistics.median(sds)
    pooled = []
    for row in rows:
        for key in ("grpo_last", "control_last"):
            c = row["cells"][key]
            if c and c["method"] == "random effects":
                pooled.append(
                    {
                        "name": row["name"],
                        "group": row["group"],
                        "against": key.split("_")[0],
                        "k": c["k"],
                        "se": c["se"],
                        "detectable": round(detectable(c["se"], c["k"] - 1), 2),
                    }
                )
    return {
        "cells": len(sds),
        "sd_median": round(median, 2),
        "sd_range": [round(sds[0], 2), round(sds[-1], 2)],
        "detectable_5_seeds": round(detectable(median / math.sqrt(5), 4), 2),
        "detectable_7_seeds": round(detectable(median / math.sqrt(7), 6), 2),
        "seeds_for_paper_gain": seeds_for(median, PAPER_GAIN),
        "paper_gain": PAPER_GAIN,
        "pooled": pooled,
    }


# ---------------------------------------------------------------------------------------------- reading


def _counts_rates(counts: dict[str, Any]) -> dict[str, float | None]:
    if "conclude" in counts:
        wrong = counts["conclude"] - counts["conclude_valid"]
        gold = counts.get("conclude_wrong_gold_in_documents")
        return {
            "valid_subanswers": 100 * counts["conclude_valid"] / counts["conclude"],
            "valid_searches": 100 * counts["search_valid"] / counts["search"],
            "wrong_with_gold_in_documents": None if gold is None else 100 * gold / wrong,
        }
    return {
        "valid_subanswers": 100 * counts["valid_subanswers"] / counts["judged_subanswers"],
        "valid_searches": 100 * counts["valid_searches"] / counts["judged_searches"],
        "wrong_with_gold_in_documents": None,
    }


def reading() -> list[dict[str, Any]]:
    """How well each build's pi_rft reads, by the oracle's verdicts on its test steps: valid sub-answers
    and searches, and the share of its wrong sub-answers written after a retrieved document held the gold
    one; with its test EM on 3- and 4-hop questions where the file keeps them."""
    load = contrasts.load
    out = []
    b1 = load(data.B1_OFE)["step_validity"]["systems"]["counts"]["rft"]
    out.append({"study": data.B1, "source": data.B1_OFE, **_counts_rates(b1)})
    b2 = load(data.B2_PROCESS)["pi_rft"]
    out.append(
        {
            "study": data.B2,
            "source": data.B2_PROCESS,
            "valid_subanswers": 100 * b2["valid_sub_answers"],
            "valid_searches": 100 * b2["valid_searches"],
            "wrong_with_gold_in_documents": None,
        }
    )
    b3 = load(contrasts.B3_VALIDITY)["pi_rft"]
    out.append(
        {
            "study": data.B3,
            "source": contrasts.B3_VALIDITY,
            "valid_subanswers": b3["valid_subanswer"],
            "valid_searches": b3["valid_search"],
            "wrong_with_gold_in_documents": None,
        }
    )
    for study, file in ((data.B4, data.B4_UNSCREENED), (data.B5, data.B5_RUNS), (data.B7, data.B7_RUNS)):
        out.append({"study": study, "source": file, **_counts_rates(load(file)["step_validity"]["pi_rft"])})
    for study, file in ((data.B8, data.B8_RUNS), (data.B9, contrasts.B9_FIVE)):
        d = load(file)
        row = {"study": study, "source": file, **_counts_rates(d["step_validity"]["pi_rft"])}
        hops = d["build"]["pi_rft_test"]["em_by_hops"]
        row.update(hop3_em=100 * hops["3"]["em"], hop4_em=100 * hops["4"]["em"])
        out.append(row)
    for row in out:
        for key, value in list(row.items()):
            if isinstance(value, float):
                row[key] = round(value, 1)
        row["pi_rft_em"] = round(100 * contrasts.pi_rft_value(_em_file(row["study"]), "em"), 2)
    return out


def _em_file(study: str) -> str:
    return {
        data.B1: contrasts.B1_GRPO,
        data.B2: data.B2_PROCESS,
        data.B3: data.B3_PRM,
        data.B4: data.B4_UNSCREENED,
        data.B5: data.B5_RUNS,
        data.B7: data.B7_RUNS,
        data.B8: data.B8_RUNS,
        data.B9: contrasts.B9_FIVE,
    }[study]


# ---------------------------------------------------------------------------------------------- cost

FAMILY_NAMES = {
    "grpo": "outcome-only GRPO",
    "prorag": "learned PRM",
    "prorag-oracle": "oracle",
    "hiprag": "HiPRAG",
    "cpsearch": "CP-Search",
    "p2s": "P2S",
}
GPU_CHECKS = "gpu_h200_checks_2026-11-27.json"


def cost() -> dict[str, Any]:
    """Seconds per RL step of each method's reward on the tiny model (the family study, one process of
    one thread beside another), and one process-supervised RL step on an H200 against stock TRL's
    ``GRPOTrainer`` (a random Qwen3-0.6B-shaped model; two machines of one kind)."""
    family = contrasts.load(data.TINY_FAMILY)["stats"]
    gpu = contrasts.load(GPU_CHECKS)
    return {
        "tiny_seconds_per_rl_step": {name: round(family[arm]["seconds_per_rl_step"], 1) for arm, name in FAMILY_NAMES.items()},
        "h200": {
            "device": gpu["call2"]["device"],
            "shape": gpu["call2"]["shape"],
            "prorag_seconds": round(gpu["call2"]["prorag"]["median"]["total"], 2),
            "prorag_generation_seconds": round(gpu["call2"]["prorag"]["median"]["generation"], 2),
            "stock_trl_seconds": round(gpu["call1"]["rl_trl"]["trl"]["seconds"], 2),
        },
    }


def render_cost(c: dict[str, Any]) -> str:
    tiny = c["tiny_seconds_per_rl_step"]
    gpu = c["h200"]
    lines = ["| | seconds per RL step |", "|---|---|"]
    lines += [f"| {name}, tiny model, 2-core CPU | {seconds:.1f} |" for name, seconds in tiny.items()]
    lines.append(f"| process-supervised step, {gpu['shape']} shape, one {gpu['device']} | {gpu['prorag_seconds']:.2f} |")
    lines.append(f"| stock TRL `GRPOTrainer`, same shape, another {gpu['device']} | {gpu['stock_trl_seconds']:.2f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- contrast list


def tested() -> dict[str, Any]:
    """The complete list of tested contrasts, each with its nominal p and its Holm-adjusted p within its
    family (step rewards; outcome RL); contrasts without spread have no test and no Holm value."""
    rows = contrasts.tested_contrasts()
    counts = {}
    for family in (contrasts.STEP_REWARDS, contrasts.OUTCOME_RL):
        members = [r for r in rows if r["family"] == family]
        for r, adjusted in zip(members, holm_adjust([r["p"] for r in members]), strict=True):
            r["p_holm"] = adjusted
        tests = [r for r in members if not math.isnan(r["p"])]
        counts[family] = {
            "tests": len(tests),
            "no_spread": len(members) - len(tests),
            "nominal_below_005": sum(r["p"] < 0.05 for r in tests),
            "holm_below_005": sum(r["p_holm"] < 0.05 for r in tests),
            "holm_below_005_over_seeds": sum(r["p_holm"] < 0.05 for r in tests if r["test"] == "seeds"),
            "predicted": sum(r["predicted"] is not None for r in members),
        }
    return {"rows": rows, "counts": counts}


# ---------------------------------------------------------------------------------------------- rendering


def _num(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:+.{digits}f}".replace("-", "−")


def _p(p: float | None) -> str:
    if p is None or math.isnan(p):
        return "–"
    if p < 0.001:
        return "< 0.001"
    return f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def _cell_text(c: dict[str, Any] | None) -> str:
    if c is None:
        return "not measured"
    if c["method"] == "no spread":
        return f"{_num(c['mean'])} in every seed (dev chose pi_rft)"
    low, high = c["ci"]
    what = f"{c['k']} studies" if c["k"] > 1 else STUDY_NAMES[c["studies"][0]["study"]].replace("small model, ", "")
    return f"**{_num(c['mean'])}** [{_num(low)}, {_num(high)}]<br>{what}, {c['seeds']} seeds; p {_p(c['p'])} (Holm {_p(c['p_holm'])})"


def render_summary(rows: list[dict[str, Any]]) -> str:
    """The summary as one table; a row in italics opens each group of step rewards."""
    lines = [
        "| Step reward | vs outcome-only GRPO, last step | vs GRPO, dev-chosen step | vs its shuffled control, last step "
        "| vs its control, dev-chosen step |",
        "|---|---|---|---|---|",
    ]
    group = None
    for row in rows:
        if row["group"] != group:
            group = row["group"]
            lines.append(f"| *{group}* | | | | |")
        cells = [_cell_text(row["cells"][f"{ref}_{step}"]) for ref in REFERENCES for step in STEPS]
        if row["cells"]["control_last"] is None and row["cells"]["grpo_last"] is not None:
            cells[2] = cells[3] = "no control run"
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_bare(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| The shuffled control of | against GRPO, last step | dev-chosen step |",
        "|---|---|---|",
    ]
    for row in rows:
        last, dev = row["cells"]["bare_last"], row["cells"]["bare_dev"]
        if last is None:
            continue
        texts = []
        for c in (last, dev):
            if c is None:
                texts.append("not measured")
            elif c["method"] == "no spread":
                texts.append(f"{_num(c['mean'])} in every seed")
            else:
                what = f"{c['k']} studies" if c["k"] > 1 else STUDY_NAMES[c["studies"][0]["study"]].replace("small model, ", "")
                texts.append(f"{_num(c['mean'])} [{_num(c['ci'][0])}, {_num(c['ci'][1])}]; {what}, p {_p(c['p'])}")
        lines.append(f"| {row['name']} ({_short_group(row['group'])}) | {texts[0]} | {texts[1]} |")
    return "\n".join(lines)


def _short_group(group: str) -> str:
    return GROUP_SHORT[group]


def render_detection(d: dict[str, Any]) -> str:
    lines = [
        "| | EM points |",
        "|---|---|",
        f"| Seed-to-seed SD of a paired difference, last step (median of {d['cells']} study cells; range) "
        f"| {d['sd_median']:.2f} ({d['sd_range'][0]:.2f} to {d['sd_range'][1]:.2f}) |",
        f"| Smallest difference found 80% of the time at p < 0.05, 5 seeds | {d['detectable_5_seeds']:.2f} |",
        f"| The same, 7 seeds | {d['detectable_7_seeds']:.2f} |",
        f"| Seeds needed to find the paper's +{d['paper_gain']} EM 80% of the time | {d['seeds_for_paper_gain']} |",
    ]
    for p in d["pooled"]:
        if p["k"] < 3:
            continue  # two studies pool on one degree of freedom: they resolve nothing under 10 EM
        against = "GRPO" if p["against"] == "grpo" else "its shuffled control"
        lines.append(
            f"| The same for a pool: {p['name'][0].lower() + p['name'][1:]} ({_short_group(p['group'])}) vs {against}, "
            f"{p['k']} studies | {p['detectable']:.2f} |"
        )
    return "\n".join(lines)


def render_reading(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| pi_rft of | test EM | valid sub-answers | valid searches | wrong sub-answers written with the gold one in a retrieved document | 3-hop / 4-hop EM |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        gold = "–" if r["wrong_with_gold_in_documents"] is None else f"{r['wrong_with_gold_in_documents']:.0f}%"
        hops = f"{r['hop3_em']:.1f} / {r['hop4_em']:.1f}" if "hop3_em" in r else "–"
        lines.append(
            f"| {STUDY_NAMES[r['study']]} | {r['pi_rft_em']:.2f} | {r['valid_subanswers']:.1f}% | {r['valid_searches']:.1f}% | {gold} | {hops} |"
        )
    return "\n".join(lines)


def _look(r: dict[str, Any]) -> str:
    text = f"{_num(r['mean'])}, p {_p(r['p'])}"
    if not math.isnan(r["p"]):
        text += f" ({_p(r['p_holm'])})"
    if r["predicted"]:
        text += " †"
    if r["source"].startswith("LOG"):
        text += " ‡"
    return text


COLUMNS = (
    ("em", "last", "seeds"),
    ("em", "last", "questions"),
    ("em", "dev", "seeds"),
    ("em", "dev", "questions"),
    ("non_yes_no_em", "last", "seeds"),
)
OTHER_METRICS = ("valid_search", "valid_subanswer", "dev_em", "hop1", "hop2", "hop3", "hop4")
OTHER_SHORT = {
    "valid_search": "searches",
    "valid_subanswer": "sub-answers",
    "dev_em": "dev EM",
    "hop1": "1-hop",
    "hop2": "2-hop",
    "hop3": "3-hop",
    "hop4": "4-hop",
}


def render_contrasts(t: dict[str, Any], family: str) -> str:
    """One row per (study, contrast): test EM at the last step over seeds and per question, at the
    dev-chosen step, on the non-yes/no questions, then the steps' validity, dev EM and EM by hops; each
    look as ``mean, p nominal (Holm)``; † marks a look whose range was predicted before its run, ‡ a look
    transcribed from the LOG."""
    rows = [r for r in t["rows"] if r["family"] == family]
    keyed: dict[tuple[str, str], dict[tuple[str, str, str], dict[str, Any]]] = {}
    for r in rows:
        keyed.setdefault((r["study"], r["contrast"]), {})[(r["metric"], r["step"], r["test"])] = r
    lines = [
        "| Study | Contrast | Test EM, last step | per question | dev-chosen step | per question | non-yes/no | Steps, dev EM, hops (last step) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (study, label), looks in keyed.items():
        cells = [_look(looks[c]) if c in looks else "" for c in COLUMNS]
        other = [f"{OTHER_SHORT[m]} {_look(looks[(m, 'last', 'seeds')])}" for m in OTHER_METRICS if (m, "last", "seeds") in looks]
        n = next(iter(looks.values()))["n"] if ("em", "last", "seeds") not in looks else looks[("em", "last", "seeds")]["n"]
        name = STUDY_NAMES[study].replace("small model, ", "")
        lines.append(f"| {name} | {label} ({n}) | " + " | ".join(cells) + " | " + "; ".join(other) + " |")
    return "\n".join(lines)


def render_counts(t: dict[str, Any]) -> str:
    lines = []
    for family, name in ((contrasts.STEP_REWARDS, "Step rewards"), (contrasts.OUTCOME_RL, "Outcome RL")):
        c = t["counts"][family]
        survivors = (
            "none of them a test over seeds"
            if c["holm_below_005_over_seeds"] == 0
            else f"{c['holm_below_005_over_seeds']} of them over seeds"
        )
        lines.append(
            f"- **{name}: {c['tests']} tests** ({c['no_spread']} more looks have no spread to test), "
            f"**{c['nominal_below_005']} with nominal p < 0.05, {c['holm_below_005']} after Holm**, {survivors}; "
            f"{c['predicted']} looks had a range predicted before their runs."
        )
    return "\n".join(lines)


def render_codes() -> str:
    lines = ["| Codes in the results files | What the arm is |", "|---|---|"]
    lines += [f"| {', '.join(f'`{c.strip()}`' for c in codes.split(','))} | {name} |" for codes, name in ARM_NAMES.items()]
    return "\n".join(lines)


def fragments(page: dict[str, Any]) -> dict[str, str]:
    """The page's generated blocks, by name."""
    t = page["contrasts"]
    return {
        "summary": render_summary(page["summary"]),
        "bare": render_bare(page["summary"]),
        "detection": render_detection(page["detection"]),
        "reading": render_reading(page["reading"]),
        "contrasts-step-rewards": render_contrasts(t, contrasts.STEP_REWARDS),
        "contrasts-outcome-rl": render_contrasts(t, contrasts.OUTCOME_RL),
        "cost": render_cost(page["cost"]),
        "contrast-counts": render_counts(t),
        "codes": render_codes(),
    }


def heading_anchors(markdown_text: str) -> set[str]:
    """The ids Python-Markdown's ``toc`` extension (MkDocs' default) gives the headings of a page: the
    heading's text without inline-code and emphasis marks, reduced to ASCII word characters, lower case,
    runs of spaces and hyphens as one hyphen; a repeated id gets ``_1``, ``_2``. The page links LOG
    entries by these ids, and its test checks each link against them."""
    anchors: set[str] = set()
    in_code = False
    for line in markdown_text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        text = re.sub(r"[`*]", "", line.lstrip("#").strip())
        text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
        slug = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())
        unique, n = slug, 0
        while unique in anchors:
            n += 1
            unique = f"{slug}_{n}"
        anchors.add(unique)
    return anchors


BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.S)


def fill(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each generated block's body replaced by ``blocks[name]``; every block named in
    ``blocks`` must be in the text once, and every block in the text must be named."""
    found = [m.group("name") for m in BLOCK.finditer(text)]
    if sorted(found) != sorted(blocks):
        raise ValueError(f"the page's generated blocks {sorted(found)} are not the script's {sorted(blocks)}")
    return BLOCK.sub(lambda m: f"{m.group(1)}\n{blocks[m.group('name')]}\n{m.group(4)}", text)


# ---------------------------------------------------------------------------------------------- plot


def forest(rows: list[dict[str, Any]], path: Path, limit: float = 12.0) -> None:
    """Each study's paired difference (95% t interval) and each pooled estimate (95% random-effects
    interval, a diamond), against GRPO on the left and against the step reward's own shuffled control on
    the right; filled marks at the last step, open ones at the dev-chosen step; intervals past
    ``limit`` points end in an arrow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plotted = [r for r in rows if r["group"] in (DUAL, SIGNED, REPLAY)]
    lines: list[tuple[str, str, int, str | None]] = []  # (kind, label, summary row, study)
    for index, row in enumerate(plotted):
        lines.append(("header", f"{row['short']} ({_short_group(row['group'])})", index, None))
        studies: list[str] = []
        for key in ("grpo_last", "grpo_dev", "control_last", "control_dev"):
            for s in row["cells"][key]["studies"] if row["cells"][key] else []:
                if s["study"] not in studies:
                    studies.append(s["study"])
        lines += [("study", PLOT_NAMES[s], index, s) for s in studies]
        if any(row["cells"][k] and row["cells"][k]["method"] == "random effects" for k in ("grpo_last", "control_last")):
            lines.append(("pooled", "pooled", index, None))
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.26 * len(lines) + 1.4), sharey=True)
    ys = [len(lines) - i for i in range(len(lines))]
    titles = ("against outcome-only GRPO", "against its own shuffled control")
    for ax, ref, title in zip(axes, REFERENCES, titles, strict=True):
        ax.axvline(0, color="0.4", lw=1)
        ax.axvline(PAPER_GAIN, color="tab:red", lw=1, ls=":")
        for (kind, _label, index, study), y0 in zip(lines, ys, strict=True):
            if kind == "header":
                ax.axhline(y0 + 0.5, color="0.8", lw=0.8)
                continue
            for step, offset, filled in (("last", 0.12, True), ("dev", -0.18, False)):
                c = plotted[index]["cells"][f"{ref}_{step}"]
                color = "tab:blue" if filled else "tab:orange"
                estimate = None
                if c and kind == "study":
                    estimate = next((s for s in c["studies"] if s["study"] == study), None)
                elif c and c["method"] == "random effects":
                    estimate = c
                if estimate is None:
                    continue
                y, mean, (low, high) = y0 + offset, estimate["mean"], estimate["ci"]
                left, right = max(-limit, low), min(limit, high)
                if kind == "study":
                    ax.plot([left, right], [y, y], color=color, lw=1.2)
                    ax.plot([mean], [y], "o", color=color, mfc=color if filled else "white", ms=5)
                else:
                    ax.fill(
                        [left, mean, right, mean, left], [y, y + 0.17, y, y - 0.17, y], fc=color if filled else "white", ec=color
                    )
                if low < -limit:
                    ax.plot([-limit], [y], "<", color=color, ms=5)
                if high > limit:
                    ax.plot([limit], [y], ">", color=color, ms=5)
        ax.set_xlim(-limit - 0.6, limit + 0.6)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("difference in test EM, points")
        ax.grid(axis="x", color="0.93")
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels([label for _, label, _, _ in lines], fontsize=8.5)
    for tick, (kind, _, _, _) in zip(axes[0].get_yticklabels(), lines, strict=True):
        tick.set_fontweight("bold" if kind == "header" else "normal")
        tick.set_fontstyle("italic" if kind == "pooled" else "normal")
    axes[0].set_ylim(0.4, len(lines) + 0.7)
    handles = [
        plt.Line2D([], [], color="tab:blue", marker="o", label="last RL step"),
        plt.Line2D([], [], color="tab:orange", marker="o", mfc="white", label="dev-chosen step"),
        plt.Line2D([], [], color="tab:red", ls=":", label=f"+{PAPER_GAIN} EM: ProRAG's reported gain"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.035, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main


def compute() -> dict[str, Any]:
    """Every number of the page."""
    rows = summary()
    return {
        "what": "The numbers of docs/RESULTS.md, from the committed results files: the summary of step-reward "
        "contrasts (random effects over studies: DerSimonian-Laird tau2, modified Hartung-Knapp interval on "
        "k - 1 df; one study: its paired t interval over seeds), Holm-adjusted p-values, the detectable "
        "difference, pi_rft's reading, and every tested contrast. EM and rates in points.",
        "command": "python research/drivers/results_page.py",
        "summary": rows,
        "detection": detection(rows),
        "reading": reading(),
        "cost": cost(),
        "contrasts": tested(),
    }


def _clean(x: Any) -> Any:
    """NaN as null, so the JSON stays standard."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/RESULTS.md's tables differ from the files'")
    parser.add_argument("--json", type=Path, default=SUMMARY_JSON)
    parser.add_argument("--plot", type=Path, default=FOREST_PNG)
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args()
    page = compute()
    text = args.page.read_text()
    filled = fill(text, fragments(page))
    if args.check:
        if filled != text:
            print(f"{args.page} is not current: run python research/drivers/results_page.py", file=sys.stderr)
            sys.exit(1)
        print(f"{args.page} is current")
        return
    args.page.write_text(filled)
    write_json(args.json, _clean(page))
    forest(page["summary"], args.plot)
    print(f"-> {args.page}, {args.json}, {args.plot}")


if __name__ == "__main__":
    main()
