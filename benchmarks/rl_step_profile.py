"""One RL step's split, and the policy-token scoring against TRL's every-position scoring, in one process.

    OMP_NUM_THREADS=2 python benchmarks/rl_step_profile.py [--threads 2] [--repeats 3] [rl_step.py's options]

Builds ``rl_step.py``'s process-supervision trainer (tiny policy steered along gold trajectories,
a PRM of its backbone), generates and scores one batch (generation, PRM scoring, the rest of the
scoring), then times, alternately ``--repeats`` times and keeping each side's best, the parts the
log-probabilities feed: ``kl_to_init`` (the frozen initial policy's no-grad forward), the loss
forward + backward, and the optimiser step, with ``compact_logps`` on (only the policy's tokens through
the LM head: ProcessSupervisedGRPOTrainer's default) and off (TRL 1.16's CPU path: every completion
position, retrieved tokens and padding included). Prints both splits and the step's ratio.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch
from rl_step import build_sides, parser  # benchmarks/rl_step.py, beside this file


def timed_parts(trainer: Any, batch: dict[str, Any], optimizer: torch.optim.Optimizer, compact: bool) -> dict[str, float]:
    """``kl_to_init``'s forward, the loss forward + backward and the optimiser step on ``batch``."""
    trainer.compact_logps = compact
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
    args = parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        sides, optimizers, rows, policy, *_ = build_sides(args, tmp)
        trainer = sides["process"]
        optimizer = optimizers[id(trainer)]
        trainer.model.train()
        t0 = time.perf_counter()
        batch = trainer._generate_and_score_completions([dict(r) for r in rows])
        scoring = time.perf_counter() - t0
        generation = trainer.rollout_func.seconds
        prm = trainer._metrics["train"]["time/prm_seconds"][-1] if trainer.scorer is not None else 0.0
        best: dict[bool, dict[str, float]] = {}
        timed_parts(trainer, batch, optimizer, True)  # warm-up
        for _ in range(args.repeats):
            for compact in (False, True):
                t = timed_parts(trainer, batch, optimizer, compact)
                t["sum"] = sum(t.values())
                if compact not in best or t["sum"] < best[compact]["sum"]:
                    best[compact] = t
        kl_in_scoring = best[True]["kl_to_init"]  # the batch above was scored on the compact path
    shared = {"generation": generation, "prm": prm, "scoring_other": scoring - generation - prm - kl_in_scoring}
    mask = batch["completion_mask"] * batch["tool_mask"]
    print(
        f"{args.size} policy, {len(rows)} trajectories, completion {tuple(mask.shape)}: {int(mask.sum())} policy tokens of "
        f"{int(batch['completion_mask'].sum())} completion tokens, {torch.get_num_threads()} torch thread(s), best of {args.repeats}"
    )
    print(f"{'part':<16}{'TRL path (s)':>13}{'share':>8}{'compact (s)':>13}{'share':>8}{'ratio':>8}")
    totals = {c: sum(shared.values()) + best[c]["sum"] for c in (False, True)}
    for part in (*shared, "kl_to_init", "loss", "optimizer"):
        old, new = shared.get(part, best[False].get(part, 0.0)), shared.get(part, best[True].get(part, 0.0))
        print(
            f"{part:<16}{old:>13.3f}{old / totals[False]:>8.1%}{new:>13.3f}{new / totals[True]:>8.1%}{new / max(old, 1e-9):>8.3f}"
        )
    print(f"{'total':<16}{totals[False]:>13.3f}{'':>8}{totals[True]:>13.3f}{'':>8}{totals[True] / totals[False]:>8.3f}")
    print(
        f"kl_to_init + loss + optimizer, compact / TRL path: {best[True]['sum'] / best[False]['sum']:.3f}x; "
        f"whole step: {totals[True] / totals[False]:.3f}x"
    )


if __name__ == "__main__":
    main()
