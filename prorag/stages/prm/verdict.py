"""``summary.json``: does the PRM beat the init policy's own step likelihood (:func:`likelihood_verdict`)?

Three comparisons: held-out pairs' accuracy and AUC, and the fresh-sample AUC. A PRM beats the
likelihood only by more than :data:`VERDICT_MARGIN`, so one that kept its initial weights does not.
The summary names where its fresh-sample audit came from: audits of different policies or
questions are different verdicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prorag.data.jsonl import read_json, read_jsonl, write_json

#: (what is compared, the PRM's number, the init policy likelihood's number): the comparisons of
#: :func:`likelihood_verdict`, keys of the held-out metrics row and of the audit.
VERDICT_CHECKS: tuple[tuple[str, str, str], ...] = (
    ("held_out_accuracy", "eval_accuracy", "eval_policy_likelihood_accuracy"),
    ("held_out_auc", "eval_auc", "eval_policy_likelihood_auc"),
    ("fresh_sample_auc", "auc", "policy_likelihood_auc"),
)


#: How much a PRM's accuracy or AUC must exceed the likelihood's to count as beating it: about
#: one standard error of an AUC on a few hundred steps per class (Hanley-McNeil), so a PRM that
#: kept its initial weights (equal to the likelihood up to float noise) does not "beat" it.
VERDICT_MARGIN = 0.01


def likelihood_verdict(
    held_out: dict[str, Any] | None, audit: dict[str, Any] | None, margin: float = VERDICT_MARGIN
) -> dict[str, Any]:
    """Whether the PRM beats the init policy's own step likelihood, per comparison: held-out
    pairs' accuracy and AUC (``held_out``: the last metrics row of :func:`~prorag.stages.prm.run.train_prm`) and the
    fresh-sample AUC (``audit``: :func:`~prorag.stages.prm.audits.fresh_sample_audit`). Each is ``{"prm", "likelihood",
    "beats"}``, ``beats`` greater by more than ``margin`` (a tie, or a float-noise difference,
    has learned nothing beyond the policy), None when a number is missing or NaN; ``beats_all``
    is True only when all three are True."""

    def number(source: dict[str, Any] | None, key: str) -> float | None:
        value = (source or {}).get(key)
        return float(value) if isinstance(value, int | float) and value == value else None

    out: dict[str, Any] = {}
    for name, prm_key, base_key in VERDICT_CHECKS:
        source = audit if name.startswith("fresh") else held_out
        prm, base = number(source, prm_key), number(source, base_key)
        out[name] = {"prm": prm, "likelihood": base, "beats": None if prm is None or base is None else prm > base + margin}
    out["beats_all"] = all(out[name]["beats"] is True for name, _, _ in VERDICT_CHECKS)
    out["margin"] = margin
    return out


def write_prm_summary(
    run_dir: str | Path, audit: dict[str, Any] | None = None, audit_source: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``RUN/summary.json``: :func:`likelihood_verdict` of a PRM run folder, from the last
    held-out row of ``metrics.jsonl`` and ``audit`` (else ``RUN/audit.json`` when the audit has
    run: the pipeline's ``prm-audit`` stage, ``prorag prm-audit``).

    The fresh-sample check depends on which policy was sampled, on which questions and how
    many times, so the summary says where its audit came from (``audit_source``: what the caller
    passes, or ``{"file": "audit.json"}`` for the run folder's own audit): an audit on RL's groups
    from pi_rft and the pipeline's on pi_sft's dev samples are different verdicts, and a reader of
    ``summary.json`` alone must be able to tell them apart."""
    run = Path(run_dir)
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "eval_accuracy" in r] if (run / "metrics.jsonl").is_file() else []
    if audit is None and (run / "audit.json").is_file():
        audit = read_json(run / "audit.json")
        audit_source = audit_source or {"file": "audit.json"}
    summary = likelihood_verdict(rows[-1] if rows else None, audit)
    if audit is not None:
        summary["audit_source"] = audit_source
    write_json(run / "summary.json", summary)
    return summary
