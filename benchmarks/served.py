"""Served-backend evaluation throughput: 16 requests in flight against one at a time.

    python benchmarks/served.py [--questions 48] [--rounds 3] [--latency 0.2] [--concurrency 16] [--out results.json]

A real evaluation on :class:`prorag.models.served.ServedGenerator`: ``evaluate_generator`` runs the
``iter-retgen`` baseline over ``--questions`` questions, ``--rounds`` rounds each (every round a
retrieval with the previous generation, then a generation: one batch over all questions), against an
in-memory retriever, writing predictions as ``prorag eval`` does. The server is the tests'
fake OpenAI-compatible server (tests/fake_chat_server.py) on 127.0.0.1, answering every request
after a fixed ``--latency`` (0.2 s: an 8B model's short completion on a GPU server; at 0.05 s the
client-side work of the evaluation, under one interpreter with the fake server, caps the ratio near
6-7x on two cores, see docs/LOG.md); it runs in this process,
so its threads and the client share one interpreter (a conservative setting: a real server's
work happens elsewhere). The same prompts run with ``concurrency=1`` and ``--concurrency``,
without a cache, each warmed up first; printed: questions/s of each, the ratio (target: >= 8x
at 16) and the ideal ratio (``min(concurrency, questions)``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the fake server

from machine import machine_name  # noqa: E402 - benchmarks/machine.py, beside this file

from prorag.data.records import Record  # noqa: E402
from prorag.evaluation.eval_config import EvalConfig  # noqa: E402
from prorag.evaluation.generator_eval import evaluate_generator  # noqa: E402
from prorag.models.endpoint_config import ServedConfig
from prorag.models.served import ServedGenerator  # noqa: E402
from tests.evaluation.conftest import LoggingRetriever  # noqa: E402
from tests.fake_chat_server import FakeChatServer, Reply, user_text  # noqa: E402

TARGET_RATIO = 8.0


def evaluate(gen: ServedGenerator, records: list[Record], rounds: int) -> float:
    """Seconds of one ``evaluate_generator`` run of Iter-RetGen (``rounds`` rounds) over ``records``."""
    cfg = EvalConfig(baseline="iter-retgen", baseline_options={"rounds": rounds, "max_tokens": 32})
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        evaluate_generator(gen, records, LoggingRetriever(), out, cfg, progress=False)
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.2, help="seconds the fake server takes per request")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    def behave(body: dict[str, Any], n: int) -> Reply:
        return Reply(content=f"Step about {user_text(body)[-20:]!r}.", delay=args.latency)

    records = [
        Record(f"q{i}", f"Who founded the town where person {i} was born?", [f"founder {i}"]) for i in range(args.questions)
    ]
    results: dict[str, Any] = {
        "device": f"{machine_name()}, Python {platform.python_version()}",
        "questions": args.questions,
        "rounds": args.rounds,
        "latency_s": args.latency,
    }
    with FakeChatServer(behave) as server:
        for c in (1, args.concurrency):
            gen = ServedGenerator(ServedConfig(base_url=server.url, model="fake", concurrency=c))
            gen.generate(["warm-up"] * 1, max_tokens=4)
            seconds = evaluate(gen, records, args.rounds)
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
