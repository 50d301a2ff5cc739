"""Load on the retrieval server: concurrent clients, latency percentiles and errors.

    python benchmarks/server_load.py [--clients 16] [--requests 2000] [--max-seconds 60] [--batch 1] [--out load.json]

Builds the tiny built-in world and a BM25 index over it in a temporary folder, starts
``prorag serve-retriever`` on a free 127.0.0.1 port in a subprocess, and runs ``--clients``
concurrent clients (one keep-alive connection each) that send ``/retrieve`` requests of
``--batch`` questions until ``--requests`` have been sent or ``--max-seconds`` have passed,
whichever comes first (both bound the run). It prints p50/p99/max latency, requests/s and the
errors (non-200 answers and transport errors, by kind), and the baseline measured in the same
process: the p50 of the same searches in-process, and the server/in-process p50 ratio.
The exit code is 1 when any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_name  # noqa: E402 - benchmarks/machine.py, beside this file
from retrieval import running_server  # noqa: E402 - the sibling benchmark's server fixture

from prorag.data.records import read_records  # noqa: E402
from prorag.data.world import build_world  # noqa: E402
from prorag.retrieval.index import build_index, load_index  # noqa: E402


@dataclass
class Load:
    """What the clients saw: one latency (seconds) per answered request, errors by kind."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile by the nearest-rank method (an observed latency, never interpolated):
    for a p99 of a few hundred requests that is the honest number."""
    ranked = sorted(values)
    return ranked[min(len(ranked), max(1, math.ceil(q * len(ranked)))) - 1]


async def run_load(url: str, queries: list[str], *, clients: int, requests: int, max_seconds: float, batch: int) -> Load:
    """``clients`` concurrent clients sending ``requests`` requests in all (or until ``max_seconds``)."""
    load = Load()
    sent = 0
    start = time.perf_counter()
    deadline = start + max_seconds

    async def client(i: int) -> None:
        nonlocal sent
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as http:
            while sent < requests and time.perf_counter() < deadline:
                n = sent
                sent += 1
                body = {"queries": [queries[(n * batch + j) % len(queries)] for j in range(batch)], "topk": 3}
                t0 = time.perf_counter()
                try:
                    r = await http.post("/retrieve", json=body)
                except httpx.TransportError as e:
                    load.errors[type(e).__name__] += 1
                    continue
                if r.status_code == 200 and len(r.json()["result"]) == batch:
                    load.latencies.append(time.perf_counter() - t0)
                else:
                    load.errors[f"http {r.status_code}"] += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    load.seconds = time.perf_counter() - start
    return load


def in_process_p50(index_dir: Path, queries: list[str], batch: int, n: int = 200) -> float:
    """The baseline: p50 seconds of the same searches without HTTP."""
    retriever = load_index(index_dir)
    times = []
    for i in range(n):
        qs = [queries[(i * batch + j) % len(queries)] for j in range(batch)]
        t0 = time.perf_counter()
        retriever.search(qs, k=3)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(*, clients: int, requests: int, max_seconds: float, batch: int, work: Path) -> dict[str, Any]:
    """Build the tiny world and its index under ``work``, serve it, load it; the report as a dict."""
    build_world(work / "world", seed=0, size="tiny")
    build_index(work / "world" / "corpus.jsonl", work / "index")
    queries = [r.question for r in read_records(work / "world" / "train.jsonl")]
    with running_server(work / "index", work / "server.log") as url:
        load = asyncio.run(run_load(url, queries, clients=clients, requests=requests, max_seconds=max_seconds, batch=batch))
    base = in_process_p50(work / "index", queries, batch)
    lat = load.latencies
    p50 = percentile(lat, 0.5) if lat else float("nan")
    return {
        "machine": machine_name(),
        "clients": clients,
        "batch": batch,
        "answered": len(lat),
        "errors": sum(load.errors.values()),
        "errors_by_kind": dict(load.errors),
        "seconds": round(load.seconds, 3),
        "requests_per_s": round(len(lat) / load.seconds, 1) if load.seconds else 0.0,
        "p50_ms": round(1000 * p50, 2),
        "p99_ms": round(1000 * percentile(lat, 0.99), 2) if lat else float("nan"),
        "max_ms": round(1000 * max(lat), 2) if lat else float("nan"),
        "in_process_p50_ms": round(1000 * base, 3),
        "server_over_in_process_p50": round(p50 / base, 1) if base else float("nan"),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16, help="Concurrent clients.")
    parser.add_argument("--requests", type=int, default=2000, help="Requests in all (a bound).")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="Wall-clock bound of the load.")
    parser.add_argument("--batch", type=int, default=1, help="Questions per request.")
    parser.add_argument("--out", type=Path, help="Also write the report as JSON here.")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="server_load-") as tmp:
        report = measure(
            clients=args.clients, requests=args.requests, max_seconds=args.max_seconds, batch=args.batch, work=Path(tmp)
        )
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    sys.exit(1 if main()["errors"] else 0)
