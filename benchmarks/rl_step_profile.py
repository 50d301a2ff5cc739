"""One RL step's split, and the policy-token scoring against TRL's every-position scoring, in one process.

    OMP_NUM_THREADS=2 python benchmarks/rl_step_profile.py [--threads 2] [--repeats 3] [rl_step.py's options]

Builds ``rl_step.py``'s process-supervision trainer (tiny policy steered along gold trajectories,
a PRM of its backbone), generates and scores one batch (generation, PRM scoring, the rest of the
scoring), then times, alternately ``--repeats`` times and keeping each side's best, the parts the
log-probabilities feed: ``kl_to_init`` (the frozen initial policy's no-grad forward), the loss
forward + backward, and the optimiser step, three ways:

* **TRL path**: ``compact_logps`` off (TRL 1.16's CPU path: every completion position, retrieved
  tokens and padding included, through the LM head), the micro-batch in one forward;
* **compact**: only the policy's tokens through the LM head, the micro-batch in one forward
  (``scoring_rows: null``);
* **compact, length groups**: the same in groups of ``--scoring-rows`` rows of similar length, each
  cut to its rows' span (``ProcessSupervisedGRPOTrainer``'s default).

Prints the splits and the ratios against the TRL path and against compact.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from typing import Any

import torch
from machine import machine_name  # benchmarks/machine.py, beside this file
from rl_step import build_sides, parser  # benchmarks/rl_step.py, beside this file


def timed_parts(
    trainer: Any, batch: dict[str, Any], optimizer: torch.optim.Optimizer, compact: bool, scoring_rows: int | None
) -> dict[str, float]:
    """``kl_to_init``'s forward, the loss forward + backward and the optimiser step on ``batch``."""
    trainer.compact_logps = compact
    trainer.rl_config = replace(trainer.rl_config, scoring_rows=scoring_rows)
    mask = batch["completion_mask"] * batch["tool_mask"]
    t0 = time.perf_counter()
    with trainer._scoring(mask):
        trainer._init_logps(batch)
    t1 = time.perf_counter()
    loss = trainer.compute_loss(trainer.model, dict(batch))
    loss.backward()
    t2 = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    return {"kl_to_init": t1 - t0, "loss": t2 - t1, "optimizer": t3 - t2}


def main() -> None:
    ap = parser()
    ap.add_argument("--scoring-rows", type=int, default=8, help="rows per forward of the length-grouped side")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = {"TRL path": (False, None), "compact": (True, None), "compact, length groups": (True, args.scoring_rows)}
    with tempfile.TemporaryDirectory() as tmp:
        sides, optimizers, rows, policy, *_ = build_sides(args, tmp)
        trainer = sides["process"]
        optimizer = optimizers[id(trainer)]
        trainer.model.train()
        trainer.rl_config = replace(trainer.rl_config, scoring_rows=None)
        t0 = time.perf_counter()
        batch = trainer._generate_and_score_completions([dict(r) for r in rows])
        scoring = time.perf_counter() - t0
        generation = trainer.rollout_func.seconds
        prm = trainer._metrics["train"]["time/prm_seconds"][-1] if trainer.scorer is not None else 0.0
        best: dict[str, dict[str, float]] = {}
        timed_parts(trainer, batch, optimizer, True, None)  # warm-up
        for _ in range(args.repeats):
            for name, (compact, scoring_rows) in variants.items():
                t = timed_parts(trainer, batch, optimizer, compact, scoring_rows)
                t["sum"] = sum(t.values())
                if name not in best or t["sum"] < best[name]["sum"]:
                    best[name] = t
        kl_in_scoring = best["compact"]["kl_to_init"]  # the batch above was scored on the compact path
    shared = {"generation": generation, "prm": prm, "scoring_other": scoring - generation - prm - kl_in_scoring}
    mask = batch["completion_mask"] * batch["tool_mask"]
    real = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    print(
        f"{args.size} policy, {len(rows)} trajectories, completion {tuple(mask.shape)}: {int(mask.sum())} policy tokens of "
        f"{int(batch['completion_mask'].sum())} completion tokens, {int(real.sum())} real positions of {real.numel()} "
        f"({1 - real.float().mean():.0%} padding), {torch.get_num_threads()} torch thread(s), best of {args.repeats}, "
        f"on {machine_name()}"
    )
    totals = {name: sum(shared.values()) + best[name]["sum"] for name in variants}
    print(f"{'part':<16}" + "".join(f"{name + ' (s)':>28}{'share':>8}" for name in variants))
    for part in (*shared, "kl_to_init", "loss", "optimizer"):
        cells = [shared.get(part, best[name].get(part, 0.0)) for name in variants]
        print(f"{part:<16}" + "".join(f"{c:>28.3f}{c / totals[name]:>8.1%}" for c, name in zip(cells, variants, strict=True)))
    print(f"{'total':<16}" + "".join(f"{totals[name]:>28.3f}{'':>8}" for name in variants))
    ref, compact, grouped = (best[name]["sum"] for name in variants)
    print(
        f"kl_to_init + loss + optimizer: compact / TRL path {compact / ref:.3f}x, length groups / compact "
        f"{grouped / compact:.3f}x, length groups / TRL path {grouped / ref:.3f}x; whole step, length groups / TRL path: "
        f"{totals['compact, length groups'] / totals['TRL path']:.3f}x"
    )


if __name__ == "__main__":
    main()
