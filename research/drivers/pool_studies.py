"""Each step-reward contrast of the process ablations, pooled over the studies that ran it.

    python research/drivers/pool_studies.py [--out research/results/pooled_process_DATE.json]

Inputs: the per-seed test EM of both arms of every cell, and the oracle's verdicts on the test steps
where three studies kept them (``research/drivers/pool_studies_data.py``). Each study enters as the mean
and standard error of its per-seed paired differences; a contrast is pooled by random effects
(DerSimonian-Laird, modified Hartung-Knapp interval on k - 1 degrees of freedom) and, for comparison, by
fixed effect (:mod:`research.analysis.meta_analysis`), at the last RL step and at the dev-chosen step.
Printed per contrast: each study's mean and 95% CI, the pooled means with CI and p, tau and I2, in
points. docs/RESULTS.md's summary is computed by ``results_page.py`` from the same inputs.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: research/ is not installed

from prorag.core.statistics import mean_and_ci
from prorag.data.jsonl import write_json
from research.analysis.meta_analysis import PooledEstimate, fixed_effect, random_effects, study_estimate
from research.drivers.pool_studies_data import study_seed_ems, study_seed_validity

#: The small model's builds: one config (configs/pipelines/arms_demo.yaml) built four times.
SMALL_MODEL = "small, build"


def points(x: float) -> float:
    return round(100 * x, 3)


def pooled_row(estimate: PooledEstimate) -> dict[str, Any]:
    """A pooled estimate in points (EM, or percent of steps)."""
    return {
        "mean": points(estimate.mean),
        "ci": [points(estimate.ci_low), points(estimate.ci_high)],
        "se": points(estimate.se),
        "p_value": round(estimate.p_value, 4),
        "studies": estimate.k,
        "tau": points(math.sqrt(estimate.tau2)),
        "i2": round(estimate.i2, 3),
        "q": round(estimate.q, 3),
        "q_p_value": round(estimate.q_p_value, 4),
    }


def paired_values() -> list[dict[str, Any]]:
    """Every study's paired per-seed values: test EM (``metric`` ``em``) and the oracle's valid-step
    rates (``valid_search``, ``valid_subanswer``), as ``arm_values``/``reference_values`` fractions."""
    return study_seed_ems() + study_seed_validity()


def has_spread(record: dict[str, Any]) -> bool:
    """Whether a cell's per-seed differences vary: a cell whose differences are all equal (build 8 at
    the dev-chosen step, where dev chose pi_rft itself in every run of both arms) has a standard error
    of 0, which no inverse-variance weight can take, and is left out of the pooling."""
    diffs = [a - b for a, b in zip(record["arm_values"], record["reference_values"], strict=True)]
    return max(diffs) - min(diffs) > 1e-12


def pool(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (contrast, metric, step, scope) with at least two studies: the studies'
    estimates and the pooled ones. Scope ``all`` takes every study; ``small model`` only the small
    model's builds (one config, several builds), where they are fewer than all. Cells without
    spread are left out (:func:`has_spread`)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        if has_spread(r):
            groups.setdefault((r["contrast"], r["metric"], r["step"]), []).append(r)
    out = []
    for (contrast, metric, step), rows in groups.items():
        scopes = {"all": rows, "small model": [r for r in rows if r["study"].startswith(SMALL_MODEL)]}
        if len(scopes["small model"]) == len(rows):
            del scopes["small model"]
        for scope, members in scopes.items():
            if len(members) < 2:
                continue
            studies, shown = [], []
            for r in members:
                diffs = [a - b for a, b in zip(r["arm_values"], r["reference_values"], strict=True)]
                studies.append(study_estimate(r["study"], diffs))
                mean, half = mean_and_ci(diffs)
                shown.append(
                    {
                        "study": r["study"],
                        "source": r["source"],
                        "arm": r["arm"],
                        "reference": r["reference"],
                        "seeds": r["seeds"],
                        "differences": [points(d) for d in diffs],
                        "mean": points(mean),
                        "ci": [points(mean - half), points(mean + half)],
                    }
                )
            out.append(
                {
                    "contrast": contrast,
                    "metric": metric,
                    "step": step,
                    "scope": scope,
                    "studies": shown,
                    "random_effects": pooled_row(random_effects(studies)),
                    "fixed_effect": pooled_row(fixed_effect(studies)),
                }
            )
    return out


def show(pooled: list[dict[str, Any]]) -> None:
    for entry in pooled:
        what = "test EM" if entry["metric"] == "em" else f"{entry['metric']} rate (oracle's verdicts on test steps)"
        print(f"\n{entry['contrast']} ({entry['step']} step, {entry['scope']} studies), {what}, points")
        for s in entry["studies"]:
            lo, hi = s["ci"]
            print(f"  {s['study']:24} {s['mean']:+6.2f} [{lo:+6.2f}, {hi:+6.2f}]  ({len(s['seeds'])} seeds)")
        random, fixed = entry["random_effects"], entry["fixed_effect"]
        for label, p in (("pooled, random effects", random), ("pooled, fixed effect", fixed)):
            lo, hi = p["ci"]
            print(f"  {label:24} {p['mean']:+6.2f} [{lo:+6.2f}, {hi:+6.2f}]  p {p['p_value']:.3f}")
        print(
            f"  {'between studies':24} tau {random['tau']:.2f}  I2 {random['i2']:.0%}  (Q {random['q']:.2f}, p {random['q_p_value']:.3f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the pooled estimates and their inputs")
    args = parser.parse_args()
    pooled = pool(paired_values())
    show(pooled)
    if args.out is not None:
        write_json(
            args.out,
            {
                "what": "Step-reward contrasts of the process ablations pooled over studies (points of test EM, or of "
                "valid steps by the oracle's verdicts; "
                "random effects: DerSimonian-Laird tau2, modified Hartung-Knapp interval on k - 1 df; fixed "
                "effect: inverse variance, normal interval). Each study: per-seed paired differences.",
                "command": "python research/drivers/pool_studies.py --out " + str(args.out),
                "pooled": pooled,
            },
        )
        print(f"\n-> {args.out}")


if __name__ == "__main__":
    main()
