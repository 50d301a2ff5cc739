"""Served-backend evaluation throughput: 16 requests in flight against one at a time.

    python benchmarks/served.py [--questions 48] [--rounds 3] [--latency 0.05] [--concurrency 16] [--out results.json]

An evaluation-shaped load on :class:`prorag.models.served.ServedGenerator`: ``--questions``
questions, each answered in ``--rounds`` generations that depend on the previous reply (as
Iter-RetGen's rounds do), every round one batch over all questions. The server is the tests'
fake OpenAI-compatible server (tests/fake_chat_server.py) on 127.0.0.1, answering every request
after a fixed ``--latency``, as a GPU server answers short completions; it runs in this process,
so its threads and the client share one interpreter (a conservative setting: a real server's
work happens elsewhere). The same prompts run with ``concurrency=1`` and ``--concurrency``,
without a cache, each warmed up first; printed: questions/s of each, the ratio (target: >= 8x
at 16) and the ideal ratio (``min(concurrency, questions)``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the fake server

from prorag.models.served import ServedConfig, ServedGenerator  # noqa: E402
from tests.fake_chat_server import FakeChatServer, Reply, user_text  # noqa: E402

TARGET_RATIO = 8.0


def evaluate(gen: ServedGenerator, questions: list[str], rounds: int) -> float:
    """Seconds to run ``rounds`` dependent generation rounds over ``questions``."""
    start = time.perf_counter()
    prompts = list(questions)
    for _ in range(rounds):
        replies = gen.generate(prompts, max_tokens=32, stop=["\n"])
        prompts = [f"{p}\n{r.text}" for p, r in zip(questions, replies, strict=True)]
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.05, help="seconds the fake server takes per request")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    def behave(body: dict[str, Any], n: int) -> Reply:
        return Reply(content=f"Step about {user_text(body)[-20:]!r}.", delay=args.latency)

    questions = [f"Question {i}: who founded the town where person {i} was born?" for i in range(args.questions)]
    results: dict[str, Any] = {
        "device": f"{platform.machine()} {platform.processor() or ''} x{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "questions": args.questions,
        "rounds": args.rounds,
        "latency_s": args.latency,
    }
    with FakeChatServer(behave) as server:
        for c in (1, args.concurrency):
            gen = ServedGenerator(ServedConfig(base_url=server.url, model="fake", concurrency=c))
            gen.generate(["warm-up"] * 1, max_tokens=4)
            seconds = evaluate(gen, questions, args.rounds)
            results[f"concurrency_{c}"] = {
                "seconds": round(seconds, 3),
                "questions_per_s": round(args.questions / seconds, 2),
                "requests": gen.usage.requests,
            }
        max_in_flight = server.max_in_flight
    ratio = results["concurrency_1"]["seconds"] / results[f"concurrency_{args.concurrency}"]["seconds"]
    results.update(ratio=round(ratio, 2), ideal_ratio=min(args.concurrency, args.questions), max_in_flight=max_in_flight)
    print(f"device: {results['device']}")
    print(f"{args.questions} questions x {args.rounds} rounds, fake server latency {args.latency * 1000:.0f} ms")
    for c in (1, args.concurrency):
        r = results[f"concurrency_{c}"]
        print(f"  concurrency {c:>3}: {r['seconds']:.2f} s, {r['questions_per_s']:.2f} questions/s ({r['requests']} requests)")
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    print(
        f"  ratio: {ratio:.2f}x (ideal {results['ideal_ratio']}x, most in flight {max_in_flight}); {verdict} the {TARGET_RATIO:g}x target"
    )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
