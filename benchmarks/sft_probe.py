"""SFT probe: train a built-in model on the demo world's gold trajectories for a few minutes, then
evaluate it on dev questions (greedy ProRAG rollouts with BM25).

    python benchmarks/sft_probe.py [--size tiny] [--minutes 5] [--lr 3e-3] [--batch 8] [--out DIR]

Steps: build the ``demo`` world (seed 0), train the world tokenizer, index the corpus with BM25,
render a gold trajectory for every train record (k = 3, template teacher), then
:func:`prorag.stages.sft.train_sft` on a ``tiny`` or ``small`` model. The number of optimiser
steps is calibrated so that the learning-rate schedule ends when the time budget is spent: a few
timed steps on the trainer's own batches give the time per step, and ``--minutes`` divided by it
is ``max_steps`` (a time budget also stops training if the machine slows down). Finally
:func:`prorag.evaluate.evaluate` runs ``--dev`` dev questions and prints EM, F1, the
format-valid rate (I_traj) and the scores by question type, next to the no-retrieval ceiling of
the world's memorisation audit (what a model that never reads can reach: chance level).

``--threads`` sets torch's intra-op threads (default 1): the models are so small that on a
2-core machine shared with other work two threads spend more time synchronising than computing.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from pathlib import Path

import torch

from prorag.data.jsonl import read_json, read_jsonl
from prorag.data.records import read_passages, read_records
from prorag.data.world import build_world
from prorag.evaluate import EvalConfig, evaluate
from prorag.gold import render_gold
from prorag.losses import tag_weight_table, weighted_lm_loss
from prorag.models import load_policy, make_tiny_model, tag_token_ids, train_world_tokenizer, world_tokenizer_texts
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.sft import SFTConfig, WeightedSFTCollator, build_sft_examples, train_sft


def seconds_per_token(tokenizer, size: str, examples: list[dict], batch: int, lr: float, steps: int = 3) -> float:
    """Wall time per (padded) token of one optimiser step (forward, backward, AdamW), measured on
    batches of examples of about the median length (as length-grouped batches are)."""
    model = make_tiny_model(tokenizer, size)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    collate = WeightedSFTCollator(int(tokenizer.pad_token_id))
    by_length = sorted(examples, key=lambda e: e["length"])
    mid = len(by_length) // 2
    rates = []
    for k in range(steps + 1):
        b = collate(by_length[mid + k * batch : mid + (k + 1) * batch])
        t0 = time.perf_counter()
        loss = weighted_lm_loss(
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b["input_ids"], b["loss_weights"]
        )
        loss.backward()
        opt.step()
        opt.zero_grad()
        rates.append((time.perf_counter() - t0) / b["input_ids"].numel())
    return sorted(rates[1:])[len(rates[1:]) // 2]  # the first step warms up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--minutes", type=float, default=5.0, help="training time budget")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("runs/sft_probe"))
    ap.add_argument("--dev", type=int, default=200, help="dev questions to evaluate")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scheme", default="reference", choices=["reference", "paper"])
    ap.add_argument("--warmup", type=float, default=0.05)
    ap.add_argument("--scheduler", default="linear")
    ap.add_argument("--no-group-by-length", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="delete an earlier run in --out first (else it resumes)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    out: Path = args.out
    run = out / f"run-{args.size}"
    if args.fresh:
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(out / f"eval-{args.size}", ignore_errors=True)

    t0 = time.perf_counter()
    world = out / "world"
    if not (world / "world.json").exists():
        build_world(world, seed=0, size="demo")
    tokenizer = train_world_tokenizer(world_tokenizer_texts(world))
    retriever = BM25Retriever(read_passages(world / "corpus.jsonl"))
    train = read_records(world / "train.jsonl")
    dev = read_records(world / "dev.jsonl")[: args.dev]
    gold = render_gold(train, retriever, k=3)
    prep = time.perf_counter() - t0

    table = tag_weight_table(tag_token_ids(tokenizer), args.scheme)
    examples, _ = build_sft_examples(gold, tokenizer, table)
    per_token = seconds_per_token(tokenizer, args.size, examples, args.batch, args.lr)
    mean_length = sum(e["length"] for e in examples) / len(examples)
    # Length-grouped batches pad little (~5%); two held-out loss passes cost about 3% of the budget.
    per_step = per_token * args.batch * mean_length * 1.05
    budget = 60.0 * args.minutes * 0.97
    max_steps = max(1, int(budget / per_step))
    n_params = sum(p.numel() for p in make_tiny_model(tokenizer, args.size).parameters())
    print(
        f"demo world: {len(train)} train / {len(dev)} dev questions, {len(gold)} gold trajectories, "
        f"{sum(e['length'] for e in examples) / len(examples):.0f} tokens each on average ({prep:.1f}s to prepare)"
    )
    print(
        f"model {args.size}: {n_params:,} parameters; calibrated {per_token * 1e6:.0f} us/token, {per_step:.2f}s/step at batch {args.batch} "
        f"-> max_steps {max_steps} ({max_steps * args.batch / len(gold):.2f} epochs) in {args.minutes:g} min; threads {args.threads}"
    )

    config = SFTConfig(
        model=args.size,
        max_steps=max_steps,
        max_minutes=args.minutes * 1.1,
        per_device_batch_size=args.batch,
        learning_rate=args.lr,
        warmup_ratio=args.warmup,
        lr_scheduler_type=args.scheduler,
        weight_scheme=args.scheme,
        group_by_length=not args.no_group_by_length,
        eval_fraction=0.02,
        eval_steps=max(1, max_steps // 2),
        save_steps=max(1, max_steps // 2),
        logging_steps=max(1, max_steps // 20),
        eval_samples=64,
        eval_batch_size=32,
        seed=args.seed,
    )
    t1 = time.perf_counter()
    policy = train_sft(config, run, tokenizer=tokenizer, trajectories=gold, records=train, retriever=retriever)
    train_seconds = time.perf_counter() - t1
    rows = list(read_jsonl(run / "metrics.jsonl"))
    losses = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval_loss" in r]
    final = [r for r in rows if "format_valid_rate" in r][-1]
    summary = [r for r in rows if "train_runtime" in r][-1]
    print(
        f"trained {summary['step']} steps in {summary['train_runtime']:.0f}s of training "
        f"({train_seconds:.0f}s with checkpoints, held-out loss and rollouts); "
        f"loss {losses[0]['loss']:.3f} (step {losses[0]['step']}) -> {losses[-1]['loss']:.3f} (step {losses[-1]['step']}), "
        f"held-out loss {evals[-1]['eval_loss']:.3f}, token accuracy {losses[-1].get('mean_token_accuracy', float('nan')):.3f}"
    )
    print(
        f"held-out train-world rollouts (n={final['eval_samples']}): format-valid {final['format_valid_rate']:.3f}, "
        f"EM {final['eval_em']:.3f}, F1 {final['eval_f1']:.3f}"
    )

    model, tok = load_policy(str(policy))
    model.eval()
    t2 = time.perf_counter()
    metrics = evaluate(
        model, tok, dev, retriever, out / f"eval-{args.size}", EvalConfig(k=3, greedy=True, batch_size=32), progress=False
    )
    eval_seconds = time.perf_counter() - t2
    audit = read_json(world / "world.json")["memorisation_audit"]["test"]
    print(
        f"dev (n={metrics['n']}, greedy, BM25 k=3, {eval_seconds:.0f}s): EM {metrics['em']:.3f}  F1 {metrics['f1']:.3f}  "
        f"format-valid {metrics['format_valid_rate']:.3f}  retrieval steps {metrics['mean_retrieval_steps']:.2f}  "
        f"gold-evidence recall {metrics['retrieval_recall']:.3f}  stop reasons {metrics['stop_reasons']}"
    )
    print(
        f"no-retrieval ceiling (memorisation audit, test split): all {audit['all']['best_memoriser_em']:.3f} "
        f"(chance {audit['all']['chance']:.3f}), yes/no {audit['compare_same']['chance']:.2f}"
    )
    print(f"{'type':<15}{'n':>5}{'EM':>8}{'F1':>8}")
    for kind, row in metrics.get("by_type", {}).items():
        print(f"{kind:<15}{row['n']:>5}{row['em']:>8.3f}{row['f1']:>8.3f}")
    result = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "params": n_params,
        "seconds_per_step": per_step,
        "max_steps": max_steps,
        "steps": summary["step"],
        "train_runtime": summary["train_runtime"],
        "first_loss": losses[0]["loss"],
        "final_loss": losses[-1]["loss"],
        "eval_loss": evals[-1]["eval_loss"],
        "heldout_rollouts": final,
        "dev": {k: v for k, v in metrics.items() if k != "config"},
    }
    (out / f"result-{args.size}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
