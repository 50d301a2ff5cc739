"""The policy's RMSNorms compiled (``compile_norms``) against stock, on this machine, in one process.

    OMP_NUM_THREADS=1 python benchmarks/compile_norms.py [--size tiny|small] [--device cpu|cuda]
        [--rows 16] [--length 320] [--batch 32] [--repeats 3] [--out results.json]

Two workloads on the same tiny world model (``prorag.models.tiny``), stock and then with
:func:`prorag.core.kernels.compile_norms` (the compilation timed apart, in a warm-up):

* **training**: forward and backward of a padded batch (``--rows`` rows of up to ``--length`` tokens,
  lengths spread like trajectories), the loss of every stage trainer;
* **rollout**: the rollout engine on ``--batch`` test questions of the built-in world (sampled with
  per-row streams, RL caps), what RFT, MCTS, RL and the evaluations spend their time in.

Each side is timed ``--repeats`` times, best kept; the rollouts of both sides are compared token for
token (float rounding of the fused norm can flip a near-tie). Prints seconds, the ratios, and the device.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from decode_graphs import sync, time_engine  # benchmarks/decode_graphs.py, beside this file
from machine import machine_name  # benchmarks/machine.py, beside this file

from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.core.kernels import compile_norms
from prorag.data.records import read_passages, read_records
from prorag.data.world import build_world
from prorag.models.tiny import make_tiny_model
from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts
from prorag.retrieval.bm25 import BM25Retriever


def training_batch(vocab: int, rows: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids, right-padded rows of lengths spread from a third of ``length`` to all of it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, length), generator=g)
    lengths = torch.linspace(length // 3, length, rows).long()
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def time_training(model: Any, batch: dict[str, torch.Tensor], device: str) -> float:
    model.train()
    sync(device)
    start = time.perf_counter()
    model(**{k: v.to(device) for k, v in batch.items()}).loss.backward()
    sync(device)
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="tiny", choices=("tiny", "small"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--length", type=int, default=320)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device = args.device
    with tempfile.TemporaryDirectory() as tmp:
        build_world(tmp, seed=0, size="demo")
        tokenizer = train_world_tokenizer(world_tokenizer_texts(tmp))
        retriever = BM25Retriever(read_passages(Path(tmp) / "corpus.jsonl"))
        records = read_records(Path(tmp) / "test.jsonl")[: args.batch]
    stock = make_tiny_model(tokenizer, size=args.size, seed=0).to(device)
    fused = copy.deepcopy(stock)
    batch = training_batch(len(tokenizer), args.rows, args.length)
    cfg = RolloutConfig(max_actions=11, max_action_tokens=64, batch_size=args.batch, temperature=1.0, seed=0)
    seeds = [100 + i for i in range(len(records))]

    start = time.perf_counter()
    compiled = compile_norms(fused)
    time_training(fused, batch, device)  # the compilations (training variants), then the rollout's
    fused_engine = RolloutEngine(fused, tokenizer, retriever, cfg)
    time_engine(fused_engine, records, seeds, device)
    compile_seconds = time.perf_counter() - start
    stock_engine = RolloutEngine(stock, tokenizer, retriever, cfg)
    time_training(stock, batch, device)  # warm-up of the stock side
    time_engine(stock_engine, records, seeds, device)

    result: dict[str, dict[str, float]] = {"training": {}, "rollout": {}}
    rollouts = {}
    for name, model, engine in (("stock", stock, stock_engine), ("compiled", fused, fused_engine)):
        result["training"][name] = min(time_training(model, batch, device) for _ in range(args.repeats))
        runs = [time_engine(engine, records, seeds, device) for _ in range(args.repeats)]
        result["rollout"][name] = min(r[0] for r in runs)
        rollouts[name] = runs[0]
    same = sum(a.completion_ids == b.completion_ids for a, b in zip(rollouts["stock"][2], rollouts["compiled"][2], strict=True))
    tokens = rollouts["stock"][1]
    print(
        f"{machine_name(device)}, {args.size} model, torch {torch.__version__}, {compiled} RMSNorms compiled in {compile_seconds:.1f} s (warm-up)"
    )
    for part, times in result.items():
        print(
            f"{part:9s} stock {times['stock']:.3f} s, compiled {times['compiled']:.3f} s: "
            f"{times['stock'] / times['compiled']:.2f}x (best of {args.repeats})"
        )
    print(f"rollouts: {same} of {len(records)} identical ({tokens} model tokens on the stock side)")
    if args.out:
        summary = {part: {**times, "speedup": times["stock"] / times["compiled"]} for part, times in result.items()}
        args.out.write_text(
            json.dumps(
                {
                    "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                    "machine": machine_name(device),
                    "size": args.size,
                    "torch": torch.__version__,
                    "compiled_norms": compiled,
                    "compile_seconds": compile_seconds,
                    "same_rollouts": same / len(records),
                    "model_tokens": tokens,
                    **summary,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
