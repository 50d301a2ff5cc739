"""Stage 1 on the built-in world: SFT of a tiny model from scratch, next to the naive and
standard-RAG baselines trained with the same questions, model, optimiser and number of steps.

    python -m research.drivers.sft_world [--steps 700] [--batch 16] [--lr 3e-3] [--k 3] [--size tiny]
                                   [--targets prorag,naive,standard-rag] [--test 400] [--out DIR]

What it does, all on the CPU:

1. builds the ``demo`` world (seed 0, one sentence per passage unless ``--passages page``: 20 training worlds, an unseen dev world and an unseen
   test world), trains the world tokenizer and indexes the corpus with BM25;
2. renders a gold trajectory of every training question (template teacher, top-``k`` BM25);
3. for every target, :func:`prorag.stages.sft.train_sft` with ``SFTConfig(target=...)``: the
   ProRAG policy (``prorag``: the format-aware loss on gold trajectories) and the two one-shot
   baselines (``naive``: question -> answer; ``standard-rag``: top-``k`` documents for the
   question + question -> answer) on the same questions; the held-out rollouts of the SFT
   stage run on ``--dev`` dev-world questions (format-valid rate, EM);
4. evaluates each model on ``--test`` test-world questions with :func:`prorag.evaluation.harness.evaluate`
   (greedy; the baselines through their own prompts) and prints EM/F1 by question type, next to
   the no-retrieval ceiling of the world's memorisation audit (what a model that never reads can
   reach: chance level).

The test world's facts never appear in training, so a model can only answer them by reading
retrieved documents: the naive baseline must stay near chance, and the gap between the policy
and standard RAG is what multi-step retrieval adds. ``--threads`` sets torch's intra-op threads
(default: all cores; on a machine shared with other work use 1).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from prorag.agent.gold import render_gold
from prorag.data.jsonl import read_json, read_jsonl, write_json
from prorag.data.records import read_passages, read_records
from prorag.data.world import SIZES, build_world
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.evaluation.harness import evaluate
from prorag.models.checkpoints import load_policy
from prorag.models.tiny import make_tiny_model
from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.sft import train_sft
from prorag.stages.sft_config import SFTConfig

TARGETS = ("prorag", "naive", "standard-rag")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=700, help="optimiser steps of every target")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--k", type=int, default=3, help="documents per retrieval")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--dev", type=int, default=200, help="dev questions of the held-out rollouts")
    ap.add_argument("--test", type=int, default=400, help="test questions evaluated")
    ap.add_argument("--out", type=Path, default=Path("runs/sft_world"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--passages", default="fact", choices=["fact", "page"], help="world passages: one sentence or one page each")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    targets = [t for t in args.targets.split(",") if t]
    if unknown := set(targets) - set(TARGETS):
        raise SystemExit(f"unknown targets {sorted(unknown)}; expected some of {TARGETS}")

    t0 = time.perf_counter()
    world = args.out / "world"
    if not (world / "world.json").exists():
        build_world(world, seed=0, size=replace(SIZES["demo"], passages=args.passages))
    tokenizer = train_world_tokenizer(world_tokenizer_texts(world))
    retriever = BM25Retriever(read_passages(world / "corpus.jsonl"))
    train = read_records(world / "train.jsonl")
    dev = read_records(world / "dev.jsonl")[: args.dev]
    test = read_records(world / "test.jsonl")[: args.test]
    gold = render_gold(train, retriever, k=args.k)
    gold_dev = render_gold(dev, retriever, k=args.k)
    n_params = sum(p.numel() for p in make_tiny_model(tokenizer, args.size).parameters())
    print(
        f"demo world: {len(train)} train questions ({len(gold)} gold trajectories), {len(dev)} dev, {len(test)} test; "
        f"model {args.size} {n_params:,} parameters; {args.steps} steps x batch {args.batch} "
        f"({args.steps * args.batch / len(gold):.2f} epochs), lr {args.lr:g}, k {args.k}, threads {args.threads} "
        f"({time.perf_counter() - t0:.1f}s to prepare)",
        flush=True,
    )

    results: dict[str, dict] = {}
    for target in targets:
        run = args.out / f"run-{target}"
        config = SFTConfig(
            model=args.size,
            target=target,
            top_k=args.k,
            max_steps=args.steps,
            per_device_batch_size=args.batch,
            learning_rate=args.lr,
            lr_scheduler_type="cosine",
            warmup_ratio=0.05,
            group_by_length=True,
            eval_steps=args.steps,
            save_steps=max(1, args.steps // 2),
            logging_steps=max(1, args.steps // 20),
            eval_samples=args.dev,
            eval_batch_size=32,
            seed=args.seed,
        )
        policy = train_sft(
            config,
            run,
            tokenizer=tokenizer,
            trajectories=gold,
            eval_trajectories=gold_dev,
            records=train + dev,
            retriever=retriever,
        )
        rows = list(read_jsonl(run / "metrics.jsonl"))
        summary = [r for r in rows if "train_runtime" in r][-1]
        heldout = [r for r in rows if "format_valid_rate" in r][-1]
        model, tok = load_policy(str(policy))
        t1 = time.perf_counter()
        metrics = evaluate(
            model,
            tok,
            test,
            retriever,
            args.out / f"eval-{target}",
            EvalConfig(baseline=None if target == "prorag" else target, rollout=EvalRolloutConfig(top_k=args.k, batch_size=32)),
            progress=False,
        )
        results[target] = {
            "train_seconds": summary["train_runtime"],
            "steps": summary["step"],
            "dev_format_valid": heldout["format_valid_rate"],
            "dev_em": heldout["eval_em"],
            "test": {k: v for k, v in metrics.items() if k != "config"},
            "test_eval_seconds": time.perf_counter() - t1,
        }
        print(
            f"[{target}] trained {summary['step']} steps in {summary['train_runtime']:.0f}s; "
            f"dev (n={heldout['eval_samples']}): format-valid {heldout['format_valid_rate']:.3f} EM {heldout['eval_em']:.3f}; "
            f"test (n={metrics['n']}): EM {metrics['em']:.3f} F1 {metrics['f1']:.3f} "
            f"retrieval steps {metrics['mean_retrieval_steps']:.2f} format-valid {metrics['format_valid_rate']:.3f}",
            flush=True,
        )

    audit = read_json(world / "world.json")["memorisation_audit"]["test"]
    kinds = sorted({k for r in results.values() for k in r["test"].get("by_type", {})})
    print(f"\ntest world (unseen facts), EM / F1 by question type; n={len(test)}")
    print(f"{'':<14}" + "".join(f"{t:>20}" for t in results) + f"{'memoriser/chance':>20}")
    for kind in ["all", *kinds]:
        cells = []
        for r in results.values():
            row = r["test"] if kind == "all" else r["test"]["by_type"][kind]
            cells.append(f"{row['em']:.3f} / {row['f1']:.3f}")
        a = audit.get(kind)
        ceiling = f"{a['best_memoriser_em']:.3f} / {a['chance']:.3f}" if a else "-"
        print(f"{kind:<14}" + "".join(f"{c:>20}" for c in cells) + f"{ceiling:>20}")
    write_json(
        args.out / "result.json", {"args": {k: str(v) for k, v in vars(args).items()}, "params": n_params, "results": results}
    )


if __name__ == "__main__":
    main()
