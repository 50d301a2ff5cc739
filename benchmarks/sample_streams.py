"""Sampling with one random stream per row against one generator per batch: speed, and whether the
samples survive a change in how the batch is run.

    OMP_NUM_THREADS=1 python benchmarks/sample_streams.py [--policy RUN/policies/sft/policy \
        --data RUN/splits/rft.jsonl --index RUN/index] [--questions 64] [--samples 4] [--batch 32]
        [--repeats 2] [--out results.json]

Without ``--policy`` it builds the demo world and samples from a random tiny model (its trajectories
are noise of the right kind: the speed ratio and the agreement still mean what they say).

RFT and MCTS draw each row from its own stream (``sample_streams: row``, seeded by the row's name:
question id and sample index), RL always has; before, one generator served a batch (``batch``).
Both sides sample ``--samples`` trajectories of each of ``--questions`` questions at temperature 1
with RFT's chunking (``batch // samples`` questions per engine call) from the same policy in the
same process, alternating, best of ``--repeats`` timed runs each. Reported per side: policy tokens
per second, and the share of trajectories written token for token alike when the same samples are
drawn with the turn barrier (``resume_early: false``) and with twice the batch. With row streams
both should be 1.00 (float noise of differently shaped batches may flip a rare near-tie); with one
generator per batch a row takes whichever draws the batch's order hands it.
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
from prorag.agent.sampling import SAMPLE_STREAMS, SampleStreams
from prorag.data.records import Record, read_passages, read_records
from prorag.data.world import build_world
from prorag.models.checkpoints import load_policy
from prorag.models.tiny import make_tiny_model
from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.index import open_retriever
from prorag.stages.rft import question_chunks, sample_chunk


def sample(engine: RolloutEngine, records: list[Record], n: int, streams: SampleStreams) -> tuple[float, int, list[list[int]]]:
    """Every question's ``n`` samples, chunked as RFT chunks them: (seconds, policy tokens, completions)."""
    out: list[list[int]] = []
    tokens = 0
    start = time.perf_counter()
    for c, chunk in enumerate(question_chunks(records, n, engine.config.batch_size)):
        for t in sample_chunk(engine, chunk, n, 0, c, streams):
            out.append(list(t.completion_ids))
            tokens += sum(t.env_mask)
    return time.perf_counter() - start, tokens, out


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default=None, help="a saved policy folder (e.g. a run's policies/sft/policy)")
    ap.add_argument("--data", default=None, help="questions (JSONL records), with --policy")
    ap.add_argument("--index", default=None, help="the retrieval index of those questions, with --policy")
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-action-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.policy:
        if not (args.data and args.index):
            ap.error("--policy needs --data and --index")
        records = read_records(args.data)[: args.questions]
        retriever: Any = open_retriever(args.index)
        model, tokenizer = load_policy(args.policy, dtype="float32")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            build_world(tmp, seed=0, size="demo")
            tokenizer = train_world_tokenizer(world_tokenizer_texts(tmp))
            retriever = BM25Retriever(read_passages(Path(tmp) / "corpus.jsonl"))
            records = read_records(Path(tmp) / "test.jsonl")[: args.questions]
        model = make_tiny_model(tokenizer, "tiny", seed=0)
    cfg = RolloutConfig(batch_size=args.batch, temperature=1.0, max_action_tokens=args.max_action_tokens)

    def engine(c: RolloutConfig) -> Any:
        return RolloutEngine(model, tokenizer, retriever, c)

    base = engine(cfg)
    sample(base, records[: max(1, args.batch // args.samples)], args.samples, "row")  # warm-up
    best: dict[str, float] = {}
    toks: dict[str, int] = {}
    first: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):
        for side in SAMPLE_STREAMS:
            seconds, tokens, out = sample(base, records, args.samples, side)
            best[side] = min(best.get(side, float("inf")), seconds)
            toks[side], first[side] = tokens, out
    barrier = engine(replace(cfg, resume_early=False))
    wide = engine(replace(cfg, batch_size=2 * args.batch))
    print(
        f"{len(records)} questions x {args.samples} samples, batch {args.batch}, {torch.get_num_threads()} torch thread(s), "
        f"best of {args.repeats}, on {machine_name()}"
    )
    rows = []
    for side in SAMPLE_STREAMS:
        rows.append(
            {
                "streams": side,
                "tokens_per_s": toks[side] / best[side],
                "seconds": best[side],
                "same_with_barrier": agreement(first[side], sample(barrier, records, args.samples, side)[2]),
                "same_at_twice_the_batch": agreement(first[side], sample(wide, records, args.samples, side)[2]),
            }
        )
    print(f"{'streams':<8}{'tok/s':>8}{'same with barrier':>19}{'same at 2x batch':>18}")
    for r in rows:
        print(f"{r['streams']:<8}{r['tokens_per_s']:>8.0f}{r['same_with_barrier']:>19.2f}{r['same_at_twice_the_batch']:>18.2f}")
    ratio = best["row"] / best["batch"]
    print(f"row streams: {ratio:.2f}x the time of one generator per batch (the two sides write other samples)")
    if args.out:
        result = {
            "machine": machine_name(),
            "questions": len(records),
            "samples": args.samples,
            "batch": args.batch,
            "time_ratio": ratio,
            "rows": rows,
        }
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
