"""Wall time of one RL step with process supervision (ProRAG) against outcome-only GRPO.

    OMP_NUM_THREADS=1 python benchmarks/rl_step.py [--questions 4] [--group 8] [--size tiny]
        [--repeats 3] [--threads N] [--sampled] [--prm-kind head|likelihood] [--out results.json]
        [--process-reward prm|cpsearch|... --advantage dual|cpgrpo|...] [--outcome-reward hiprag|p2s]
        [--packed [--packed-row-tokens N] [--packed-rows N]]

Both trainers (:class:`~prorag.stages.rl.ProcessSupervisedGRPOTrainer`, one with a PRM and
``beta = 0.3``, one with ``process_reward="none"``) train the same policy on the same questions
(``--questions`` x ``--group`` trajectories per step). A step is timed in its parts, the calls
TRL's training step makes:

* **generation**: the rollout engine writing the group's trajectories (retrieval included);
* **PRM scoring**: the PRM scoring every action of every trajectory (process supervision only);
* **scoring, other**: the rest of ``_generate_and_score_completions``: padding, the outcome
  reward, the advantages;
* **loss**: the forward pass for the log-probabilities, the PPO-clip loss and the backward;
* **optimizer**: AdamW's step and zeroing the gradients.

The policy is a random built-in model run at full cost whose choices are steered along the gold
trajectories (``benchmarks/rollout.py``'s :class:`SteeredModel`, greedy), so that trajectories
have a realistic shape: several actions, real retrieval blocks. ``--sampled`` samples at temperature
0.02 instead of taking the argmax: the steering margin (one logit, 50 after the temperature) makes
the sample the steered token all the same, so the trajectories are identical while every token
goes through the sampler the RL stage uses (per-row random streams), whose cost is then
included; without it decoding is greedy. The PRM is a real
:class:`~prorag.supervision.reward_model.ProcessRewardModel` on a backbone of the same size (as in the paper,
where the PRM is the policy's backbone), a scalar head by default; ``--prm-kind likelihood``
scores with the policy's own LM head (the demo's PRM). Each side is timed ``--repeats`` times, alternating, and
its best time kept; the ratio compares the two totals (target: process supervision adds < 25%).
``--process-reward cpsearch --advantage cpgrpo`` times CP-Search's rule-based reward (no PRM;
target < 1.3x) instead; any registered source and estimator can be named. ``--outcome-reward hiprag``
times HiPRAG: outcome-only GRPO with HiPRAG's reward in place of Eq. 6, whose cost is the re-ask of every
search step's sub-query to the policy with no documents, in "scoring, other" (target < 1.3x).
``--outcome-reward p2s`` times P2S at its worst case: the rows' gold answers are replaced by one no
trajectory reaches, so every group is unsolved and every trajectory gets the path-faithfulness reward
(K gold-path candidates steered along the gold trajectories, the answer and suffix likelihood passes),
in "scoring, other"; the rows of a group are identical here, so identical passes are computed once
and the number of passes asked and computed is printed (a batch of distinct rows computes all).
``--packed`` times the process side alone, its scoring padded (as TRL pads) against packed
(``rl.packed_scoring``, rows of ``--packed-row-tokens``), and prints the batch's padding share and
packed over padded for the forwards packing changes (``kl_to_init``, the loss) and for the whole step;
``--packed-rows N`` adds both again with ``rl.scoring_rows`` N.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from machine import machine_name  # benchmarks/machine.py, beside this file
from rollout import GoldScript, SteeredModel  # benchmarks/rollout.py, beside this file

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.core.kernels import training_attention
from prorag.data.records import read_passages, read_records
from prorag.data.world import build_world
from prorag.models.checkpoints import save_policy
from prorag.models.packing import pack_layout, padding_share
from prorag.models.tiny import make_tiny_model
from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages import rl
from prorag.stages.rl import RLConfig, make_rl_trainer
from prorag.supervision.reward_model import ProcessRewardModel, reward_model_from_policy

PARTS = ("generation", "prm", "scoring_other", "loss", "optimizer")


def time_step(
    trainer: Any,
    rows: list[dict[str, Any]],
    optimizer: torch.optim.Optimizer,
    part_end: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """One training step of ``trainer`` on the generation batch ``rows``, timed by part.
    ``part_end(name)`` runs as each of ``"scoring"``, ``"loss"`` and ``"optimizer"`` ends, before its
    clock is read: on a GPU it synchronises (the parts' kernels run asynchronously) and can read the
    part's peak memory."""
    end = part_end or (lambda _: None)
    trainer.model.train()
    kl_seconds = [0.0]
    log_kl = getattr(trainer, "_log_kl_to_init", None)

    def timed_kl(*args: Any, **kwargs: Any) -> None:  # pi_init's forward, inside "scoring, other"
        start = time.perf_counter()
        log_kl(*args, **kwargs)
        kl_seconds[0] += time.perf_counter() - start

    if log_kl is not None:
        trainer._log_kl_to_init = timed_kl
    t0 = time.perf_counter()
    try:
        batch = trainer._generate_and_score_completions([dict(r) for r in rows])
    finally:
        if log_kl is not None:
            del trainer._log_kl_to_init  # the instance attribute: the class's method again
    end("scoring")
    t1 = time.perf_counter()
    # The loss's forward and backward under the attention kernels the trainer's own training_step
    # gives them (TrainerKernels): with gradient checkpointing the backward recomputes forwards,
    # which must pick the same kernels as the forward did.
    with training_attention(getattr(trainer, "cudnn_attention", True)):
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
    end("loss")
    t2 = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    end("optimizer")
    t3 = time.perf_counter()
    generation = trainer.rollout_func.seconds
    prm = trainer._metrics["train"]["time/prm_seconds"][-1] if trainer.scorer is not None else 0.0
    return {
        "generation": generation,
        "prm": prm,
        "scoring_other": (t1 - t0) - generation - prm,
        "loss": t2 - t1,
        "optimizer": t3 - t2,
        "total": t3 - t0,
        "kl_to_init": kl_seconds[0],
        "positions": batch["prompt_mask"].numel() + batch["completion_mask"].numel(),
        "tokens": int(batch["completion_mask"].sum()),
        "sequence_tokens": int(batch["prompt_mask"].sum() + batch["completion_mask"].sum()),
        "model_tokens": int((batch["completion_mask"] * batch["tool_mask"]).sum()),
    }


#: A gold answer no trajectory reaches (``--outcome-reward p2s``: every group unsolved).
UNREACHABLE = "Nobody Knows"


def steer_p2s_synthesis(
    config: RLConfig, tokenizer: Any, golds: list[Any], steered: Any, retriever: Any, passes: list[int]
) -> None:
    """P2S's synthesis writes the gold trajectories too (its hinted prompts join the steering
    script, the engine it builds runs the steered model and searches ``retriever``), and its
    likelihood passes are counted in ``passes`` (asked, distinct)."""
    from prorag.agent.prompts import prompt_token_ids
    from prorag.supervision import p2s

    hint = config.outcome_reward.p2s.hint
    config.outcome_reward.p2s.synthesis.temperature = 0.02  # sampled, cold enough to follow the steering
    targets = {}
    for g in golds:
        completion = tokenize_segments(tokenizer, g.segments)[0]
        targets[tuple(prompt_token_ids(tokenizer, g.question))] = completion
        targets[tuple(prompt_token_ids(tokenizer, hint.format(question=g.question, answer=UNREACHABLE)))] = completion
    steered.script = GoldScript(targets, tokenizer.eos_token_id)
    real_engine, real_logprobs = p2s.RolloutEngine, p2s.sequence_logprobs
    p2s.RolloutEngine = lambda model, tok, _, *a, **k: real_engine(steered, tok, retriever, *a, **k)

    def counted(model: Any, items: Any, *a: Any, **k: Any) -> list[float]:
        passes[0] += len(items)
        passes[1] += len({(tuple(c), tuple(t), tuple(w)) for c, t, w in items})
        return real_logprobs(model, items, *a, **k)

    p2s.sequence_logprobs = counted


def base_config(args: argparse.Namespace) -> RLConfig:
    """The RL settings both sides share: one step of ``--questions`` x ``--group`` trajectories."""
    return RLConfig(
        group_size=args.group,
        per_device_batch_size=args.group * args.questions,
        rollout=RolloutConfig(max_actions=11, max_action_tokens=64, batch_size=args.group * args.questions),
        learning_rate=1e-5,
        max_steps=1,
    )


def build_sides(
    args: argparse.Namespace, tmp: str
) -> tuple[dict[str, Any], dict[int, torch.optim.Optimizer], list[dict[str, Any]], Any, bool]:
    """The two trainers (``process``, ``outcome``) on one steered tiny policy in ``tmp``, their
    optimisers (lr 0), the generation batch's rows, the policy, and whether the process side has a PRM."""
    build_world(tmp, seed=0, size="demo")
    tokenizer = train_world_tokenizer(world_tokenizer_texts(tmp))
    retriever = BM25Retriever(read_passages(Path(tmp) / "corpus.jsonl"))
    records = read_records(Path(tmp) / "train.jsonl")[: args.questions]
    policy = make_tiny_model(tokenizer, size=args.size, seed=0)
    save_policy(policy, tokenizer, Path(tmp) / "policy")
    kind = args.prm_kind
    proc_cfg = replace(base_config(args), process_reward=args.process_reward, advantage=args.advantage)
    if args.outcome_reward:  # HiPRAG-style: a trajectory-level reward on outcome-only GRPO, no step term
        form = replace(proc_cfg.outcome_reward, form=args.outcome_reward)
        proc_cfg = replace(proc_cfg, process_reward="none", advantage="grpo", outcome_reward=form)
    prm_side = proc_cfg.process_reward in ("prm", "shuffled")
    if proc_cfg.process_reward == "none":
        prm = None
    elif prm_side:
        prm: Any = ProcessRewardModel(*reward_model_from_policy(Path(tmp) / "policy", kind=kind), kind=kind)
    else:  # a source that needs no PRM (cpsearch, oracle): built by name
        prm = rl.STEP_REWARD_SOURCES.get(args.process_reward)(proc_cfg)

    golds = render_gold(records, retriever, k=3)
    probe = RolloutEngine(policy, tokenizer, retriever)
    script = GoldScript(
        {tuple(probe.prompt_ids(g.question)): tokenize_segments(tokenizer, g.segments)[0] for g in golds},
        tokenizer.eos_token_id,
    )
    steered = SteeredModel(policy, script)
    rl.rollouts.unwrap_model_for_generation = lambda *a, **k: contextlib.nullcontext(steered)  # rollouts follow the gold

    sides = {
        "process": make_rl_trainer(proc_cfg, Path(tmp) / "process", policy, tokenizer, records, retriever, prm),
        "outcome": make_rl_trainer(
            replace(base_config(args), process_reward="none", advantage="grpo"),
            Path(tmp) / "outcome",
            policy,
            tokenizer,
            records,
            retriever,
        ),
    }
    optimizers = {}
    for trainer in sides.values():
        # Steering is argmax steering: greedy, or sampling cold enough to pick the argmax.
        sampling = dict(greedy=False, temperature=0.02) if args.sampled else dict(greedy=True)
        trainer.rollout_func.config = replace(trainer.rollout_func.config, **sampling)
        trainer.current_gradient_accumulation_steps = 1
        optimizers[id(trainer)] = torch.optim.AdamW(policy.parameters(), lr=0.0)  # lr 0: every step sees the same model
    rows = [dict(sides["process"].train_dataset[i]) for i in range(len(records)) for _ in range(args.group)]
    passes = [0, 0]  # likelihood passes asked, distinct (P2S)
    if args.outcome_reward == "p2s":
        steer_p2s_synthesis(proc_cfg, tokenizer, golds, steered, retriever, passes)
        rows = [r | {"golden_answers": [UNREACHABLE]} for r in rows]

    return sides, optimizers, rows, policy, prm_side, passes


def parser() -> argparse.ArgumentParser:
    """The benchmark's options (also those of ``rl_step_profile.py``)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=4, help="questions per step")
    ap.add_argument("--group", type=int, default=8, help="G, trajectories per question")
    ap.add_argument("--size", default="tiny", choices=("tiny", "small"))
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per side (best kept)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sampled", action="store_true", help="sample (temperature 0.02) instead of greedy decoding")
    ap.add_argument(
        "--prm-kind", default="head", choices=("head", "likelihood"), help="the PRM's kind (the demo uses likelihood)"
    )
    ap.add_argument("--process-reward", default="prm", help="the process side's step-reward source (STEP_REWARD_SOURCES)")
    ap.add_argument("--advantage", default="dual", help="the process side's advantage estimator (ADVANTAGE_ESTIMATORS)")
    ap.add_argument(
        "--outcome-reward", default=None, help="time this outcome reward (OUTCOME_REWARDS, e.g. hiprag) instead of a step reward"
    )
    ap.add_argument(
        "--packed",
        action="store_true",
        help="time the process side with padded against packed scoring (rl.packed_scoring) instead of against outcome-only GRPO",
    )
    ap.add_argument("--packed-row-tokens", type=int, default=None, help="rl.packed_row_tokens of the packed side")
    ap.add_argument(
        "--packed-rows", type=int, default=None, help="with --packed: both sides again with rl.scoring_rows of this many rows"
    )
    ap.add_argument("--out", type=Path, default=None)
    return ap


#: The parts of ``--packed``'s table: pi_init's forward (``kl_to_init``) apart from the rest of the scoring.
PACKED_PARTS = ("generation", "prm", "scoring_other", "kl_to_init", "loss", "optimizer")


def packed_against_padded(args: argparse.Namespace) -> None:
    """``--packed``: the process side's step with padded scoring against packed scoring (the same
    trainer, batch and weights, alternating, best of ``--repeats`` each); the forwards packing changes
    are ``kl_to_init`` (pi_init's) and the loss's forward and backward. With ``--packed-rows N`` both
    are timed again with ``rl.scoring_rows`` N (rows in length groups cut to their span; packed rows
    fullest first, each forward cut to its fullest row)."""
    with tempfile.TemporaryDirectory() as tmp:
        sides, optimizers, rows, policy, prm_side, _ = build_sides(args, tmp)
        trainer = sides["process"]
        optimizer = optimizers[id(trainer)]
        base = replace(trainer.rl_config, packed_row_tokens=args.packed_row_tokens)
        configs = {"padded": replace(base, packed_scoring=False), "packed": replace(base, packed_scoring=True)}
        if args.packed_rows:
            configs |= {
                f"padded, rows of {args.packed_rows}": replace(base, packed_scoring=False, scoring_rows=args.packed_rows),
                f"packed, rows of {args.packed_rows}": replace(base, packed_scoring=True, scoring_rows=args.packed_rows),
            }
        best: dict[str, dict[str, float]] = {}
        for config in configs.values():  # warm-up
            trainer.rl_config = config
            time_step(trainer, rows, optimizer)
        for _ in range(args.repeats):
            for name, config in configs.items():
                trainer.rl_config = config
                t = time_step(trainer, rows, optimizer)
                t["scoring_other"] -= t["kl_to_init"]
                t["forwards"] = t["kl_to_init"] + t["loss"]
                if name not in best or t["total"] < best[name]["total"]:
                    best[name] = t
        batch = trainer._generate_and_score_completions([dict(r) for r in rows])
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    layout = pack_layout(attention, args.packed_row_tokens)
    share = padding_share(attention)
    first = best["padded"]
    print(
        f"{args.size} policy ({sum(p.numel() for p in policy.parameters()):,} parameters), {len(rows)} trajectories, "
        f"padded batch {tuple(attention.shape)}: {first['sequence_tokens']} real positions of {first['positions']} "
        f"({share:.1%} padding); packed: {tuple(layout.source.shape)} = {layout.source.numel()} slots "
        f"(rows of {args.packed_row_tokens or attention.shape[1]} tokens), {torch.get_num_threads()} torch thread(s), "
        f"best of {args.repeats}, on {machine_name()}"
    )
    print(f"{'part':<16}" + "".join(f"{name + ' (s)':>24}{'share':>7}" for name in configs))
    for part in (*PACKED_PARTS, "total"):
        cells = "".join(
            f"{best[name][part]:>24.3f}" + (f"{best[name][part] / best[name]['total']:>7.1%}" if part != "total" else " " * 7)
            for name in configs
        )
        print(f"{part:<16}{cells}")
    ratios = {}
    for padded_name, packed_name in zip(list(configs)[::2], list(configs)[1::2], strict=True):
        padded, packed = best[padded_name], best[packed_name]
        forwards, step = packed["forwards"] / padded["forwards"], packed["total"] / padded["total"]
        ratios[packed_name] = {"forwards_ratio": forwards, "step_ratio": step}
        print(
            f"{packed_name} / {padded_name}: scoring forwards (kl_to_init + loss) {forwards:.3f}x ({1 / forwards:.2f}x "
            f"faster; target >= 1.3x faster: {'met' if 1 / forwards >= 1.3 else 'NOT met'}), whole step {step:.3f}x, "
            f"at {share:.1%} padding"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "steps": best,
                    "ratios": ratios,
                    "padding_share": share,
                    "packed_slots": layout.source.numel(),
                    "machine": machine_name(),
                    "args": vars(args) | {"out": str(args.out)},
                },
                indent=2,
            )
        )


def main() -> None:
    args = parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    logging.getLogger("transformers").setLevel(logging.ERROR)

    if args.packed:
        packed_against_padded(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        sides, optimizers, rows, policy, prm_side, passes = build_sides(args, tmp)
        best: dict[str, dict[str, float]] = {}
        for trainer in sides.values():
            time_step(trainer, rows, optimizers[id(trainer)])  # warm-up
        for _ in range(args.repeats):
            for name, trainer in sides.items():
                t = time_step(trainer, rows, optimizers[id(trainer)])
                if name not in best or t["total"] < best[name]["total"]:
                    best[name] = t

    proc, out = best["process"], best["outcome"]
    ratio = proc["total"] / out["total"]
    n = args.questions * args.group
    print(
        f"{args.size} policy ({sum(p.numel() for p in policy.parameters()):,} parameters) and {'a PRM of its backbone' if prm_side else (args.outcome_reward or args.process_reward) + ' rewards'}, "
        f"{args.questions} questions x G={args.group} = {n} trajectories, {proc['model_tokens']} model tokens "
        f"of {proc['tokens']} completion tokens, {torch.get_num_threads()} torch thread(s), best of {args.repeats}, "
        f"{'sampled' if args.sampled else 'greedy'} decoding, on {machine_name()}"
    )
    print(f"{'part':<16}{'process (s)':>12}{'share':>8}{'outcome (s)':>13}{'share':>8}")
    for part in PARTS:
        print(
            f"{part:<16}{proc[part]:>12.3f}{proc[part] / proc['total']:>8.1%}{out[part]:>13.3f}{out[part] / out['total']:>8.1%}"
        )
    print(f"{'total':<16}{proc['total']:>12.3f}{'':>8}{out['total']:>13.3f}")
    target = 1.25 if prm_side else 1.3
    label = (
        f"outcome reward {args.outcome_reward}"
        if args.outcome_reward
        else f"process supervision ({args.process_reward}, {args.advantage})"
    )
    print(f"{label} / outcome-only GRPO: {ratio:.3f}x (target < {target}x: {'met' if ratio < target else 'NOT met'})")
    if args.outcome_reward == "p2s":
        print(f"P2S likelihood passes over all timed steps: {passes[0]} asked, {passes[1]} distinct computed")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "process": proc,
                    "outcome": out,
                    "ratio": ratio,
                    "machine": machine_name(),
                    "args": vars(args) | {"out": str(args.out)},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
