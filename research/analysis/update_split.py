"""What a trained policy's update is worth to first order and costs to second (`drivers/update_split.py`).

A run's change of EM, ``EM(start + delta) - EM(start)``, mixes what its direction buys and what a step
of its length costs whatever the direction. Evaluating the mirrored policy ``start - delta`` and a
policy moved by the same step sizes in no direction (``start + permuted delta``) separates them
(:mod:`research.analysis.update_noise` has the algebra): per question, half of ``EM(+) - EM(-)`` is
the linear part, the mean of the two minus ``EM(start)`` the quadratic part, and the permuted step's
change is what a step of that size costs where nothing was learned. Optional shorter steps
(``start + scale * delta``, WiSE-FT's interpolation) show how much of the first order a shorter step
keeps.

Every policy is written under ``OUT/policies/`` (safetensors, through :func:`save_policy`, from the
start policy's own model so configs, tied weights and the tokenizer stay right) and evaluated greedily
with the usual harness under ``OUT/eval/``, which resumes a stopped evaluation; ``OUT/split.json`` is
written at the end (atomically).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from prorag.core.errors import DataError
from prorag.core.statistics import mean_and_ci, paired_t_test
from prorag.data.jsonl import read_jsonl, write_json
from research.analysis.update_noise import (
    apply_delta,
    delta_rms,
    permuted_delta,
    second_order_split,
    update_delta,
)


def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder's safetensors files (one file or shards), on the CPU.

    A LoRA adapter folder has no whole model to subtract from its start (merge it first: the RL and
    SFT stages write ``policy/`` merged); a folder without safetensors is refused (no pickles)."""
    from safetensors.torch import load_file

    path = Path(folder)
    if (path / "adapter_config.json").is_file():
        raise DataError(str(path), "a LoRA adapter, not a whole model: use the run's merged policy/ folder")
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise DataError(str(path), "no *.safetensors weights in this folder (a checkpoint folder is expected)")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def write_policy_with_weights(model: Any, tokenizer: Any, weights: dict[str, torch.Tensor], out: Path) -> Path:
    """``model`` (the start policy, loaded once by the caller) with ``weights`` put in, saved with
    ``tokenizer`` to ``out``.

    The weights carry the names of the start's own files, so every one must land in the model; the
    model's keys they leave out are the ones its files leave out too (tied heads, buffers), and every
    call replaces all of the file's tensors, so one model serves every policy written."""
    from prorag.models.checkpoints import save_policy

    unexpected = model.load_state_dict(weights, strict=False).unexpected_keys
    if unexpected:
        raise ValueError(f"weights {unexpected[:3]} are not the start model's parameters")
    return save_policy(model, tokenizer, out)


def em_by_question(folder: Path, ids: Sequence[str]) -> list[float]:
    """Per-question EM of an evaluation folder, in ``ids`` order."""
    rows = {r["id"]: float(r["em"]) for r in read_jsonl(folder / "predictions.jsonl")}
    missing = [q for q in ids if q not in rows]
    if missing:
        raise DataError(str(folder / "predictions.jsonl"), f"no prediction for {len(missing)} questions (first: {missing[0]})")
    return [rows[q] for q in ids]


def part_statistics(values: Sequence[float]) -> dict[str, float]:
    """Mean (points of EM), 95% CI and the one-sample t-test p-value of a per-question part."""
    scaled = [100 * v for v in values]
    mean, ci = mean_and_ci(scaled)
    p = paired_t_test(scaled, [0.0] * len(scaled)).p_value
    return {"mean": round(mean, 2), "ci95": round(ci, 2), "p": round(p, 4)}


def split_from_scores(
    base: Sequence[float], plus: Sequence[float], minus: Sequence[float], permuted: Sequence[Sequence[float]]
) -> dict[str, Any]:
    """The split of per-question EM (0/1 or fractions) into its parts, with statistics over questions.

    ``change``, ``linear`` and ``quadratic`` per question are :func:`second_order_split`'s, so they add
    up question by question; ``permuted_change`` is the mean over the permuted steps of their change."""
    n = len(base)
    if n < 2 or any(len(s) != n for s in (plus, minus, *permuted)):
        raise ValueError("split_from_scores needs the same number of questions (2 or more) in every evaluation")
    parts = [second_order_split(b, p, m) for b, p, m in zip(base, plus, minus, strict=True)]
    out: dict[str, Any] = {
        "questions": n,
        "em": {
            "start": round(100 * sum(base) / n, 2),
            "plus": round(100 * sum(plus) / n, 2),
            "minus": round(100 * sum(minus) / n, 2),
        },
    }
    for key in ("change", "linear", "quadratic"):
        out[key] = part_statistics([part[key] for part in parts])
    if permuted:
        changes = [sum(s[i] for s in permuted) / len(permuted) - base[i] for i in range(n)]
        out["em"]["permuted"] = [round(100 * sum(s) / n, 2) for s in permuted]
        out["permuted_change"] = part_statistics(changes)
    return out


def update_split(
    start: str,
    policy: str,
    data: str | Path,
    index: str,
    out: str | Path,
    config: Any,
    *,
    scales: Sequence[float] = (),
    permutations: int = 1,
    seed: int = 0,
    device: str | None = None,
) -> dict[str, Any]:
    """Write and evaluate the mirrored, permuted and scaled policies of ``policy``'s update from
    ``start`` (``config``: the evaluation's :class:`~prorag.evaluation.eval_config.EvalConfig`), and return
    (and write to ``OUT/split.json``) the split with its statistics over questions."""
    from prorag.data.records import read_records
    from prorag.evaluation.runner import evaluate_files
    from prorag.models.checkpoints import load_policy, resolve_policy_path

    if permutations < 0 or any(not 0 < s < 1 for s in scales):
        raise ValueError("update_split: permutations must be >= 0 and every scale in (0, 1)")
    out = Path(out)
    start, policy = resolve_policy_path(start), resolve_policy_path(policy)
    initial = read_weights(start)
    delta = update_delta(initial, read_weights(policy))
    policies: dict[str, str] = {"start": start, "plus": policy}
    steps: dict[str, dict[str, torch.Tensor]] = {"minus": apply_delta(initial, delta, -1.0)}
    for k in range(permutations):
        steps[f"permuted{k}"] = apply_delta(initial, permuted_delta(delta, torch.Generator().manual_seed(seed + k)))
    for scale in scales:
        steps[f"scale{scale:g}"] = apply_delta(initial, delta, scale)
    missing = {name: w for name, w in steps.items() if not (out / "policies" / name / "config.json").is_file()}
    if missing:  # a resumed run keeps what it wrote; the start model is loaded once for the rest
        model, tokenizer = load_policy(start)
        for name, weights in missing.items():
            write_policy_with_weights(model, tokenizer, weights, out / "policies" / name)
    policies.update({name: str(out / "policies" / name) for name in steps})
    records = read_records(data)
    ids = [r.id for r in (records[: config.limit] if config.limit is not None else records)]
    scores = {}
    for name, folder in policies.items():
        evaluate_files(folder, data, index, out / "eval" / name, config, device=device)
        scores[name] = em_by_question(out / "eval" / name, ids)
    result = {
        "start": start,
        "policy": policy,
        "data": str(data),
        "delta_rms": round(delta_rms(delta), 8),
        **split_from_scores(
            scores["start"], scores["plus"], scores["minus"], [scores[f"permuted{k}"] for k in range(permutations)]
        ),
        "scales": {f"{s:g}": round(100 * sum(scores[f"scale{s:g}"]) / len(ids), 2) for s in scales},
    }
    write_json(out / "split.json", result)
    return result
