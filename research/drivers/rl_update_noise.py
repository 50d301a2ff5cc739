"""RL runs' weight updates: a direction, or a random walk? Their agreement across seeds, their Adam
state against pure noise's, and what the update buys to first and to second order.

    python -m research.drivers.rl_update_noise RUN --runs outcome-grpo-s0 outcome-grpo-s1 prm-first-error-signed-s0 \\
        --jobs 2 --out results/X.json

RUN is a pipeline run folder whose ``probes/NAME/`` RL runs started from ``policies/rft/policy``
(``research/drivers/rl_seed_runs.sh``) and whose seen/unseen evaluations exist
(``research/drivers/rl_seen_unseen.py``: ``probes/seen_unseen/``). For each named run, with ``delta`` its
last checkpoint minus pi_rft (:mod:`research.analysis.update_noise`):

- the update's RMS, the cosine between every two runs' updates (same seed: the same questions in the
  same order and the same first samples; other seeds: the same questions, other orders and samples),
  and the mean ``|m_hat| / sqrt(v_hat)`` of its last Adam state beside a pure-noise gradient's;
- greedy EM of pi_rft ``- delta`` (the mirrored update) and of pi_rft ``+ permuted delta`` (each
  tensor's entries shuffled: the same step sizes in no direction) on ``seen`` (the questions the runs
  trained on), ``unseen`` (the next questions of the same worlds) and ``test``; with the run's own EM
  (``+ delta``, already evaluated) that splits each change into a linear part (learning) and a
  quadratic part (drift).

Perturbed policies are written to ``probes/update_noise/NAME-minus`` and ``NAME-permK`` and
evaluated there (``prorag eval --max-actions 11``, one torch thread each, ``--jobs`` at a time); what
exists is kept.
"""

from __future__ import annotations

import argparse
import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from prorag.data.jsonl import read_jsonl
from research.analysis.results_file import write_results
from research.analysis.run_folder import WEIGHTS, evaluate, last_checkpoint, last_weights, write_policy
from research.analysis.scores import evaluation, percent, pooled
from research.analysis.update_noise import (
    adam_noise_ratio,
    adam_signal_ratio,
    apply_delta,
    delta_cosine,
    delta_rms,
    permuted_delta,
    second_order_split,
    update_delta,
)
from research.drivers.rl_seen_unseen import SETS


def adam_state(checkpoint: Path) -> dict[str, Any] | None:
    """Mean ``|m_hat| / sqrt(v_hat)`` of a checkpoint's AdamW state and the pure-noise level at its
    step, or None without ``optimizer.pt``. The file is the run's own (written by the Trainer) and is
    read with ``weights_only=True``: tensors and plain containers only."""
    path = checkpoint / "optimizer.pt"
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    group = state["param_groups"][0]
    entries = list(state["state"].values())
    step = int(float(entries[0]["step"]))
    betas = tuple(group["betas"])
    ratio = adam_signal_ratio(((s["exp_avg"], s["exp_avg_sq"]) for s in entries), step, betas, group["eps"])
    return {"step": step, "mean_abs_m_over_sqrt_v": round(ratio, 4), "pure_noise": round(adam_noise_ratio(betas[0], step), 4)}


def em_string(folder: Path, ids: list[str]) -> str:
    return evaluation(folder, ids)["em_by_question"]


