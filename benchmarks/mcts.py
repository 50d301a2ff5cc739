"""Tree-search throughput: batched expansion (many trees in lock-step) against one sample at a time.

    OMP_NUM_THREADS=1 python benchmarks/mcts.py [--trees 32] [--simulations 3] [--k 5] [--seeds 3]
        [--sequential-trees 8] [--policy DIR --world DIR] [--threads N] [--out results.json]

Both sides run the same :class:`~prorag.stages.mcts.TreeSearch` on the same policy, questions,
retriever and settings; only the batching differs:

* **batched**: ``--trees`` trees in lock-step; each round, every tree's expansion (K samples) goes
  to one rollout-engine call and every new child's simulation to another (``trees_per_batch =
  --trees``, engine batch ``trees * K``);
* **one at a time**: one tree at a time and an engine batch of 1, so every expansion sample and
  every simulation is its own generation (what a straightforward MCTS loop does).

Reported: simulations (selection rounds of one tree) per second on each side and their ratio
(target: at least 4x with 32 trees or more), and the policy tokens generated per second on each
side: the sides' trees differ, and a simulation's cost grows with the length of the actions
sampled, so the token rate is the comparison that does not depend on the draws. The one-at-a-time side searches only the first
``--sequential-trees`` questions (its rate per simulation does not depend on how many).

The policy: by default a random tiny Llama whose output head leans towards the stop tags, so
that sampled actions are short and trees go several levels deep; ``--policy`` takes a trained
checkpoint (e.g. the world SFT policy) with the ``--world`` it was trained for. Trees differ
between the sides (the samples are drawn in another order), so a run reports the mean number of
nodes per tree beside the rates.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from machine import machine_name  # benchmarks/machine.py, beside this file

from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.data.records import Record, read_passages, read_records
from prorag.data.world import build_world
from prorag.method.search_tree import iter_paths
from prorag.models.checkpoints import load_policy
from prorag.models.tiny import make_tiny_model
from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.mcts import MCTSConfig, TreeSearch


def biased_tiny_model(tokenizer: Any, size: str) -> torch.nn.Module:
    """A random tiny model whose head favours the action tags, so rollouts have several short turns."""
    model = make_tiny_model(tokenizer, size)
    vocab = tokenizer.get_vocab()
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.get_output_embeddings().weight)
        head.bias.zero_()
        for tag, bias in (("</subquery>", 3.5), ("</subanswer>", 2.5), ("</answer>", 1.0), ("<subquery>", 3.0)):
            head.bias[vocab[tag]] = bias
    model.config.tie_word_embeddings = False
    model.lm_head = head
    return model


def count_policy_tokens(engine: RolloutEngine, counter: list[int]) -> None:
    """Add to ``counter[0]`` the policy tokens (env mask 1) of every trajectory ``engine`` returns."""
    rollout = engine.rollout

    def counted(*args: Any, **kwargs: Any) -> list[Any]:
        trajectories = rollout(*args, **kwargs)
        counter[0] += sum(sum(t.env_mask) for t in trajectories)
        return trajectories

    engine.rollout = counted  # type: ignore[method-assign]


def run_side(model: Any, tokenizer: Any, retriever: BM25Retriever, records: list[Record], cfg: MCTSConfig) -> dict[str, float]:
    """One search of ``records`` with ``cfg``: its totals (trees, simulations, seconds, nodes, policy tokens)."""
    search = TreeSearch(model, tokenizer, retriever, cfg)
    tokens = [0]
    count_policy_tokens(search.expander, tokens)
    count_policy_tokens(search.simulator, tokens)
    start = time.perf_counter()
    trees = search.run(records)
    seconds = time.perf_counter() - start
    return {
        "trees": len(trees),
        "simulations": sum(t.simulations for t in trees),
        "seconds": seconds,
        "nodes": sum(1 for t in trees for _ in iter_paths(t.root)),
        "policy_tokens": tokens[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", type=int, default=32, help="trees searched in lock-step (batched side)")
    ap.add_argument("--sequential-trees", type=int, default=8, help="trees searched by the one-at-a-time side")
    ap.add_argument("--simulations", type=int, default=3)
    ap.add_argument("--k", type=int, default=5, help="candidates per expansion")
    ap.add_argument("--max-depth", type=int, default=4)
    ap.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="search seeds per side, totals summed: a batched turn lasts as long as its longest action, so one "
        "seed's draws move the batched side's time by a third",
    )
    ap.add_argument("--max-action-tokens", type=int, default=32)
    ap.add_argument("--size", default="tiny", help="random model size (without --policy)")
    ap.add_argument("--policy", type=Path, default=None, help="a trained policy checkpoint instead of the random model")
    ap.add_argument(
        "--world", type=Path, default=None, help="the built-in world folder of --policy (default: a fresh demo world)"
    )
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, e.g. OMP_NUM_THREADS)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        world = args.world or Path(tmp)
        if args.world is None:
            build_world(tmp, seed=0, size="demo")
        if args.policy:
            model, tokenizer = load_policy(str(args.policy), device=args.device)
        else:
            tokenizer = train_world_tokenizer(world_tokenizer_texts(world))
            model = biased_tiny_model(tokenizer, args.size)
            if args.device:
                model.to(args.device)
        retriever = BM25Retriever(read_passages(world / "corpus.jsonl"))
        records = read_records(world / "test.jsonl")[: args.trees]

    def engine(batch_size: int) -> RolloutConfig:
        """MCTSConfig's engine defaults with this benchmark's caps and batch size."""
        return replace(
            MCTSConfig().rollout,
            max_actions=max(args.max_depth, 6),
            max_action_tokens=args.max_action_tokens,
            batch_size=batch_size,
        )

    common = dict(simulations=args.simulations, num_candidates=args.k, max_depth=args.max_depth)
    # Warm-up (allocations, first-call overheads) on a few trees, then the two sides.
    run_side(
        model,
        tokenizer,
        retriever,
        records[:2],
        MCTSConfig(**(common | {"simulations": 1}), trees_per_batch=2, rollout=engine(160)),
    )

    def side(trees: list[Record], trees_per_batch: int, batch_size: int) -> dict[str, float]:
        """One side over ``--seeds`` search seeds, totals summed (rates: totals over total seconds)."""
        runs = [
            run_side(
                model,
                tokenizer,
                retriever,
                trees,
                MCTSConfig(**common, trees_per_batch=trees_per_batch, rollout=engine(batch_size), seed=seed),
            )
            for seed in range(args.seeds)
        ]
        total = {k: sum(r[k] for r in runs) for k in runs[0]}
        return total | {
            "sim_per_s": total["simulations"] / total["seconds"],
            "tokens_per_s": total["policy_tokens"] / total["seconds"],
            "nodes_per_tree": total["nodes"] / total["trees"],
        }

    batched = side(records, args.trees, args.trees * args.k)
    single = side(records[: args.sequential_trees], 1, 1)
    ratio = batched["sim_per_s"] / single["sim_per_s"]
    token_ratio = batched["tokens_per_s"] / single["tokens_per_s"]
    device = next(model.parameters()).device
    print(
        f"policy {'random ' + args.size if args.policy is None else args.policy}, {machine_name(str(device))}, "
        f"{torch.get_num_threads()} thread(s); "
        f"{args.simulations} simulations per tree, K={args.k}, depth {args.max_depth}"
    )
    print(f"{'side':<14}{'trees':>6}{'sims':>6}{'seconds':>9}{'sim/s':>9}{'nodes/tree':>12}{'tokens':>8}{'tokens/s':>10}")
    for name, r in (("batched", batched), ("one-at-a-time", single)):
        print(
            f"{name:<14}{r['trees']:>6}{r['simulations']:>6}{r['seconds']:>9.2f}{r['sim_per_s']:>9.2f}{r['nodes_per_tree']:>12.1f}"
            f"{r['policy_tokens']:>8}{r['tokens_per_s']:>10.0f}"
        )
    print(f"batched / one-at-a-time: {ratio:.2f}x (target >= 4x at {args.trees} trees: {'met' if ratio >= 4 else 'NOT met'})")
    print(
        f"policy tokens per second, batched / one-at-a-time: {token_ratio:.2f}x (independent of how long the sampled actions are)"
    )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "batched": batched,
                    "one_at_a_time": single,
                    "ratio": ratio,
                    "token_ratio": token_ratio,
                    "machine": machine_name(str(device)),
                    "args": vars(args) | {"policy": str(args.policy), "world": str(args.world), "out": str(args.out)},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
