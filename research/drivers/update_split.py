"""Split a trained policy's change of EM into what its update's direction buys (first order) and what
a step of its size costs either way (second order), from greedy evaluations of start, start + update,
start - update and start + the update with each tensor's entries shuffled
(:mod:`research.analysis.update_split`).

    python -m research.drivers.update_split --start RUN/policies/rft/policy --policy RUN/probes/X-s0/policy \\
        --data RUN/splits/test.jsonl --index RUN/index --out OUT [--scale 0.5] [--permutations 1] [--limit N]

OUT gets policies/, eval/ and split.json; a rerun resumes.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from prorag.evaluation.eval_config import EvalConfig
from research.analysis.update_split import update_split


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", required=True, help="the policy training started from (e.g. pi_rft: RUN/policies/rft/policy)")
    parser.add_argument("--policy", required=True, help="the trained policy (a checkpoint folder or a run's merged policy/)")
    parser.add_argument("--data", type=Path, required=True, help="record file to evaluate on (held-out questions)")
    parser.add_argument("--index", "-i", required=True, help="index folder or http(s):// URL of a retrieval server")
    parser.add_argument("--out", "-o", type=Path, required=True, help="folder: policies/, eval/ and split.json (resumes)")
    parser.add_argument(
        "--scale", type=float, action="append", default=[], help="also start + SCALE x the update (0 < SCALE < 1)"
    )
    parser.add_argument("--permutations", type=int, default=1, help="permuted-update controls (each tensor's entries shuffled)")
    parser.add_argument("--max-actions", type=int, default=13, help="actions per trajectory (RL's dev evaluation uses 11)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N records")
    parser.add_argument("--seed", type=int, default=0, help="seed of the permutations")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: the model's)")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 2:
        parser.error(f"--limit must be >= 2 (a split over questions needs two), got {args.limit}")
    base = EvalConfig()
    config = replace(base, limit=args.limit, rollout=replace(base.rollout, max_actions=args.max_actions))
    result = update_split(
        args.start,
        args.policy,
        args.data,
        args.index,
        args.out,
        config,
        scales=args.scale,
        permutations=args.permutations,
        seed=args.seed,
        device=args.device,
    )
    em = result["em"]
    print(f"EM start {em['start']:.2f}, +update {em['plus']:.2f}, -update {em['minus']:.2f}, permuted {em.get('permuted')}")
    for key in ("change", "linear", "quadratic", "permuted_change"):
        if key in result:
            r = result[key]
            print(f"{key:>16}: {r['mean']:+.2f} ± {r['ci95']:.2f} EM (p {r['p']:.4f}, {result['questions']} questions)")
    for s, value in result["scales"].items():
        print(f"{'scale ' + s:>16}: {value:.2f} EM")
    print(f"-> {args.out}/split.json")


if __name__ == "__main__":
    main()