def collect(run: Path, names: list[str], permutations: int, jobs: int) -> dict[str, Any]:
    folder = run / "probes" / "update_noise"
    seen_unseen = run / "probes" / "seen_unseen"
    files = {"seen": seen_unseen / "seen.jsonl", "unseen": seen_unseen / "unseen.jsonl", "test": run / "splits" / "test.jsonl"}
    for path in files.values():
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (run research/drivers/rl_seen_unseen.py on {run} first)")
    ids = {s: [r["id"] for r in read_jsonl(files[s])] for s in SETS}
    base_policy = run / "policies" / "rft" / "policy"
    initial = load_file(str(base_policy / WEIGHTS))
    checkpoints = {name: last_checkpoint(run / "probes" / name) for name in names}  # the optimiser's state
    finals = {name: last_weights(run / "probes" / name) for name in names}  # the merged weights of a LoRA run
    deltas = {name: update_delta(initial, load_file(str(path / WEIGHTS))) for name, path in finals.items()}

    policies: dict[str, Path] = {}
    for name, delta in deltas.items():
        policies[f"{name}-minus"] = write_policy(base_policy, apply_delta(initial, delta, -1.0), folder / f"{name}-minus")
        for k in range(permutations):
            generator = torch.Generator().manual_seed(k)
            shuffled = permuted_delta(delta, generator)
            policies[f"{name}-perm{k}"] = write_policy(base_policy, apply_delta(initial, shuffled), folder / f"{name}-perm{k}")
    tasks = [(p, s) for p in policies for s in SETS]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda t: evaluate(run, policies[t[0]], files[t[1]], folder / f"{t[0]}-{t[1]}"), tasks))

    base = {
        "seen": em_string(seen_unseen / "pi_rft-seen", ids["seen"]),
        "unseen": em_string(seen_unseen / "pi_rft-unseen", ids["unseen"]),
        "test": em_string(run / "eval" / "rft", ids["test"]),
    }
    runs: dict[str, Any] = {}
    for name in names:
        plus = {
            "seen": em_string(seen_unseen / f"{name}-seen", ids["seen"]),
            "unseen": em_string(seen_unseen / f"{name}-unseen", ids["unseen"]),
            "test": em_string(run / "probes" / f"test-{name}-last", ids["test"]),
        }
        row: dict[str, Any] = {
            "checkpoint": checkpoints[name].name,
            "delta_rms": round(delta_rms(deltas[name]), 6),
            "adam": adam_state(checkpoints[name]),
        }
        for s in SETS:
            minus = percent(em_string(folder / f"{name}-minus-{s}", ids[s]))
            perms = [percent(em_string(folder / f"{name}-perm{k}-{s}", ids[s])) for k in range(permutations)]
            split = second_order_split(percent(base[s]), percent(plus[s]), minus)
            row[s] = {
                "plus": round(percent(plus[s]), 2),
                "minus": round(minus, 2),
                "permuted": [round(p, 2) for p in perms],
                **{k: round(v, 2) for k, v in split.items()},
                "permuted_change": round(sum(perms) / len(perms) - percent(base[s]), 2) if perms else None,
            }
        runs[name] = row
    cosines = {f"{a} {b}": round(delta_cosine(deltas[a], deltas[b]), 4) for a, b in itertools.combinations(names, 2)}

    def seed(name: str) -> str:
        return name.rsplit("-s", 1)[1]

    same = [v for k, v in cosines.items() if seed(k.split()[0]) == seed(k.split()[1])]
    other = [v for k, v in cosines.items() if seed(k.split()[0]) != seed(k.split()[1])]
    summary: dict[str, Any] = {"runs": len(names)}
    for s in SETS:
        for part in ("change", "linear", "quadratic", "permuted_change"):
            stats = pooled([r[s][part] for r in runs.values() if r[s][part] is not None])
            if stats is not None:
                summary[f"{s}_{part}"] = stats
    summary["cosine_same_seed"] = round(sum(same) / len(same), 4) if same else None
    summary["cosine_other_seeds"] = round(sum(other) / len(other), 4) if other else None
    return {
        "pi_rft": {s: round(percent(base[s]), 2) for s in SETS},
        "sets": {s: {"file": str(files[s]), "n": len(ids[s])} for s in SETS},
        "runs": runs,
        "cosines": cosines,
        "summary": summary,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the pipeline run folder (its probes/ holds the RL runs)")
    parser.add_argument("--runs", nargs="+", required=True, help="RL run folders under probes/, e.g. outcome-grpo-s0")
    parser.add_argument("--permutations", type=int, default=1, help="shuffled-update controls per run")
    parser.add_argument("--jobs", type=int, default=1, help="evaluations at a time (one torch thread each)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.jobs < 1 or args.permutations < 0:
        parser.error("--jobs must be >= 1 and --permutations >= 0")
    bad = [n for n in args.runs if "-s" not in n or not n.rsplit("-s", 1)[1].isdigit()]
    if bad:
        parser.error(f"--runs: expected ARM-sSEED names, got {bad}")
    body = collect(args.run, args.runs, args.permutations, args.jobs)
    write_results(args.out, body)
    print("pi_rft EM: " + ", ".join(f"{s} {v:.2f}" for s, v in body["pi_rft"].items()))
    for name, r in body["runs"].items():
        adam = r["adam"] or {}
        print(
            f"{name}: delta rms {r['delta_rms']:.2e}, Adam |m|/sqrt(v) {adam.get('mean_abs_m_over_sqrt_v')} "
            f"(noise {adam.get('pure_noise')})"
        )
        for s in SETS:
            x = r[s]
            print(
                f"  {s:6s} +d {x['plus']:6.2f} -d {x['minus']:6.2f} perm {x['permuted']}  change {x['change']:+.2f} = "
                f"linear {x['linear']:+.2f} + quadratic {x['quadratic']:+.2f}; permuted {x['permuted_change']}"
            )
    for k, v in body["summary"].items():
        print(f"{k}: {v}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
