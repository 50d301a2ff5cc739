"""One sampling step of a batch (temperature, top-p, one token per row): the engine's
``sample_next`` against the sort-and-multinomial way (``torch.sort`` with its permutation, then
``torch.multinomial``), on the same logits, in one process.

    OMP_NUM_THREADS=1 python benchmarks/sampling.py [--rows 160] [--vocab 4096] [--top-p 0.95] [--repeats 50]

Two kinds of rows: peaked (a trained policy: a few tokens hold the mass) and flat (a random
model: the nucleus is most of the vocabulary). The defaults are MCTS's engine batch (32 trees x
K 5) and the world tokenizer's vocabulary.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from machine import machine_name  # benchmarks/machine.py, beside this file

from prorag.agent.sampling import sample_next


def sort_and_multinomial(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """The baseline: the nucleus from a full sort (values and permutation), then ``torch.multinomial``."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    kept = sorted_p.masked_fill((sorted_p.cumsum(-1) - sorted_p) >= top_p, 0.0)
    probs = torch.zeros_like(probs).scatter(-1, order, kept)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def seconds_per_call(fn: Callable[[], object], repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=160)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--temperature", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    print(f"{args.rows} rows x {args.vocab} tokens, top-p {args.top_p}, {torch.get_num_threads()} thread(s), on {machine_name()}")
    print(f"{'rows':8s} {'sort + multinomial':>20s} {'sample_next':>12s} {'ratio':>7s}")
    for name, scale in (("peaked", 8.0), ("flat", 0.3)):
        logits = torch.randn(args.rows, args.vocab, generator=g) * scale
        base = seconds_per_call(lambda x=logits: sort_and_multinomial(x, args.temperature, args.top_p, g), args.repeats)
        ours = seconds_per_call(
            lambda x=logits: sample_next(x, temperature=args.temperature, top_p=args.top_p, greedy=False, generator=g),
            args.repeats,
        )
        print(f"{name:8s} {1000 * base:17.2f} ms {1000 * ours:9.2f} ms {base / ours:6.1f}x")


if __name__ == "__main__":
    main()
